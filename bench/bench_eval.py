"""Retrieval evaluation speed: pactl.metrics.score_vectors against the official Proxy-Anchor recipe.

The official repository (github.com/tjddus9597/Proxy-Anchor-CVPR2020, utils.py,
evaluate_cos_SOP) evaluates Stanford Online Products like this: in chunks of 10,000 queries,
cos_sim = F.linear(chunk, X), keep T[cos_sim.topk(1 + K)[1][:, 1:]] (K = 1000, column 0 taken
to be the query itself), then Recall@k by a Python loop over queries. The baseline below is an
independent re-implementation of that recipe in torch on the same CPU and thread count.

Both sides run on identical seeded data (random unit vectors, every class with at least two
items, as in SOP), each in a fresh subprocess so that its peak resident memory (ru_maxrss:
interpreter, libraries, data and work) is its own. Recall values must match exactly. Wall
time is the target; CPU time (all threads) is printed too, as it moves less when other work
shares the machine. The last lines are a markdown table for docs/benchmarks.md.

    python -m bench eval            # SOP size: 60,502 x 512, 11,316 classes
    python -m bench eval --quick    # small smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import harness

OFFICIAL_CHUNK = 10_000  # queries per similarity block in the official code


def make_data(n: int, classes: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random unit vectors and labels where every class has at least two items."""
    if n < 2 * classes:
        raise SystemExit(f"--n must be at least 2 x --classes ({2 * classes}), got {n}")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    labels = np.concatenate(
        [np.repeat(np.arange(classes), 2), rng.integers(0, classes, n - 2 * classes)]
    )
    rng.shuffle(labels)
    return x, labels.astype(np.int64)


@dataclass(frozen=True)
class Run:
    """What one side reported from its own process."""

    seconds: float  # wall time of the whole evaluation
    knn_seconds: float  # wall time up to the neighbour table (the official recipe only)
    cpu_seconds: float  # CPU time of the evaluation, all threads together
    peak_rss_bytes: int  # the process's peak resident memory
    recall: dict[int, float]
    extra: dict[str, float]  # other metrics the side reports


def run_baseline(x: np.ndarray, labels: np.ndarray, ks: list[int]) -> dict[str, Any]:
    """The official recipe: cosine block + topk in torch, then a per-query recall loop."""
    import torch
    import torch.nn.functional as F

    start, cpu_start = time.perf_counter(), time.process_time()
    X = torch.from_numpy(x)  # already unit length; the official l2_norm step is skipped
    T = torch.from_numpy(labels)
    K = max(ks)
    chunks = []
    for begin in range(0, len(X), OFFICIAL_CHUNK):
        cos_sim = F.linear(X[begin : begin + OFFICIAL_CHUNK], X)  # (chunk, N)
        chunks.append(T[cos_sim.topk(1 + K)[1][:, 1:]].float())  # (chunk, K) labels, self dropped
        del cos_sim
    Y = torch.cat(chunks, dim=0)
    knn_done = time.perf_counter()
    recall = {}
    for k in ks:
        hits = 0
        for t, y in zip(T, Y, strict=True):
            if t in y.long()[:k]:
                hits += 1
        recall[k] = hits / len(T)
    return {
        "seconds": time.perf_counter() - start,
        "knn_seconds": knn_done - start,
        "cpu_seconds": time.process_time() - cpu_start,
        "recall": recall,
        "extra": {},
    }


def run_pactl(x: np.ndarray, labels: np.ndarray, ks: list[int]) -> dict[str, Any]:
    """pactl.metrics.score_vectors on the same data."""
    from pactl.metrics import score_vectors

    start, cpu_start = time.perf_counter(), time.process_time()
    result = score_vectors(x, labels, ks)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    recall = {k: result.pop(f"recall@{k}") for k in ks}
    return {
        "seconds": seconds,
        "knn_seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "recall": recall,
        "extra": result,
    }


