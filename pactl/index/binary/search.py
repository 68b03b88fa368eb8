"""A binary bundle's index as searches see it: float queries coded, their Hamming candidates
found by FAISS, ordered by (distance, id), and rescored by exact cosine on the float vectors.

BinaryIndex has the surface pactl.index.search reads of a float index (`d`, `ntotal`,
`search(x, k, params=)`), so deleted items, a query's own id and the widening of short rows are
handled there the same for both kinds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

from pactl.codes.rotation import Rotation, hamming_scores
from pactl.errors import PactlError
from pactl.index.rescoring import MAX_RESCORE, padded, rescore

TIE_SLACK = 8  # candidates fetched beyond the m wanted, so level ones at the cut are seen
NO_CODE = np.iinfo(np.int32).max  # the distance of a missing candidate (id -1): last


@dataclass
class BinaryIndex:
    codes: Any  # faiss.IndexBinary over the items' codes, item ids as its ids
    rotation: Rotation  # float vectors -> codes
    floats: np.ndarray  # (ntotal, d) float32, memory-mapped: row i is the item table's row i
    positions: Callable[[np.ndarray], np.ndarray]  # item ids -> rows of `floats` (-1: none)
    rescore: int  # candidates per hit rescored by cosine; 0: hits in Hamming order

    metric_type = faiss.METRIC_INNER_PRODUCT  # hits' scores are cosines (or their code proxy)

    @property
    def d(self) -> int:
        """The float vectors' dimension: what a query is."""
        return self.rotation.dim

    @property
    def bits(self) -> int:
        return self.rotation.bits

    @property
    def ntotal(self) -> int:
        return int(self.codes.ntotal)

    def with_rescore(self, rescore: int) -> BinaryIndex:
        """The same index searched with another rescoring depth (0: Hamming order)."""
        if not 0 <= rescore <= MAX_RESCORE:
            raise PactlError(f"--rescore {rescore}: give 0 (Hamming order) to {MAX_RESCORE:,}")
        return dataclasses.replace(self, rescore=rescore)

    def search(self, x: np.ndarray, k: int, params: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids), (nq, k), best first, -1 / -inf padded. Rescored: the k best cosines
        among each query's k x rescore nearest codes; else the k nearest codes, scored
        1 - 2 h / bits. `params`: FAISS search parameters of the code index (widening)."""
        queries = np.ascontiguousarray(x, dtype=np.float32)
        q = self.rotation.codes(queries)
        if self.rescore == 0:
            distances, ids = self.candidates(q, k, params)
            scores = np.where(ids >= 0, hamming_scores(distances, self.bits), -np.inf)
            return padded(scores.astype(np.float32), ids, k)
        _, found = self.candidates(q, min(k * self.rescore, self.ntotal), params)
        return padded(*rescore(self.floats, self.positions, queries, found, k), k)

    def candidates(
        self, q: np.ndarray, m: int, params: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The m nearest codes of each packed query code, ordered by (Hamming distance, id):
        (distances int32, ids int64), (nq, m). A row whose last candidate is level with the
        deepest one fetched is fetched again twice as deep, so the cut takes the lowest ids
        of a level group, as an exhaustive search ordered that way would."""
        n = self.ntotal
        m = min(m, n)
        if m == 0:
            return np.empty((len(q), 0), np.int32), np.empty((len(q), 0), np.int64)
        depth = min(n, m + max(TIE_SLACK, m // 4))
        distances, ids = self._fetch(q, depth, params)
        out = distances[:, :m].copy(), ids[:, :m].copy()
        rows = np.arange(len(q))
        level = _level_at_cut(distances, ids, m)
        while depth < n and level.any():
            rows, depth = rows[level], min(n, 2 * depth)
            distances, ids = self._fetch(q[rows], depth, params)
            out[0][rows], out[1][rows] = distances[:, :m], ids[:, :m]
            level = _level_at_cut(distances, ids, m)
        return out

    def _fetch(self, q: np.ndarray, depth: int, params: Any) -> tuple[np.ndarray, np.ndarray]:
        kwargs = {} if params is None else {"params": params}
        distances, ids = self.codes.search(q, depth, **kwargs)
        distances = np.where(ids >= 0, distances, NO_CODE).astype(np.int32)
        order = np.lexsort((ids, distances), axis=1)  # by distance, then id
        return np.take_along_axis(distances, order, 1), np.take_along_axis(ids, order, 1)

    def widening(self) -> tuple[Callable[[int], Any], Callable[[int], bool]]:
        """(factor -> search parameters that many times as wide as the tuned ones, factor ->
        whether that is as wide as the index goes), as pactl.index.search widens a short row."""
        inner = faiss.downcast_IndexBinary(self.codes)
        if isinstance(inner, faiss.IndexBinaryIVF):
            nprobe, nlist = int(inner.nprobe), int(inner.nlist)
            ivf_params: Any = faiss.SearchParametersIVF
            return (
                lambda f: ivf_params(nprobe=min(nprobe * f, nlist)),
                lambda f: nprobe * f >= nlist,
            )
        graph = hnsw_of(self.codes)
        if graph is not None:
            ef, n = int(graph.hnsw.efSearch), self.ntotal
            hnsw_params: Any = faiss.SearchParametersHNSW  # type: ignore[attr-defined]
            return lambda f: hnsw_params(efSearch=min(ef * f, n)), lambda f: ef * f >= n
        return lambda f: None, lambda f: True


def _level_at_cut(distances: np.ndarray, ids: np.ndarray, m: int) -> np.ndarray:
    """Rows whose m-th candidate is level with the deepest one fetched (more may follow)."""
    return np.asarray((ids[:, -1] >= 0) & (distances[:, -1] == distances[:, m - 1]))


def hnsw_of(codes: Any) -> Any | None:
    """The IndexBinaryHNSW of a code index (bare or under an id map), else None."""
    inner = codes.index if isinstance(codes, faiss.IndexBinaryIDMap) else codes
    inner = faiss.downcast_IndexBinary(inner)
    return inner if isinstance(inner, faiss.IndexBinaryHNSW) else None
