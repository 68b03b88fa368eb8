"""Retrieval by binary codes: the sign codes of vectors, their exact Hamming neighbours (ties
broken by id, so results repeat), and Recall@K, MAP@R and R-precision of the codes.

A vector's code is its signs: bit i is 1 where component i is above 0. For two N-bit codes held
as +-1 vectors s and t, hamming(s, t) = (N - s . t) / 2, so the distances come from one float32
matrix product, exact for any N a network makes (sums of +-1 up to 2**24 are exact integers).
Ranking by Hamming distance leaves many items level (N + 1 distances for thousands of items);
pactl.metrics.score_vectors ranks a level other-class item below the same-class one, which would
flatter codes, so here the order is (distance, gallery position) and the metrics are read from
that neighbour table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pactl import metrics

BLOCK = 256  # queries per block: (BLOCK, N) int64 keys at a time


def signs(vectors: np.ndarray) -> np.ndarray:
    """(N, bits) float32 +-1 codes of float vectors (+1 where a component is above 0)."""
    vectors = np.asarray(vectors)
    if vectors.ndim != 2 or vectors.shape[0] == 0 or vectors.shape[1] == 0:
        raise ValueError(f"vectors must be a non-empty (N, D) array, got shape {vectors.shape}")
    return np.where(vectors > 0, np.float32(1), np.float32(-1))


def pack(vectors: np.ndarray) -> np.ndarray:
    """(N, ceil(bits / 8)) uint8 codes of float vectors, bit 1 where a component is above 0
    (numpy's packbits order, as FAISS's binary indexes take them)."""
    return np.packbits(np.asarray(vectors) > 0, axis=1)


def neighbours(
    queries: np.ndarray,
    gallery: np.ndarray,
    k: int,
    exclude_self: bool = False,
    block: int = BLOCK,
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest gallery codes of each query code by Hamming distance, ties broken by the
    gallery position (the lower first). queries (Q, bits) and gallery (G, bits) are float
    vectors or +-1 codes (their signs are used). `exclude_self`: the queries are the gallery,
    and query i leaves gallery item i out. Returns (distances (Q, k) int64, indices (Q, k)
    int64), nearest first."""
    q, g = signs(queries), signs(gallery)
    if q.shape[1] != g.shape[1]:
        raise ValueError(f"queries have {q.shape[1]} bits, gallery has {g.shape[1]}")
    if exclude_self and len(q) != len(g):
        raise ValueError("exclude_self needs the queries to be the gallery")
    available = len(g) - (1 if exclude_self else 0)
    if not 1 <= k <= available:
        raise ValueError(f"k must be in [1, {available}] for a gallery of {len(g)}, got {k}")
    bits, size = q.shape[1], len(g)
    distances = np.empty((len(q), k), dtype=np.int64)
    indices = np.empty((len(q), k), dtype=np.int64)
    positions = np.arange(size, dtype=np.int64)
    for start in range(0, len(q), block):
        stop = min(start + block, len(q))
        dist = (bits - (q[start:stop] @ g.T).astype(np.int64)) // 2  # (B, G) exact integers
        key = dist * size + positions  # (B, G): distance first, then position
        if exclude_self:
            rows = np.arange(stop - start)
            key[rows, start + rows] = np.iinfo(np.int64).max
        top = np.argpartition(key, k - 1, axis=1)[:, :k]  # (B, k) in no order
        order = np.take_along_axis(key, top, axis=1).argsort(axis=1)
        indices[start:stop] = np.take_along_axis(top, order, axis=1)
        distances[start:stop] = np.take_along_axis(dist, indices[start:stop], axis=1)
    return distances, indices


def score_codes(
    vectors: np.ndarray,
    labels: np.ndarray,
    ks: Sequence[int],
    gallery_vectors: np.ndarray | None = None,
    gallery_labels: np.ndarray | None = None,
    with_nmi: bool = False,
    seed: int = 0,
) -> dict[str, float]:
    """pactl.metrics.score_vectors for the vectors' sign codes: Recall@k for each k, MAP@R and
    R-precision by Hamming distance, ties broken by id (and NMI of k-means on the codes).
    Without a gallery every item queries all the others, itself excluded by id; with one the
    rows of `vectors` query the gallery only."""
    labels = np.asarray(labels, dtype=np.int64)
    symmetric = gallery_vectors is None
    gallery = vectors if gallery_vectors is None else gallery_vectors
    g_labels = labels if gallery_labels is None else np.asarray(gallery_labels, dtype=np.int64)
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive integers, got {list(ks)}")
    classes, counts = np.unique(g_labels, return_counts=True)
    at = np.minimum(np.searchsorted(classes, labels), len(classes) - 1)
    r = np.where(classes[at] == labels, counts[at], 0) - (1 if symmetric else 0)
    available = len(g_labels) - (1 if symmetric else 0)
    k = min(max(max(ks), int(r.max())), available)
    _, found = neighbours(vectors, gallery, k, exclude_self=symmetric)
    valid = r > 0  # the others have nothing to find and count in no average
    if not valid.any():
        raise ValueError("no query has another item of its class to retrieve")
    table = g_labels[found[valid]]  # (Q, k) the neighbours' labels, nearest first
    recalls = metrics.recall_at_k(table, labels[valid], [min(x, k) for x in ks])
    out = {f"recall@{x}": recalls[min(x, k)] for x in ks}
    out["map@r"] = metrics.map_at_r(table, labels[valid], r[valid])
    out["r_precision"] = metrics.r_precision(table, labels[valid], r[valid])
    if with_nmi:
        codes = signs(vectors) / np.float32(np.sqrt(signs(vectors).shape[1]))
        out["nmi"] = metrics.nmi(codes, labels, seed)
    return out
