"""`pactl index` against autofaiss on the same 1,000,000 x 512 vectors.

Goal: pactl's default index at equal or better Recall@10 than autofaiss's, built faster, in less
memory; query latency reported. Whichever way it goes, the figures come from one run.

Data: bench_index's seeded two-level mixture of clustered unit vectors (see its docstring),
written once under --work in the clip-retrieval layout (embeddings/img_emb_00000.npy beside
metadata/metadata_00000.parquet), which both tools read: `pactl index` as a vectors folder,
autofaiss as its embeddings folder. Fresh queries (not in the index) are drawn the same way.

Each build is its own fresh process (bench.harness.run_fresh: wall time and its peak RSS):
  (a) `python -m pactl index DATA --out BUNDLE`, as users run it (default factory and tuning);
  (b) autofaiss.build_index in its own virtual environment (--autofaiss-python; it pins older
      numpy), with max_index_memory_usage set to pactl's memory budget
      (IndexConfig.memory_budget_gb, 8 GB) and current_memory_available to --available (16G;
      autofaiss refuses to build when it is not above the index budget), metric ip.
Then both are loaded here, pactl's bundle as `pactl query` searches it (pactl.index.search: its
tuned setting, rescoring where its codes are lossy) and autofaiss's index with faiss.read_index
set to the search parameters it chose (index_infos `index_param`), and measured the same way:
Recall@10 against exact search (IndexFlatIP), batched latency (fastest of --repeats passes after
a warm-up) and one query at a time (mean over --single queries).

Needs pactl[parquet] here (pyarrow writes the metadata) and GNU time at /usr/bin/time. Setup of
the autofaiss environment (never the project's):
  python3 -m venv /tmp/autofaiss-venv && /tmp/autofaiss-venv/bin/pip install autofaiss 'pyarrow<16'

Run from the repository root:
  python -m bench autofaiss                  # 1,000,000 x 512, 1,000 queries
  python -m bench autofaiss --n 200000       # smaller
Results go to stdout (a markdown table), progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import harness
from bench.bench_index import K, fastest, recall_at_10
from bench.data import CHUNK, Mixture
from pactl.config import IndexConfig
from pactl.console import Reporter

AUTOFAISS_BUILD = """
import sys
from autofaiss import build_index
data, index_path, infos_path, budget, available = sys.argv[1:6]
build_index(embeddings=data + "/embeddings", index_path=index_path, index_infos_path=infos_path,
            max_index_memory_usage=budget, current_memory_available=available, metric_type="ip",
            verbose=20)
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000, help="vectors in the index")
    p.add_argument("--dim", type=int, default=512, help="dimension")
    p.add_argument("--queries", type=int, default=1_000, help="fresh query vectors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="timed batched passes; fastest counts")
    p.add_argument("--single", type=int, default=100, help="queries timed one at a time")
    p.add_argument(
        "--available",
        default="16G",
        help="autofaiss's current_memory_available (its max_index_memory_usage is pactl's budget)",
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/pactl-bench-autofaiss"))
    p.add_argument("--autofaiss-python", type=Path, default=Path("/tmp/autofaiss-venv/bin/python"))
    return p.parse_args(argv)


def make_data(args: argparse.Namespace, log: Reporter) -> Path:
    """The vectors in the clip-retrieval layout and the queries, made once per (n, dim, seed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = args.work / f"data-{args.n}x{args.dim}-s{args.seed}"
    if (data / "queries.npy").is_file():
        log.log(f"data: reusing {data}")
        return data
    shutil.rmtree(data, ignore_errors=True)
    (data / "embeddings").mkdir(parents=True)
    (data / "metadata").mkdir()
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    mixture = Mixture(args.n, args.dim, rng)
    base, _ = mixture.draw(args.n, rng)
    queries, _ = mixture.draw(args.queries, rng)
    np.save(data / "embeddings" / "img_emb_00000.npy", base)
    paths = pa.array([f"item/{i}.jpg" for i in range(args.n)])
    pq.write_table(pa.table({"path": paths}), data / "metadata" / "metadata_00000.parquet")
    np.save(data / "queries.npy", queries)
    log.log(f"data: {args.n:,} x {args.dim} in {data} ({time.perf_counter() - t0:.1f} s)")
    return data


def timed(command: list[str], log: Reporter, python: str = sys.executable) -> dict[str, float]:
    """Run `python COMMAND` in a fresh process (harness.run_fresh): its wall seconds and its
    peak resident memory (GiB)."""
    log.log("running: " + " ".join([python, *command]))
    done = harness.run_fresh(command, python=python)
    sys.stderr.write(done.stderr)  # the build's own progress and log
    return {"build_s": done.seconds, "peak_gib": done.peak_bytes / 2**30}


def build_pactl(args: argparse.Namespace, data: Path, log: Reporter) -> dict[str, Any]:
    out = args.work / "pactl-bundle"
    shutil.rmtree(out, ignore_errors=True)
    command = ["-m", "pactl", "index", str(data), "--out", str(out), "--faiss-device", "cpu"]
    got: dict[str, Any] = timed(command, log)
    meta = json.loads((out / "meta.json").read_text())
    got.update(path=out / "index.faiss", params=str(meta.get("search_params") or ""))
    got["factory"] = meta.get("factory") or meta.get("index", {}).get("factory", "?")
    return got


def build_autofaiss(args: argparse.Namespace, data: Path, log: Reporter) -> dict[str, Any]:
    out = args.work / "autofaiss"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    index_path, infos_path = out / "knn.index", out / "infos.json"
    budget = f"{int(IndexConfig().memory_budget_gb)}G"
    command = ["-c", AUTOFAISS_BUILD, str(data), str(index_path), str(infos_path), budget]
    got: dict[str, Any] = timed([*command, args.available], log, str(args.autofaiss_python))
    if not infos_path.is_file():
        raise SystemExit(f"error: autofaiss wrote no {infos_path} (see its log above)")
    infos = json.loads(infos_path.read_text())
    got.update(path=index_path, params=str(infos.get("index_param", "")))
    got["factory"] = infos.get("index_key", "?")
    return got


def measure(
    built: dict[str, Any], queries: np.ndarray, truth: np.ndarray, args: argparse.Namespace
) -> None:
    """Load the index with faiss, set its tool's search parameters, and time it."""
    import faiss

    if built["path"].name == "index.faiss":  # pactl's bundle, searched as pactl searches it
        from pactl.index import load_bundle
        from pactl.index.search import search as bundle_search

        bundle = load_bundle(built["path"].parent, mmap=True)

        def run(q: np.ndarray) -> Any:
            return bundle_search(bundle, q, K)
    else:
        index = faiss.read_index(str(built["path"]))
        if built["params"]:
            faiss.ParameterSpace().set_index_parameters(index, built["params"])

        def run(q: np.ndarray) -> Any:
            return index.search(q, K)

    built["index_gib"] = built["path"].stat().st_size / 2**30
    seconds, (_, found) = fastest(args.repeats, lambda: run(queries))
    built["batched_ms"] = 1e3 * seconds / len(queries)
    count = min(args.single, len(queries))
    start = time.perf_counter()
    for i in range(count):
        run(queries[i : i + 1])
    built["single_ms"] = 1e3 * (time.perf_counter() - start) / count
    built["recall"] = recall_at_10(found, truth)


def exact_truth(data: Path, queries: np.ndarray, log: Reporter) -> np.ndarray:
    import faiss

    base = np.load(data / "embeddings" / "img_emb_00000.npy", mmap_mode="r")
    flat = faiss.IndexFlatIP(base.shape[1])
    for start in range(0, len(base), CHUNK):
        flat.add(np.ascontiguousarray(base[start : start + CHUNK]))
    log.log(f"exact search: {len(queries):,} queries over {flat.ntotal:,} vectors")
    return flat.search(queries, K)[1]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = Reporter()
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.autofaiss_python.is_file():
        print(f"error: no {args.autofaiss_python}; see this script's docstring", file=sys.stderr)
        return 1
    data = make_data(args, log)
    t0 = time.perf_counter()
    pactl = build_pactl(args, data, log)
    autofaiss = build_autofaiss(args, data, log)
    queries = np.load(data / "queries.npy")
    truth = exact_truth(data, queries, log)
    for built in (pactl, autofaiss):
        measure(built, queries, truth, args)
    report(args, pactl, autofaiss, time.perf_counter() - t0)
    return 0


def report(
    args: argparse.Namespace, pactl: dict[str, Any], autofaiss: dict[str, Any], wall: float
) -> None:
    import faiss

    rows = [
        ("index", "factory", "`{}`", None),
        ("search parameters", "params", "`{}`", None),
        ("Recall@10", "recall", "{:.4f}", True),
        ("build wall time (s)", "build_s", "{:.1f}", False),
        ("peak RSS of the build (GiB)", "peak_gib", "{:.2f}", False),
        ("index file (GiB)", "index_gib", "{:.3f}", False),
        ("query, batched (ms/query)", "batched_ms", "{:.3f}", False),
        ("query, one at a time (ms)", "single_ms", "{:.3f}", False),
    ]
    print(f"command: python -m bench autofaiss {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"data: {args.n:,} x {args.dim} clustered unit vectors (seed {args.seed}), "
        f"{args.queries:,} fresh queries; faiss threads here: {faiss.omp_get_max_threads()}; "
        f"{wall:.0f} s from the first build to the last search\n"
    )
    print("| | pactl index | autofaiss | pactl / autofaiss |")
    print("| --- | --- | --- | --- |")
    for name, key, fmt, _ in rows:
        a, b = pactl[key], autofaiss[key]
        ratio = f"{a / b:.2f}" if isinstance(a, float) and b else ""
        print(f"| {name} | {fmt.format(a)} | {fmt.format(b)} | {ratio} |")


if __name__ == "__main__":
    raise SystemExit(main())
