"""On-disk merging of embed shards against the in-memory build, on clustered unit vectors.

Target: `pactl index VECTORS --on-disk yes` over K shards needs far less memory than joining the
shards in memory (`--on-disk no`), at the same recall, so sets larger than RAM can be indexed.

Data: K shard folders as `pactl embed --shard i/K` writes them (vectors.npy, items.csv,
meta.json), all seeded: n / 100 class centres uniform on the sphere, items
unit(centre + g / sqrt(d)) with g standard normal (cosine ~0.7 to their centre), queries fresh
items drawn the same way. The vectors are written a shard at a time, never held whole.

Each side runs pipeline.index_vectors (what `pactl index VECTORS` runs) with the same factory in
a fresh subprocess: --on-disk no joins the shards and builds in memory; --on-disk yes trains on a
sample across the shards, fills one shard's index at a time and merges their lists into
index.ivfdata. Memory is read from /proc/self/status: peak RSS is VmHWM at the end of the build;
it counts the pages of memory-mapped files (the shards' vectors, index.ivfdata) that the process
touched, which the kernel can drop and read again. Peak anonymous RSS (RssAnon, sampled every
5 ms) is the memory that must fit in RAM. "Start" is each process after its imports. Recall@10
is each bundle's (searched with pactl.index.search, tuned nprobe) against exact inner-product
search.

Run from the repository root:
  python -m bench ondisk                 # 8 shards x 125,000 x 128, IVF1024,Flat
  python -m bench ondisk --quick         # 4 shards x 10,000 x 32, IVF64,Flat: seconds
  python -m bench ondisk --shards 16 --per-shard 250000 --workdir /big/disk
Results (a markdown table) go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from bench import harness
from bench.data import CHUNK, around, unit

K = 10
FINGERPRINT = "bench-ondisk"
FIGURES = ("seconds", "peak_rss", "rss_grown", "peak_anon", "anon_grown")  # table columns


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=8, help="shard folders")
    p.add_argument("--per-shard", type=int, default=125_000, help="vectors per shard")
    p.add_argument("--dim", type=int, default=128, help="dimension")
    p.add_argument("--factory", default="IVF1024,Flat", help="FAISS factory, both sides")
    p.add_argument("--queries", type=int, default=1_000, help="fresh query vectors")
    p.add_argument("--quick", action="store_true", help="4 x 10,000 x 32, IVF64,Flat, 200 queries")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=None, help="where shards and bundles go")
    p.add_argument("--child", choices=["no", "yes"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.per_shard, args.dim = 4, 10_000, 32
        args.factory, args.queries = "IVF64,Flat", 200
    return args


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def status_bytes(field: str) -> int:
    """A /proc/self/status field in bytes (harness.status_bytes)."""
    return harness.status_bytes(field) or 0


class PeakSampler:
    """The highest RssAnon seen, read every `every` seconds on a thread until stop()."""

    def __init__(self, every: float = 0.005) -> None:
        self.every = every
        self.peak = status_bytes("RssAnon")
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.every):
            self.peak = max(self.peak, status_bytes("RssAnon"))

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return max(self.peak, status_bytes("RssAnon"))


# ---------------------------------------------------------------------------- data


def write_shards(args: argparse.Namespace, folder: Path) -> np.ndarray:
    """The shard folders under folder/shards/; returns the fresh queries."""
    rng = np.random.default_rng(args.seed)
    n = args.shards * args.per_shard
    centres = unit(rng.standard_normal((max(1, n // 100), args.dim), dtype=np.float32))
    for i in range(args.shards):
        shard = folder / "shards" / f"{i:05d}-of-{args.shards:05d}"
        shard.mkdir(parents=True)
        vectors = np.lib.format.open_memmap(
            shard / "vectors.npy", mode="w+", dtype=np.float32, shape=(args.per_shard, args.dim)
        )
        for start in range(0, args.per_shard, CHUNK):
            stop = min(start + CHUNK, args.per_shard)
            vectors[start:stop] = around(centres, stop - start, rng)
        vectors.flush()
        del vectors
        first = i * args.per_shard
        rows = (f"{j},item/{j:08d}.jpg,,0,0\n" for j in range(first, first + args.per_shard))
        (shard / "items.csv").write_text("id,path,label,size,mtime_ns\n" + "".join(rows))
        meta = {
            "format": "pactl.vectors",
            "version": 1,
            "dimension": args.dim,
            "count": args.per_shard,
            "metric": "ip",
            "checkpoint": str(folder / "none.pt"),
            "fingerprint": FINGERPRINT,
            "model_config": {},
        }
        (shard / "meta.json").write_text(json.dumps(meta))
    return around(centres, args.queries, rng)


def exact_top(folder: Path, queries: np.ndarray) -> np.ndarray:
    """Ids of the true top-K, shard by shard with faiss.knn, merged by score."""
    scores, ids, first = [], [], 0
    for shard in sorted((folder / "shards").iterdir()):
        vectors = np.load(shard / "vectors.npy", mmap_mode="r")
        s, rows = faiss.knn(queries, vectors, K, metric=faiss.METRIC_INNER_PRODUCT)
        scores.append(s)
        ids.append(rows + first)  # ids run on from shard to shard
        first += len(vectors)
    all_scores, all_ids = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
    best = np.argsort(-all_scores, axis=1, kind="stable")[:, :K]
    return np.take_along_axis(all_ids, best, axis=1)


def recall_at_10(found: np.ndarray, truth: np.ndarray) -> float:
    hits = [len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist(), strict=True)]
    return sum(hits) / truth.size


# ---------------------------------------------------------------------------- one side


def child(args: argparse.Namespace) -> None:
    """Build one bundle (--on-disk args.child) and report on stdout as one JSON line."""
    from pactl.config import IndexConfig
    from pactl.console import Reporter
    from pactl.index import IVFDATA_FILE, load_bundle
    from pactl.index.search import search
    from pactl.verbs.index import index_vectors

    out = args.workdir / f"bundle-{args.child}"
    config = IndexConfig(factory=args.factory, on_disk=args.child)
    start_anon, start_rss = status_bytes("RssAnon"), status_bytes("VmRSS")
    sampler = PeakSampler()
    started = time.perf_counter()
    index_vectors(args.workdir / "vectors", out, config, Reporter())
    seconds = time.perf_counter() - started
    peak_anon, peak_rss = sampler.stop(), status_bytes("VmHWM")
    bundle = load_bundle(out)
    meta = bundle.meta
    _, found = search(bundle, np.load(args.workdir / "queries.npy"), K)
    np.save(args.workdir / f"found-{args.child}.npy", found)
    ivfdata = out / IVFDATA_FILE
    result = {
        "seconds": seconds,
        "start_rss": start_rss,
        "peak_rss": peak_rss,
        "start_anon": start_anon,
        "peak_anon": peak_anon,
        "params": meta["search_params"],
        "on_disk": meta["on_disk"],
        "lists_bytes": ivfdata.stat().st_size if ivfdata.exists() else meta["index_bytes"],
    }
    print(json.dumps(result))


def run_side(args: argparse.Namespace, work: Path, choice: str) -> dict[str, Any]:
    log(f"--- building with --on-disk {choice} in a fresh process")
    command = [sys.executable, "-m", "bench.bench_ondisk", "--child", choice]
    command += ["--workdir", str(work), "--factory", args.factory]
    env = {**os.environ, "PYTHONPATH": str(harness.REPO)}  # bench/ importable from any cwd
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="bench-ondisk-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        queries = write_shards(args, work / "vectors")
        np.save(work / "queries.npy", queries)
        log(f"wrote {args.shards} shards in {time.perf_counter() - t0:.1f} s")
        truth = exact_top(work / "vectors", queries)
        sides = {choice: run_side(args, work, choice) for choice in ("no", "yes")}
        for choice, side in sides.items():
            side["recall"] = recall_at_10(np.load(work / f"found-{choice}.npy"), truth)
    report(args, sides)
    return 0


def report(args: argparse.Namespace, sides: dict[str, dict[str, Any]]) -> None:
    gib = 2**30
    total = args.shards * args.per_shard * args.dim * 4
    memory, disk = sides["no"], sides["yes"]
    for side in sides.values():
        side["rss_grown"] = side["peak_rss"] - side["start_rss"]
        side["anon_grown"] = side["peak_anon"] - side["start_anon"]
    print(f"command: python -m bench ondisk {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"data: {args.shards} shards x {args.per_shard:,} x {args.dim} float32 clustered unit "
        f"vectors = {total / gib:.3f} GiB ({total:,} bytes); {args.queries:,} fresh queries; "
        f"factory {args.factory}; {faiss.omp_get_max_threads()} threads"
    )
    print()
    print(
        "| build | seconds | peak RSS (VmHWM) | RSS above start | peak anonymous RSS "
        "| anonymous above start | search params | lists file | Recall@10 |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|")
    for name, side in (
        ("in memory (--on-disk no)", memory),
        ("on-disk merge (--on-disk yes)", disk),
    ):
        print(
            f"| {name} | {side['seconds']:.1f} | {side['peak_rss'] / gib:.3f} GiB "
            f"| {side['rss_grown'] / gib:.3f} GiB | {side['peak_anon'] / gib:.3f} GiB "
            f"| {side['anon_grown'] / gib:.3f} GiB | {side['params']} "
            f"| {side['lists_bytes'] / gib:.3f} GiB | {side['recall']:.4f} |"
        )
    ratios = [memory[key] / max(disk[key], 1) for key in FIGURES]
    print("| ratio in memory / on disk | " + " | ".join(f"{r:.2f}x" for r in ratios) + " | | | |")


if __name__ == "__main__":
    raise SystemExit(main())
