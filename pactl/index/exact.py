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
    scores, ids = [], []
    resources = faiss.StandardGpuResources() if gpus else None
    for vectors, part_ids in parts:
        for first, block in blocks(vectors):
            s, rows = knn(queries, block, min(k + 1, len(block)), resources)
            scores.append(s)
            ids.append(np.asarray(part_ids, dtype=np.int64)[first + rows])
    all_scores, all_ids = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
    best = np.argsort(-all_scores, axis=1, kind="stable")[:, : k + 1]  # (nq, <= k+1)
    merged = np.take_along_axis(all_scores, best, axis=1), np.take_along_axis(all_ids, best, axis=1)
    return exclude_by_id(*merged, own, k)[1]


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
