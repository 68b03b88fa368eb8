"""Two-level k-means (pactl.index.coarse) against FAISS's one-level k-means for an IVF's lists.

Both cluster the same seeded sample of bench.data.Mixture (TRAIN_POINTS_PER_LIST points a list,
as `pactl index` samples) into --lists centroids with the same iterations; reported: each one's
wall time, the mean cosine of the sample to its nearest centroid (float64), and the share of the
true top-10 of --queries fresh queries whose list is among the nprobe nearest to the query
(coverage: the recall exact codes would give) at a few nprobe.

Run from the repository root:
  python -m bench coarse                      # 8,192 lists over 128-d: one level takes minutes
  python -m bench coarse --quick              # 1,024 lists over 64-d
Results go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import time

import faiss
import numpy as np

from bench.data import Mixture
from pactl.index.build import TRAIN_POINTS_PER_LIST
from pactl.index.coarse import NITER, two_level_centroids

PROBES = (1, 4, 16, 64)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lists", type=int, default=8_192)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--base", type=int, default=1_000_000, help="items the queries search")
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="1,024 lists over 64-d, 200,000 items")
    args = p.parse_args(argv)
    if args.quick:
        args.lists, args.dim, args.base, args.queries = 1_024, 64, 200_000, 200
    return args


def coverage(centroids: np.ndarray, base: np.ndarray, queries: np.ndarray) -> list[float]:
    """For each nprobe in PROBES: the share of each query's exact top 10 (over `base`) whose
    nearest centroid is among the nprobe nearest the query."""
    flat = faiss.IndexFlatIP(base.shape[1])
    flat.add(base)
    _, truth = flat.search(queries, 10)
    lists = faiss.IndexFlatIP(centroids.shape[1])
    lists.add(centroids)
    _, home = lists.search(base, 1)
    _, probed = lists.search(queries, max(PROBES))
    shares = []
    for p in PROBES:
        hit = (home[truth, 0][:, :, None] == probed[:, None, :p]).any(axis=2)
        shares.append(float(hit.mean()))
    return shares


def fit(sample: np.ndarray, centroids: np.ndarray) -> float:
    """Mean over the sample of the cosine to its nearest centroid, in float64."""
    c = centroids.astype(np.float64)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    best = [np.max(block.astype(np.float64) @ c.T, axis=1) for block in np.array_split(sample, 64)]
    return float(np.mean(np.concatenate(best)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    mixture = Mixture(args.base, args.dim, rng)
    base, _ = mixture.draw(args.base, rng)
    queries, _ = mixture.draw(args.queries, rng)
    sample = base[rng.choice(len(base), TRAIN_POINTS_PER_LIST * args.lists, replace=False)]
    t0 = time.perf_counter()
    two = two_level_centroids(sample, args.lists, args.seed, spherical=True)
    two_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    one = faiss.Kmeans(args.dim, args.lists, niter=NITER, seed=args.seed, spherical=True)
    one.train(sample)
    one_s = time.perf_counter() - t0
    print(f"command: python -m bench coarse {' '.join(argv or [])}".rstrip())
    print(
        f"data: {len(sample):,} of {args.base:,} x {args.dim} (bench.data.Mixture, seed "
        f"{args.seed}) into {args.lists:,} lists, {NITER} iterations; {args.queries} fresh "
        f"queries; faiss threads {faiss.omp_get_max_threads()}\n"
    )
    head = " | ".join(f"coverage at nprobe {p}" for p in PROBES)
    print(f"| k-means | seconds | mean cosine to nearest centroid | {head} |")
    print("| --- | ---: | ---: |" + " ---: |" * len(PROBES))
    for name, centroids, seconds in (
        ("two levels", two, two_s),
        ("one level", one.centroids, one_s),
    ):
        cover = " | ".join(f"{c:.4f}" for c in coverage(centroids, base, queries))
        print(f"| {name} | {seconds:.1f} | {fit(sample, centroids):.4f} | {cover} |")
    print(f"\none level / two levels, seconds: {one_s / two_s:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
