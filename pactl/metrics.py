"""Retrieval metrics: pure numpy functions of neighbour tables, an exact kNN, and score_vectors().

recall_at_k, map_at_r and r_precision read neighbour tables (from knn or anywhere else);
score_vectors() gives the same numbers for a whole labelled set without building the table (see
its docstring). Vectors arrive as float32 numpy arrays, L2-normalised, so inner product is
cosine similarity.

A neighbour table is (Q, K) int64: row i holds the labels of query i's K nearest gallery items,
best first. `r` is (Q,): how many gallery items share query i's label, the query itself not
counted. Queries with r == 0 have nothing to retrieve and are left out of every average.

Definitions (Musgrave et al., "A Metric Learning Reality Check", ECCV 2020):
- Recall@k: 1 if any of the first k neighbours shares the query's label (the metric-learning
  usage, not the information-retrieval one), averaged over queries.
- R-precision: the fraction of the first R neighbours that share the label.
- MAP@R: (1/R) * sum over i <= R of P(i) * rel(i), where P(i) is the precision of the first i
  neighbours and rel(i) is 1 when neighbour i shares the label.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import faiss
import numpy as np
from threadpoolctl import threadpool_limits

Progress = Callable[[int], None]


def knn(
    queries: np.ndarray,
    gallery: np.ndarray,
    k: int,
    query_ids: np.ndarray | None = None,
    gallery_ids: np.ndarray | None = None,
    batch_size: int = 4096,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of `gallery` by inner product for each row of `queries`.

    The search is faiss's exhaustive inner-product kNN (what IndexFlatIP.search runs, without
    copying the gallery into an index), one batch of queries at a time, so no (Q, N) matrix is
    ever held. With ids, a gallery item whose id equals the query's id is left out: k + 1 are
    searched and the match is dropped by id, so a duplicate vector of the query stays.
    Returns (scores (Q, k) float32, indices (Q, k) int64 into gallery), best first.
    """
    queries = _as_vectors(queries, "queries")
    gallery = _as_vectors(gallery, "gallery")
    if queries.shape[1] != gallery.shape[1]:
        raise ValueError(f"queries have {queries.shape[1]} dims, gallery has {gallery.shape[1]}")
    if (query_ids is None) != (gallery_ids is None):
        raise ValueError("give both query_ids and gallery_ids, or neither")
    exclude = query_ids is not None and gallery_ids is not None
    available = len(gallery) - (1 if exclude else 0)
    if not 1 <= k <= available:
        raise ValueError(f"k must be in [1, {available}] for a gallery of {len(gallery)}, got {k}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if query_ids is not None and gallery_ids is not None:
        query_ids = _as_ids(query_ids, len(queries), "query_ids")
        gallery_ids = _as_ids(gallery_ids, len(gallery), "gallery_ids")
        if np.unique(gallery_ids).size != gallery_ids.size:
            raise ValueError("gallery_ids must be unique")
    scores = np.empty((len(queries), k), dtype=np.float32)
    indices = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), batch_size):
        stop = min(start + batch_size, len(queries))
        ids = None if query_ids is None else query_ids[start:stop]
        scores[start:stop], indices[start:stop] = _search(
            queries[start:stop], gallery, k, ids, gallery_ids
        )
    return scores, indices


