"""Exact neighbours by brute force (FAISS flat inner product), one function for every caller."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import faiss
import numpy as np

from pactl.index.mapped import Part, blocks
from pactl.index.search import exclude_by_id

EXACT_ITEMS = 200_000  # up to this many vectors cosine_index searches exactly


def exact_neighbours(
    parts: Sequence[Part], queries: np.ndarray, own: np.ndarray, k: int, gpus: int = 0
) -> np.ndarray:
    """Ids of the k largest inner products of each query over all parts, its own id `own[i]`
    excluded. Each block of each part (pactl.index.mapped.blocks) is searched on its own and the
    per-block top k+1 merged by score, so only one block is read at a time and the result equals
    a search of the parts joined."""
    resources = faiss.StandardGpuResources() if gpus else None
    found = [part_neighbours(part, queries, k + 1, resources) for part in parts]
    return merge_neighbours(found, own, k)


def part_neighbours(
    part: Part, queries: np.ndarray, k: int, resources: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of the k largest inner products of each query within one part, merged over
    its blocks by score: what a shard task returns, for merge_neighbours to join."""
    vectors, part_ids = part
    scores, ids = [], []
    for first, block in blocks(vectors):
        s, rows = knn(queries, block, min(k, len(block)), resources)
        scores.append(s)
        ids.append(np.asarray(part_ids, dtype=np.int64)[first + rows])
    return _top(scores, ids, k)


def merge_neighbours(
    found: Sequence[tuple[np.ndarray, np.ndarray]], own: np.ndarray, k: int
) -> np.ndarray:
    """The ids of exact_neighbours from each part's top k+1 (part_neighbours, in part order):
    the top k+1 of the union is among the parts' own, and a stable sort by score keeps the
    order a search of the parts joined gives to ties."""
    scores, ids = _top([s for s, _ in found], [i for _, i in found], k + 1)
    return exclude_by_id(scores, ids, own, k)[1]


def _top(scores: list[np.ndarray], ids: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    all_scores, all_ids = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
    best = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]  # (nq, <= k)
    return np.take_along_axis(all_scores, best, axis=1), np.take_along_axis(all_ids, best, axis=1)


def knn(queries: np.ndarray, vectors: np.ndarray, k: int, resources: Any) -> Any:
    """Brute-force inner-product top k: on the first GPU when `resources` is given."""
    if resources is None:
        return faiss.knn(queries, vectors, k, metric=faiss.METRIC_INNER_PRODUCT)
    base = np.ascontiguousarray(vectors, dtype=np.float32)  # a memory map is read into memory
    return faiss.knn_gpu(resources, queries, base, k, metric=faiss.METRIC_INNER_PRODUCT)


def cosine_index(vectors: np.ndarray) -> Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]:
    """queries, k -> (cosines, rows) of the k nearest of `vectors` (unit rows, in memory) to each
    query: exact up to EXACT_ITEMS, else an IVF searched 16 lists deep."""
    import faiss

    x = np.ascontiguousarray(vectors, dtype=np.float32)
    n, dim = x.shape
    if n <= EXACT_ITEMS:
        index: Any = faiss.IndexFlatIP(dim)
    else:
        nlist = int(4 * np.sqrt(n))
        index = faiss.index_factory(dim, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
        index.train(x[np.random.default_rng(0).choice(n, min(n, 64 * nlist), replace=False)])
        faiss.extract_index_ivf(index).nprobe = 16
    index.add(x)

    def search(queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        sims, found = index.search(np.ascontiguousarray(queries, dtype=np.float32), min(k, n))
        return sims, found

    return search
