"""The candidate searches `pactl dedup` groups from (pactl.index.grouping): FAISS range search
over a vectors folder (exact below EXACT_MAX_ITEMS, an IVF over projected vectors above) or over
a bundle's own index, and the files' sizes and times that `--keep` reads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import faiss
import numpy as np

from pactl.console import QUIET, Reporter
from pactl.errors import PactlError

EXACT_MAX_ITEMS = 50_000  # below this the pairs come from exact search (a Flat index)
IVF_NPROBE = 16  # lists an IVF over a vectors folder searches per query
TRAIN_PER_LIST = 16  # k-means sample per list of that IVF
KMEANS_ITERATIONS = 10
PROJECTED_SHARE = 0.25  # of the dimensions that the IVF of a large folder searches in
PROJECTED_MARGIN = 0.1  # candidates this far below the threshold there are rescored
CODE_MARGIN = 0.03  # compressed codes: candidates this far below the threshold are rescored


class VectorSearcher:
    """A folder of vectors (memory-mapped): exact search below EXACT_MAX_ITEMS; above, an IVF
    with 8-bit codes over the vectors projected onto their top principal directions (a
    quarter of the dimensions, renormalised: near copies keep their cosine there to within a
    few hundredths), whose candidates within PROJECTED_MARGIN are rescored from the vectors."""

    def __init__(
        self, vectors: np.ndarray, nprobe: int = IVF_NPROBE, reporter: Reporter = QUIET
    ) -> None:
        self.data, self.n = vectors, len(vectors)
        self.approximate = self.n >= EXACT_MAX_ITEMS
        self.margin = PROJECTED_MARGIN if self.approximate else 0.0
        self.projection: np.ndarray | None = None
        if self.approximate:
            sample = _sample(vectors, TRAIN_PER_LIST * _nlist(self.n))
            self.projection = _principal(sample, PROJECTED_SHARE)
            nlist = _nlist(self.n)
            self.index = _ivf(_project(sample, self.projection), nlist, nprobe, reporter)
        else:
            self.index = faiss.IndexFlatIP(vectors.shape[1])
        with reporter.bar("adding vectors", total=self.n) as advance:
            for start in range(0, self.n, 65_536):
                rows = np.arange(start, min(start + 65_536, self.n))
                self.index.add(self._searched(self.vectors(rows)))
                advance(len(rows))

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        if len(rows) and rows[-1] - rows[0] + 1 == len(rows) and (np.diff(rows) == 1).all():
            return np.ascontiguousarray(self.data[rows[0] : rows[-1] + 1], dtype=np.float32)
        order = np.argsort(rows, kind="stable")  # sorted reads of a memory map
        out = np.empty((len(rows), self.data.shape[1]), dtype=np.float32)
        out[order] = self.data[rows[order]]
        return out

    def candidates(self, queries: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
        lims, _, found = self.index.range_search(self._searched(queries), radius)
        return lims, found

    def _searched(self, x: np.ndarray) -> np.ndarray:
        return x if self.projection is None else _project(x, self.projection)


def _nlist(n: int) -> int:
    return int(2 ** round(math.log2(4 * math.sqrt(n))))


def _sample(vectors: np.ndarray, size: int) -> np.ndarray:
    n = len(vectors)
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(n, size), replace=False))
    return np.ascontiguousarray(vectors[rows], dtype=np.float32)


def _principal(sample: np.ndarray, share: float) -> np.ndarray:
    """(d, p) orthonormal: the top p = share x d directions of the uncentred sample (so inner
    products, not distances to the mean, are what is kept)."""
    dim = sample.shape[1]
    keep = max(16, int(dim * share)) if dim >= 64 else dim
    _, vecs = np.linalg.eigh(sample.T.astype(np.float64) @ sample.astype(np.float64))
    return np.ascontiguousarray(vecs[:, ::-1][:, :keep], dtype=np.float32)


def _project(x: np.ndarray, projection: np.ndarray) -> np.ndarray:
    y = x @ projection
    return y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)


def _ivf(sample: np.ndarray, nlist: int, nprobe: int, reporter: Reporter) -> Any:
    """An IVF with 8-bit codes, trained on `sample`."""
    dim = sample.shape[1]
    index = faiss.index_factory(dim, f"IVF{nlist},SQ8", faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(index)
    # Lists only need to keep near copies together: a small k-means is enough.
    ivf.cp.niter, ivf.cp.min_points_per_centroid = KMEANS_ITERATIONS, TRAIN_PER_LIST
    reporter.log(f"training IVF{nlist},SQ8 ({dim} dimensions) on {len(sample):,} vectors")
    index.train(sample)
    ivf.nprobe = nprobe
    return index


class BundleSearcher:
    """A bundle's own index (its tuned nprobe / efSearch), over its live items in table order;
    vectors are read back from the index (exact for Flat codes), or from a binary bundle's
    float vectors (which has no range search: dedup searches those vectors themselves)."""

    def __init__(self, bundle: Any) -> None:
        self.bundle, self.index = bundle, bundle.index
        live = ~bundle.is_deleted(bundle.items.ids)
        self.ids = bundle.items.ids[live]  # position -> item id
        self.n = len(self.ids)
        self.floats = getattr(self.index, "floats", None)  # a binary bundle's (item rows)
        ivf = faiss.try_extract_index_ivf(self.index) if self.floats is None else None
        if ivf is not None:
            # reconstruct by id: a hash table takes any ids (an array only 0..n-1, which a
            # compacted bundle no longer has)
            hashtable = faiss.DirectMap.Hashtable  # type: ignore[attr-defined]  # not in the stub
            ivf.set_direct_map_type(hashtable)
        self.approximate = self.floats is None and not _exact_codes(self.index)
        self.margin = CODE_MARGIN if self.approximate else 0.0
        self._sorted = np.argsort(self.ids)

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(self.ids[rows], dtype=np.int64)
        if self.floats is not None:
            return np.asarray(self.floats[self.bundle.items.positions(ids)], dtype=np.float32)
        return np.asarray(self.index.reconstruct_batch(ids), dtype=np.float32)

    def candidates(self, queries: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
        lims, _, ids = self.index.range_search(queries, radius)
        if not len(ids):
            return lims, ids
        at = np.minimum(np.searchsorted(self.ids, ids, sorter=self._sorted), self.n - 1)
        rows = self._sorted[at]
        return lims, np.where(self.ids[rows] == ids, rows, -1)  # deleted, unknown: -1


def _exact_codes(index: Any) -> bool:
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    inner = faiss.downcast_index(inner)
    return isinstance(inner, (faiss.IndexFlat, faiss.IndexIVFFlat))


def check_range_search(index: Any, where: str) -> None:
    """FAISS's graph indexes (HNSW, NSG) answer no range search: refused with what to do."""
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if isinstance(faiss.downcast_index(inner), (faiss.IndexHNSW, faiss.IndexNSG)):
        raise PactlError(
            f"{where} is a graph index, which has no range search: run dedup on its vectors "
            "folder instead"
        )


# ---------------------------------------------------------------------------- what to keep


def file_facts(
    paths: Callable[[int], str], sizes: np.ndarray, mtimes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sizes and mtimes with those recorded as unknown (-1) read from the files now (-1 for a
    file that is gone)."""
    sizes, mtimes = sizes.copy(), mtimes.copy()
    for i in np.flatnonzero((sizes < 0) | (mtimes < 0)).tolist():
        try:
            st = os.stat(paths(i))
        except OSError:
            continue
        sizes[i], mtimes[i] = st.st_size, st.st_mtime_ns
    return sizes, mtimes
