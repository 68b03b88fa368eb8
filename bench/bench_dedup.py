"""`pactl dedup` at scale: 1,000,000 x 512 unit vectors with planted near-duplicate groups.

Reports wall time and peak memory (VmHWM, bench.harness, of a fresh process that runs only the
dedup), and pair recall and precision against brute force on a sample of the items: for each
sampled item, every item whose exact cosine to it is at or above the threshold (recall: the
share of those dedup put in its group; precision: the share of its group members that are such
pairs; chains of connected components may join pairs below the threshold, strict groups
may not). Target: under 10 minutes and under 4 GiB on 2 cores.

    python -m bench dedup                       # 1,000,000 x 512
    python -m bench dedup --n 200000 --strict   # smaller, strict groups

The vectors: independent random unit vectors (two of them meet at cosine ~N(0, 1/512)), and
`--groups` of them each copied 1 to 3 times with noise, so that a copy meets its original at
cosine ~0.95 (0.90 to 0.98). Written once to --work (2 GiB at full size) and memory-mapped, as
`pactl dedup` reads a vectors folder. Table to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import harness
from bench.data import CHUNK, planted_copies


def run_dedup(args: argparse.Namespace) -> None:
    """The child: dedup of the memory-mapped vectors; groups saved, figures as JSON."""
    import faiss

    from pactl.index.dedup import VectorSearcher
    from pactl.index.grouping import DedupConfig, find_groups

    faiss.omp_set_num_threads(args.threads)
    vectors = np.load(args.work / "vectors.npy", mmap_mode="r")
    began = time.perf_counter()
    from pactl.console import Reporter

    searcher = VectorSearcher(vectors, nprobe=args.nprobe, reporter=Reporter())
    built = time.perf_counter() - began
    groups = find_groups(searcher, DedupConfig(args.threshold, args.strict), Reporter())
    seconds = time.perf_counter() - began
    np.save(args.work / "rows.npy", groups.rows)
    np.save(args.work / "group.npy", groups.group)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak, cpu = harness.own_peak_bytes(), usage.ru_utime + usage.ru_stime
    print(json.dumps({"seconds": seconds, "index_seconds": built, "peak": peak, "cpu": cpu,
                      "groups": groups.count, "members": len(groups.rows),
                      "pairs": groups.pairs}))  # fmt: skip


def check_sample(args: argparse.Namespace, n: int) -> tuple[float, float, float, int]:
    """Pair recall and precision of the saved groups on `--sample` items, by exact search: the
    recall of the pairs at or above the threshold, the share of grouped pairs that are, and
    the share of grouped pairs that are copies of one planted original."""
    vectors = np.load(args.work / "vectors.npy", mmap_mode="r")
    rows, group = np.load(args.work / "rows.npy"), np.load(args.work / "group.npy")
    of = np.zeros(n, dtype=np.int64)  # 0: in no group
    of[rows] = group
    family = np.load(args.work / "family.npy")
    rng = np.random.default_rng(1)
    planted_from = n - int(args.planted)
    # Half the sample among the planted copies (where the pairs are), half anywhere.
    sample = np.concatenate([rng.choice(np.arange(planted_from, n), args.sample // 2),
                             rng.choice(n, args.sample - args.sample // 2)])  # fmt: skip
    queries = np.ascontiguousarray(vectors[sample])
    mine = of[sample][:, None]
    true_pairs = found_pairs = both = planted = 0
    kin = family[sample][:, None]
    for start in range(0, n, CHUNK):  # (S, CHUNK) at a time: never the (S, n) matrix
        columns = np.arange(start, min(start + CHUNK, n))
        truth = queries @ np.asarray(vectors[columns]).T >= args.threshold
        found = (mine > 0) & (of[columns][None, :] == mine)
        itself = sample[:, None] == columns[None, :]
        truth &= ~itself
        found &= ~itself
        true_pairs += int(truth.sum())
        found_pairs += int(found.sum())
        both += int((truth & found).sum())
        planted += int((found & (kin >= 0) & (family[columns][None, :] == kin)).sum())
    recall = both / true_pairs if true_pairs else float("nan")
    precision = both / found_pairs if found_pairs else float("nan")
    kept = planted / found_pairs if found_pairs else float("nan")
    return recall, precision, kept, true_pairs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--groups", type=int, default=20_000)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sample", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/pactl-bench-dedup"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--planted", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_dedup(args)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    vectors = args.work / "vectors.npy"
    args.planted = planted_copies(vectors, args.n, args.dim, args.groups, args.seed)
    print(f"wrote {args.n:,} x {args.dim} vectors ({args.planted:,} planted copies) in "
          f"{time.perf_counter() - began:.0f} s", file=sys.stderr)  # fmt: skip
    child = [sys.executable, "-m", "bench.bench_dedup", "--child", *(argv or sys.argv[1:])]
    env = {**os.environ, "PYTHONPATH": str(harness.REPO)}  # bench/ importable from any cwd
    done = subprocess.run(child, stdout=subprocess.PIPE, text=True, check=True, env=env)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    recall, precision, kept, true_pairs = check_sample(args, args.n)
    mode = "strict" if args.strict else "connected components"
    print(f"| vectors | {args.n:,} x {args.dim} ({args.planted:,} planted copies of "
          f"{args.groups:,} originals) |")  # fmt: skip
    print(f"| grouping | {mode}, threshold {args.threshold}, nprobe {args.nprobe}, "
          f"{args.threads} threads |")  # fmt: skip
    print(f"| wall time | {result['seconds']:.1f} s (index {result['index_seconds']:.1f} s); "
          f"CPU time {result['cpu']:.1f} s |")  # fmt: skip
    print(f"| peak memory (max RSS) | {result['peak'] / 2**30:.2f} GiB |")
    print(f"| groups found | {result['groups']:,} holding {result['members']:,} vectors |")
    print(f"| pair recall vs brute force | {recall:.4f} ({true_pairs:,} true pairs of "
          f"{args.sample:,} sampled items) |")  # fmt: skip
    print(f"| pair precision vs brute force (cosine >= threshold) | {precision:.4f} |")
    print(f"| pair precision vs the planted copies | {kept:.4f} |")


if __name__ == "__main__":
    main()