def _search(
    queries: np.ndarray,
    gallery: np.ndarray,
    k: int,
    query_ids: np.ndarray | None,
    gallery_ids: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One batch of knn(); arguments already checked."""
    if query_ids is None or gallery_ids is None:
        return faiss.knn(queries, gallery, k, metric=faiss.METRIC_INNER_PRODUCT)
    scores, indices = faiss.knn(queries, gallery, k + 1, metric=faiss.METRIC_INNER_PRODUCT)
    is_self = gallery_ids[indices] == query_ids[:, None]  # (B, k + 1)
    # Drop the query's own entry where it was found, else the (k+1)-th, which is surplus.
    drop = np.where(is_self.any(axis=1), is_self.argmax(axis=1), k)
    keep = np.ones(is_self.shape, dtype=bool)
    keep[np.arange(len(keep)), drop] = False
    rows = len(queries)
    return scores[keep].reshape(rows, k), indices[keep].reshape(rows, k)


def recall_at_k(
    neighbour_labels: np.ndarray, query_labels: np.ndarray, ks: Sequence[int]
) -> dict[int, float]:
    """Recall@k for each k in ks: the fraction of queries with a same-label item in their top k."""
    first = _first_hit(_hits(neighbour_labels, query_labels))
    if len(first) == 0:
        raise ValueError("recall needs at least one query")
    out: dict[int, float] = {}
    for k in ks:
        if not 1 <= k <= neighbour_labels.shape[1]:
            raise ValueError(f"k={k} needs a table with at least {k} neighbours per query")
        out[int(k)] = float(np.mean(first < k))
    return out


def map_at_r(neighbour_labels: np.ndarray, query_labels: np.ndarray, r: np.ndarray) -> float:
    """MAP@R over the queries with r > 0."""
    ap, _ = _ap_and_rp(*_valid_hits(neighbour_labels, query_labels, r))
    return float(ap.mean())


def r_precision(neighbour_labels: np.ndarray, query_labels: np.ndarray, r: np.ndarray) -> float:
    """R-precision over the queries with r > 0."""
    _, rp = _ap_and_rp(*_valid_hits(neighbour_labels, query_labels, r))
    return float(rp.mean())


def _hits(neighbour_labels: np.ndarray, query_labels: np.ndarray) -> np.ndarray:
    """(Q, K) bool: neighbour j of query i shares its label."""
    if neighbour_labels.ndim != 2 or query_labels.shape != (len(neighbour_labels),):
        raise ValueError(
            f"neighbour_labels must be (Q, K) and query_labels (Q,), got "
            f"{neighbour_labels.shape} and {query_labels.shape}"
        )
    return np.asarray(neighbour_labels == query_labels[:, None])


def _valid_hits(
    neighbour_labels: np.ndarray, query_labels: np.ndarray, r: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The hit table and r of the queries that have something to retrieve."""
    hits = _hits(neighbour_labels, query_labels)
    r = np.asarray(r, dtype=np.int64)
    if r.shape != (len(hits),):
        raise ValueError(f"r must be ({len(hits)},), got {r.shape}")
    valid = r > 0
    if not valid.any():
        raise ValueError("no query has another item of its class to retrieve")
    if r.max() > hits.shape[1]:
        raise ValueError(f"R={r.max()} needs a table with at least that many neighbours")
    return hits[valid], r[valid]


def _first_hit(hits: np.ndarray) -> np.ndarray:
    """(Q,) 0-based position of the first hit; K where a row has none."""
    return np.where(hits.any(axis=1), hits.argmax(axis=1), hits.shape[1])


def _ap_and_rp(hits: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-query AP@R and R-precision from a hit table and r >= 1 per row."""
    width = int(r.max())
    ranks = np.arange(1, width + 1)
    rel = hits[:, :width] & (ranks[None, :] <= r[:, None])  # (Q, maxR) hits inside the first R
    precision = np.cumsum(rel, axis=1) / ranks  # (Q, maxR) P(i) of the first i neighbours
    ap = (precision * rel).sum(axis=1) / r
    rp = rel.sum(axis=1) / r
    return ap, rp


def nmi(vectors: np.ndarray, labels: np.ndarray, seed: int = 0) -> float:
    """Normalised mutual information between the labels and a k-means clustering into C groups.

    C is the number of distinct labels. k-means++ seeding, then 20 Lloyd iterations (faiss):
    plain random seeding often puts two centres in one class and never recovers, which would
    make NMI measure the seeding. The seeding is C passes over the data (minutes at SOP size).
    """
    # Imported here: only NMI needs scikit-learn, and it is slow to import.
    from sklearn.metrics import normalized_mutual_info_score

    x = _as_vectors(vectors, "vectors")
    labels = _as_ids(labels, len(x), "labels")
    classes = np.unique(labels).size
    if not 2 <= classes <= len(x):
        raise ValueError(f"NMI needs 2 to {len(x)} classes, got {classes}")
    kmeans = faiss.Kmeans(
        x.shape[1],
        classes,
        niter=20,
        seed=seed,
        min_points_per_centroid=1,  # few points per class is normal here, not a mistake
        max_points_per_centroid=len(x),  # cluster every point, no subsampling
    )
    kmeans.train(x, init_centroids=_kmeans_plusplus(x, classes, np.random.default_rng(seed)))
    _, assignment = kmeans.index.search(x, 1)
    return float(normalized_mutual_info_score(labels, assignment[:, 0]))


def _kmeans_plusplus(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """(k, D) float32 centres: each next one drawn with probability ~ squared distance to the
    nearest centre so far (Arthur and Vassilvitskii, 2007)."""
    sq_norms = np.einsum("ij,ij->i", x, x)

    def sq_dist(i: int) -> np.ndarray:
        return np.maximum(sq_norms - 2.0 * (x @ x[i]) + sq_norms[i], 0.0)

    chosen = [int(rng.integers(len(x)))]
    nearest = sq_dist(chosen[0])  # (N,) squared distance to the nearest centre so far
    for _ in range(k - 1):
        cumulative = np.cumsum(nearest, dtype=np.float64)
        draw = np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")
        chosen.append(min(int(draw), len(x) - 1))  # the clamp only matters for rounding
        np.minimum(nearest, sq_dist(chosen[-1]), out=nearest)
    return np.ascontiguousarray(x[chosen])


def score_vectors(
    vectors: np.ndarray,
    labels: np.ndarray,
    ks: Sequence[int],
    gallery_vectors: np.ndarray | None = None,
    gallery_labels: np.ndarray | None = None,
    with_nmi: bool = False,
    seed: int = 0,
    progress: Progress | None = None,
    block_size: int = 1024,
    threads: int | None = None,
) -> dict[str, float]:
    """Recall@k for each k, MAP@R and R-precision (and NMI when asked) of a labelled set.

    Without a gallery every item queries all the others (itself excluded by id); with one
    (In-Shop style) the rows of `vectors` query the gallery only. Returns 'recall@<k>' per k,
    'map@r', 'r_precision' and, with with_nmi, 'nmi' (k-means on `vectors`).

    The numbers are those of a kNN table with k = max(max(ks), max R) fed to recall_at_k,
    map_at_r and r_precision, but no such table is built. A query's first same-class item
    sits at rank 1 + (other-class items scoring above its best same-class item), so Recall@k
    needs only that count; MAP@R and R-precision need only the R best other-class scores. One
    pass over (block_size x block_size) similarity blocks gathers both, and without a gallery
    each block serves its rows and its columns, so half the similarities are computed. As in
    any kNN table, scores level to within float32 rounding may rank either way.
    `progress(n)` is called as each block of n queries is done; `threads` defaults to faiss's
    OpenMP thread count. Memory: the data, a few blocks per thread, and (Q, max R) scores.
    """
    q, q_labels, g, g_labels, symmetric = _split(vectors, labels, gallery_vectors, gallery_labels)
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive integers, got {list(ks)}")
    if block_size < 1 or (threads is not None and threads < 1):
        raise ValueError(f"block_size and threads must be positive, got {block_size}, {threads}")
    r = _relevant_counts(q_labels, g_labels, symmetric)
    valid = r > 0  # the others have nothing to find and count in no denominator
    if not valid.any():
        raise ValueError("no query has another item of its class to retrieve")
    positives, pairs = _positives(q, q_labels, g, g_labels, symmetric, int(r.max()))
    best = np.where(valid, positives[:, 0], np.inf).astype(np.float32)
    sweep = _Sweep(q, g, best, pairs, symmetric, int(r.max()), block_size)
    above, negatives = sweep.run(threads or faiss.omp_get_max_threads(), progress)
    out = {f"recall@{k}": float(np.mean(above[valid] < k)) for k in ks}
    ap, rp = _ap_and_rp_from_scores(positives[valid], negatives[valid], r[valid])
    out["map@r"] = float(ap.mean())
    out["r_precision"] = float(rp.mean())
    if with_nmi:
        out["nmi"] = nmi(q, q_labels, seed)
    return out


def _positives(
    q: np.ndarray,
    q_labels: np.ndarray,
    g: np.ndarray,
    g_labels: np.ndarray,
    symmetric: bool,
    width: int,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Same-class scores and pairs.

    Returns ((Q, width) float32 scores of each query's same-class gallery items, best first,
    -inf padded; (query, gallery) index pairs of every same-class pair, self pairs included).
    """
    scores = np.full((len(q), width), -np.inf, dtype=np.float32)
    pair_rows: list[np.ndarray] = []
    pair_cols: list[np.ndarray] = []
    for members, gallery_members in _class_members(q_labels, g_labels):
        sim = q[members] @ g[gallery_members].T  # (m, n) same-class similarities
        if symmetric:
            np.fill_diagonal(sim, -np.inf)  # members == gallery_members: the query itself
        sim = -np.sort(-sim, axis=1)
        found = sim.shape[1] - (1 if symmetric else 0)
        scores[members, :found] = sim[:, :found]
        pair_rows.append(np.repeat(members, len(gallery_members)))
        pair_cols.append(np.tile(gallery_members, len(members)))
    return scores, (np.concatenate(pair_rows), np.concatenate(pair_cols))


def _class_members(
    q_labels: np.ndarray, g_labels: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(query indices, gallery indices) of each class present on both sides."""
    q_order = np.argsort(q_labels, kind="stable")
    g_order = np.argsort(g_labels, kind="stable")
    q_classes, q_starts, q_counts = np.unique(
        q_labels[q_order], return_index=True, return_counts=True
    )
    g_classes, g_starts, g_counts = np.unique(
        g_labels[g_order], return_index=True, return_counts=True
    )
    _, in_q, in_g = np.intersect1d(q_classes, g_classes, return_indices=True)
    return [
        (
            q_order[q_starts[a] : q_starts[a] + q_counts[a]],
            g_order[g_starts[b] : g_starts[b] + g_counts[b]],
        )
        for a, b in zip(in_q, in_g, strict=True)
    ]


class _Sweep:
    """One pass over similarity blocks gathering, per query, what score_vectors() needs.

    For each query: how many other-class gallery items score above `best` (its best
    same-class score), and its `width` best other-class scores. Same-class pairs, the query
    itself among them, are set to -inf in each block before it is read.

    Each query's first block (the diagonal one without a gallery, else the first column
    block) is read on its own and sets a bar, its width-th best score there; the other blocks
    are then shared among threads and only scores above the bar need merging.
    """

    def __init__(
        self,
        q: np.ndarray,
        g: np.ndarray,
        best: np.ndarray,
        pairs: tuple[np.ndarray, np.ndarray],
        symmetric: bool,
        width: int,
        block: int,
    ) -> None:
        self.q, self.g, self.best, self.symmetric, self.block = q, g, best, symmetric, block
        self.width = width
        self.row_blocks, self.col_blocks = -(-len(q) // block), -(-len(g) // block)
        keys = (pairs[0] // block) * self.col_blocks + pairs[1] // block
        order = np.argsort(keys, kind="stable")
        self.pair_keys, self.pair_rows, self.pair_cols = keys[order], *(p[order] for p in pairs)

    def run(self, threads: int, progress: Progress | None) -> tuple[np.ndarray, np.ndarray]:
        """(above (Q,) int64, negatives (Q, width) float32 best first)."""
        seeds = [(i, i if self.symmetric else 0) for i in range(self.row_blocks)]
        rest = [
            (i, j)
            for i in range(self.row_blocks)
            for j in range(i + 1 if self.symmetric else 1, self.col_blocks)
        ]
        first = _Tally(np.full((len(self.q), self.width), -np.inf, dtype=np.float32))
        local = threading.local()
        tallies: list[_Tally] = []

        def visit(pair: tuple[int, int], seeding: bool) -> int:
            if seeding:
                self._seed(first, *pair)
            else:
                if not hasattr(local, "tally"):
                    local.tally = _Tally(np.repeat(first.negatives[:, :1], self.width, axis=1))
                    tallies.append(local.tally)  # list.append is atomic
                self._visit(local.tally, *pair)
            return pair[0]

        # One BLAS thread per block product, many blocks at once: small products on many
        # BLAS threads spend their time waiting for each other.
        with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda pair: visit(pair, True), seeds))
            pending = np.bincount([i for i, _ in rest], minlength=self.row_blocks)
            for i in range(self.row_blocks):
                if pending[i] == 0:
                    self._advance(progress, i)
            for i in pool.map(lambda pair: visit(pair, False), rest):
                pending[i] -= 1
                if pending[i] == 0:
                    self._advance(progress, i)
        above = first.above + sum((t.above for t in tallies), np.zeros_like(first.above))
        pooled = np.concatenate([first.negatives] + [t.negatives for t in tallies], axis=1)
        pooled.sort(axis=1)
        return above, pooled[:, : -self.width - 1 : -1]

    def _advance(self, progress: Progress | None, row_block: int) -> None:
        if progress is not None:
            start = row_block * self.block
            progress(min(start + self.block, len(self.q)) - start)

    def _scores(self, row_block: int, col_block: int) -> tuple[np.ndarray, int, int]:
        """(rows x cols similarities with same-class pairs at -inf, first row, first col)."""
        b = self.block
        r0, c0 = row_block * b, col_block * b
        sim = self.q[r0 : r0 + b] @ self.g[c0 : c0 + b].T
        key = row_block * self.col_blocks + col_block
        lo, hi = np.searchsorted(self.pair_keys, [key, key + 1])
        sim[self.pair_rows[lo:hi] - r0, self.pair_cols[lo:hi] - c0] = -np.inf
        return sim, r0, c0

    def _seed(self, tally: _Tally, row_block: int, col_block: int) -> None:
        """Read a row block's first block: its counts and best scores, the bar for the rest."""
        sim, r0, _ = self._scores(row_block, col_block)
        r1 = r0 + len(sim)
        tally.above[r0:r1] += np.count_nonzero(sim > self.best[r0:r1, None], axis=1)
        if sim.shape[1] < self.width:  # too few columns to fill the list: pad
            sim = np.pad(sim, ((0, 0), (0, self.width - sim.shape[1])), constant_values=-np.inf)
        top = np.partition(sim, sim.shape[1] - self.width, axis=1)[:, -self.width :]
        tally.negatives[r0:r1] = np.sort(top, axis=1)

    def _visit(self, tally: _Tally, row_block: int, col_block: int) -> None:
        """Read one block for its rows and, without a gallery, for its columns too."""
        sim, r0, c0 = self._scores(row_block, col_block)
        rows = slice(r0, r0 + sim.shape[0])
        tally.above[rows] += np.count_nonzero(sim > self.best[rows, None], axis=1)
        tally.offer(sim, sim > tally.negatives[rows, :1], r0, axis=0)
        if self.symmetric:
            # Similarity is symmetric: read down its columns, this is block (col, row).
            cols = slice(c0, c0 + sim.shape[1])
            tally.above[cols] += np.count_nonzero(sim > self.best[None, cols], axis=0)
            tally.offer(sim, sim > tally.negatives[cols, 0], c0, axis=1)


class _Tally:
    """One thread's share of the sweep: counts above the bar and best other-class scores."""

    def __init__(self, negatives: np.ndarray) -> None:
        self.above = np.zeros(len(negatives), dtype=np.int64)
        self.negatives = negatives  # (Q, width) ascending: column 0 is the score to beat
        self.width = negatives.shape[1]

    def offer(self, sim: np.ndarray, better: np.ndarray, start: int, axis: int) -> None:
        """Merge the scores of `sim` marked `better`; queries are its rows (axis 0) or
        columns (axis 1), numbered from `start`."""
        flat = np.flatnonzero(better)
        if len(flat) == 0:
            return
        queries = (flat // sim.shape[1] if axis == 0 else flat % sim.shape[1]) + start
        touched, slot = np.unique(queries, return_inverse=True)
        order = np.argsort(slot, kind="stable")
        slot, scores = slot[order], sim.ravel()[flat[order]]
        rank = np.arange(len(slot)) - np.searchsorted(slot, slot)  # place among its query's
        pool = np.full((len(touched), self.width + int(rank.max()) + 1), -np.inf, np.float32)
        pool[:, : self.width] = self.negatives[touched]
        pool[slot, self.width + rank] = scores
        pool.sort(axis=1)
        self.negatives[touched] = pool[:, -self.width :]


def _ap_and_rp_from_scores(
    positives: np.ndarray, negatives: np.ndarray, r: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-query AP@R and R-precision from sorted same-class and other-class scores.

    The m-th same-class item (0-based) sits at rank m + 1 + (other-class scores above it);
    only ranks up to R count, so the R best other-class scores are enough.
    """
    width = positives.shape[1]
    ap = np.empty(len(r))
    rp = np.empty(len(r))
    step = max(1, 2**22 // (width * width))  # bounds the (B, width, width) comparison
    m = np.arange(width)
    for start in range(0, len(r), step):
        pos, neg, big_r = (a[start : start + step] for a in (positives, negatives, r))
        neg_above = (neg[:, None, :] > pos[:, :, None]).sum(axis=2)  # (B, width)
        rank = m + 1 + neg_above
        rel = (m < big_r[:, None]) & (rank <= big_r[:, None])
        ap[start : start + step] = np.where(rel, (m + 1) / rank, 0.0).sum(axis=1) / big_r
        rp[start : start + step] = rel.sum(axis=1) / big_r
    return ap, rp


def _split(
    vectors: np.ndarray,
    labels: np.ndarray,
    gallery_vectors: np.ndarray | None,
    gallery_labels: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """(queries, their labels, gallery, its labels, whether queries are the gallery)."""
    q = _as_vectors(vectors, "vectors")
    q_labels = _as_ids(labels, len(q), "labels")
    if (gallery_vectors is None) != (gallery_labels is None):
        raise ValueError("give both gallery_vectors and gallery_labels, or neither")
    if gallery_vectors is None or gallery_labels is None:
        return q, q_labels, q, q_labels, True
    g = _as_vectors(gallery_vectors, "gallery_vectors")
    if g.shape[1] != q.shape[1]:
        raise ValueError(f"vectors have {q.shape[1]} dims, gallery has {g.shape[1]}")
    return q, q_labels, g, _as_ids(gallery_labels, len(g), "gallery_labels"), False


def _relevant_counts(q_labels: np.ndarray, g_labels: np.ndarray, exclude: bool) -> np.ndarray:
    """(Q,) R per query: gallery items with its label, less the query itself when it is there."""
    classes, counts = np.unique(g_labels, return_counts=True)
    at = np.minimum(np.searchsorted(classes, q_labels), len(classes) - 1)
    r = np.where(classes[at] == q_labels, counts[at], 0)
    return r - 1 if exclude else r


def _as_vectors(x: np.ndarray, name: str) -> np.ndarray:
    """A C-contiguous float32 (N, D) view of x (copied only if it is not one already)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty (N, D) array, got shape {x.shape}")
    return x


def _as_ids(x: np.ndarray, n: int, name: str) -> np.ndarray:
    """An int64 (n,) array of labels or ids."""
    x = np.asarray(x)
    if x.shape != (n,) or not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"{name} must be ({n},) integers, got {x.dtype} {x.shape}")
    return x.astype(np.int64, copy=False)