def worker(side: str, data: Path, ks: list[int], threads: int) -> None:
    """Child process: load the data, run one side, print one JSON line."""
    if side == "baseline":
        import torch

        torch.set_num_threads(threads)
    else:  # no torch here: pactl.metrics does not need it, so its memory is not counted
        import faiss

        faiss.omp_set_num_threads(threads)
    x = np.load(data / "x.npy")
    labels = np.load(data / "labels.npy")
    result = run_baseline(x, labels, ks) if side == "baseline" else run_pactl(x, labels, ks)
    # Linux reports KiB; the peak includes the interpreter, the libraries and the data.
    result["peak_rss_bytes"] = harness.own_peak_bytes()  # VmHWM of this fresh process
    print(json.dumps(result))


def spawn(side: str, data: Path, ks: list[int], threads: int) -> Run:
    """Run one side in a fresh interpreter with the same thread settings as the other."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.REPO), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "bench.bench_eval", "--worker", side, "--data", str(data)]
    command += ["--ks", ",".join(map(str, ks)), "--threads", str(threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{side} worker failed:\n{done.stderr}")
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    raw["recall"] = {int(k): v for k, v in raw["recall"].items()}
    return Run(**raw)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=60_502, help="items (SOP test split: 60,502)")
    parser.add_argument("--classes", type=int, default=11_316, help="classes (SOP: 11,316)")
    parser.add_argument("--dim", type=int, default=512, help="embedding size")
    parser.add_argument("--ks", default="1,10,100,1000", help="Recall@k cut-offs")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=1, help="runs per side; the fastest counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="6,000 x 128, 1,100 classes")
    parser.add_argument("--worker", choices=["baseline", "pactl"], help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    if args.worker:
        worker(args.worker, args.data, ks, args.threads)
        return
    if args.quick:
        args.n, args.classes, args.dim = 6_000, 1_100, 128
    runs: dict[str, list[Run]] = {"baseline": [], "pactl": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        x, labels = make_data(args.n, args.classes, args.dim, args.seed)
        np.save(data / "x.npy", x)
        np.save(data / "labels.npy", labels)
        del x
        for _ in range(args.repeats):
            for side, side_runs in runs.items():  # alternate: machine noise hits both alike
                print(f"running {side} ...", file=sys.stderr, flush=True)
                side_runs.append(spawn(side, data, ks, args.threads))
    if not report(args, ks, runs):
        raise SystemExit("recall values differ")


def report(args: argparse.Namespace, ks: list[int], runs: dict[str, list[Run]]) -> bool:
    """Print the comparison and a markdown table; True when the recall values are identical."""
    base = min(runs["baseline"], key=lambda run: run.seconds)
    ours = min(runs["pactl"], key=lambda run: run.seconds)
    for k in ks:
        print(f"recall@{k}: official {base.recall[k]!r}  pactl {ours.recall[k]!r}")
    identical = all(base.recall[k] == ours.recall[k] for k in ks)
    print(f"identical recall: {identical}")
    print()
    print(
        f"Evaluation of {args.n:,} x {args.dim} random unit vectors, {args.classes:,} classes, "
        f"Recall@{'/'.join(map(str, ks))}; {args.threads} threads, best of {args.repeats}."
    )
    print()
    print("| evaluator | seconds | CPU seconds | peak memory (RSS) |")
    print("| --- | ---: | ---: | ---: |")
    for name, run in (
        ("official recipe: torch cosine + topk, recall loop", base),
        ("pactl.metrics.score_vectors", ours),
    ):
        print(
            f"| {name} | {run.seconds:.1f} | {run.cpu_seconds:.1f} "
            f"| {run.peak_rss_bytes / 2**30:.2f} GiB |"
        )
    print()
    print(
        f"speed-up: {base.seconds / ours.seconds:.2f}x "
        f"({base.knn_seconds / ours.seconds:.2f}x against the official cosine + topk alone)"
    )
    extra = ", ".join(f"{name} {value:.6f}" for name, value in ours.extra.items())
    print(f"pactl also reports {extra}")
    print(
        f"targets: >= 3x faster {'met' if base.seconds >= 3 * ours.seconds else 'NOT met'}, "
        f"peak memory < 2 GiB {'met' if ours.peak_rss_bytes < 2**31 else 'NOT met'}"
    )
    return identical


if __name__ == "__main__":
    main()
