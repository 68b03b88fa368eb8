"""The coarse quantiser of a large IVF, trained in two levels.

One k-means of nlist centroids over a sample of 64 nlist points costs about 2 x 64 nlist^2 d
flops an iteration: at 16,384 lists of 512 floats (the default at 10,000,000 vectors) about
1.8e13, so ten iterations would take longer on two cores than the rest of the build. Two levels
cost a fraction of that: sqrt(nlist) centroids over the sample, then each first-level cluster
cut into its share of the nlist centroids by a k-means over its own points only (FAISS ships the
same scheme as faiss.contrib.clustering.two_level_clustering). Compared with one level by
tests/test_coarse.py and `python -m bench coarse`; at 10,000,000 x 512 of bench.data's mixture
the lists needed a sixth of all probed for 95% coverage, which may be this scheme's doing
(docs/benchmarks/search.md, "The default at 10,000,000 x 512").
"""

from __future__ import annotations

import math
from typing import Any

import faiss
import numpy as np

from pactl.console import Reporter

TWO_LEVEL_FROM = 8_192  # lists from which the coarse quantiser is trained in two levels
NITER = 10  # k-means iterations at each level, as FAISS's IVF training itself uses


def shares(sizes: np.ndarray, total: int) -> np.ndarray:
    """`total` centroids split among groups of `sizes` points in proportion to their sizes
    (largest remainders), no group given more centroids than it has points; the groups' shares
    sum to `total`, which must not exceed the points."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if total > int(sizes.sum()):
        raise ValueError(f"{total} centroids from {int(sizes.sum())} points")
    exact = sizes * (total / max(int(sizes.sum()), 1))
    share = np.minimum(np.floor(exact).astype(np.int64), sizes)
    while (left := total - int(share.sum())) > 0:
        room = share < sizes
        order = np.argsort(-(exact - share) * room, kind="stable")
        order = order[room[order]][:left]
        share[order] += 1
    return share


def two_level_centroids(sample: np.ndarray, nlist: int, seed: int, spherical: bool) -> np.ndarray:
    """`nlist` float32 centroids of `sample` (rows x d, float32): sqrt(nlist) first-level
    k-means centroids, then each first-level cluster's points clustered into its share."""
    d = sample.shape[1]
    first = max(1, round(math.sqrt(nlist)))
    coarse = faiss.Kmeans(d, first, niter=NITER, seed=seed, spherical=spherical)
    coarse.cp.max_points_per_centroid = max(256, len(sample) // first)  # the whole sample
    coarse.train(sample)
    _, group = coarse.index.search(sample, 1)
    group = group.ravel()
    share = shares(np.bincount(group, minlength=first), nlist)
    order = np.argsort(group, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=first))])
    out = []
    for g in np.flatnonzero(share):
        points = np.ascontiguousarray(sample[order[bounds[g] : bounds[g + 1]]])
        k = int(share[g])
        if k == len(points):  # as many centroids as points: the points themselves
            out.append(points)
            continue
        fine = faiss.Kmeans(d, k, niter=NITER, seed=seed + int(g), spherical=spherical)
        fine.cp.max_points_per_centroid = max(256, len(points) // k + 1)
        fine.cp.min_points_per_centroid = 1  # a small group is still cut (FAISS would warn)
        fine.train(points)
        out.append(np.asarray(fine.centroids))
    return np.ascontiguousarray(np.vstack(out), dtype=np.float32)


def train_coarse(index: Any, sample: np.ndarray, seed: int, reporter: Reporter) -> bool:
    """Give an IVF of at least TWO_LEVEL_FROM lists (not under a pre-transform) its coarse
    centroids from two-level k-means on `sample`, so that its own train() goes on to train the
    codes alone (FAISS skips a quantiser that already holds nlist centroids). True when done;
    False leaves the index to train as FAISS does."""
    ivf = faiss.downcast_index(index)
    if not isinstance(ivf, faiss.IndexIVF) or ivf.nlist < TWO_LEVEL_FROM:
        return False
    if ivf.quantizer.ntotal or len(sample) < ivf.nlist:
        return False
    reporter.log(f"clustering {len(sample):,} points into {ivf.nlist:,} lists in two levels")
    spherical = ivf.metric_type == faiss.METRIC_INNER_PRODUCT
    centroids = two_level_centroids(sample, ivf.nlist, seed, spherical)
    ivf.quantizer.train(centroids)
    ivf.quantizer.add(centroids)
    return True
