"""Top-k search over a bundle, a query's own item excluded by id, and result rows."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pactl.errors import PactlError
from pactl.results import Hit


class Items(Protocol):
    """What a search reads of a bundle's item table (pactl.store.item_table.ItemTable)."""

    @property
    def ids(self) -> np.ndarray: ...  # (n,) int64

    @property
    def paths(self) -> Sequence[str]: ...

    @property
    def labels(self) -> Sequence[str]: ...

    def __len__(self) -> int: ...

    def positions(self, ids: np.ndarray) -> np.ndarray: ...


class Searchable(Protocol):
    """What a search reads of a bundle (pactl.index.bundle.Bundle); a Protocol, so that this
    module needs nothing of the package that opens bundles."""

    @property
    def path(self) -> Path: ...

    @property
    def index(self) -> Any: ...  # faiss.Index

    @property
    def items(self) -> Items: ...

    @property
    def deleted(self) -> np.ndarray: ...  # sorted tombstone ids

    def searcher(self, depth: int) -> Any: ...


def path_key(path: str) -> str:
    """An item's path as compared: `pactl embed` records them absolute and normalised; a
    relative one (from a hand-made items.csv) is taken from here."""
    return path if os.path.isabs(path) else os.path.abspath(path)


class PathIndex:
    """Item ids by path, for finding queries among the indexed items (--exclude-self, labels).

    Holds the paths' hashes, sorted (16 bytes an item), not a dict of millions of strings; a
    lookup bisects the hashes and confirms the path itself, so a hash collision costs a
    comparison, never a wrong id. A path held by several rows gives the last one: a file
    replaced by `pactl index --add` has its new row after the old (deleted) one. Ids in `skip`
    (a bundle's deleted ids, sorted) are not looked up at all.
    """

    def __init__(self, items: Items, skip: np.ndarray | None = None) -> None:
        self._items = items
        hashes = np.fromiter(
            (hash(path_key(p)) for p in items.paths), dtype=np.int64, count=len(items)
        )
        rows = np.arange(len(items), dtype=np.int64)
        if skip is not None and len(skip):
            rows = rows[~in_sorted(items.ids, np.asarray(skip, dtype=np.int64))]
        self._order = rows[np.argsort(hashes[rows], kind="stable")]
        self._hashes = hashes[self._order]

    def ids(self, paths: Sequence[str]) -> np.ndarray:
        """The id of the item at each path (absolute or relative to here), -1 where none."""
        keys = [os.path.abspath(p) for p in paths]
        wanted = np.fromiter((hash(k) for k in keys), dtype=np.int64, count=len(keys))
        first = np.searchsorted(self._hashes, wanted, side="left")
        last = np.searchsorted(self._hashes, wanted, side="right")
        out = np.full(len(keys), -1, dtype=np.int64)
        for i, (key, lo, hi) in enumerate(zip(keys, first.tolist(), last.tolist(), strict=True)):
            for position in self._order[lo:hi][::-1].tolist():  # the last row of a path wins
                if path_key(self._items.paths[position]) == key:
                    out[i] = self._items.ids[position]
                    break
        return out


def in_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """`np.isin(values, sorted_set)` by bisection: the (larger) values are neither copied nor
    sorted."""
    if len(sorted_set) == 0:
        return np.zeros(np.shape(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return np.asarray(sorted_set[at] == values)


def capped_k(k: int, ntotal: int, excluding: bool) -> int:
    """How many hits a query can get: k, at most the bundle's live items (one less when a
    query's own item is excluded). Callers see the cap as the width of the arrays search()
    returns."""
    if k < 1:
        raise PactlError(f"k must be at least 1, not {k}")
    return max(0, min(k, ntotal - 1 if excluding else ntotal))


def search(
    bundle: Searchable,
    queries: np.ndarray,
    k: int,
    exclude_ids: np.ndarray | None = None,
    batch_size: int = 1024,
    rescore: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The k best (scores, ids) of each query row, best first, in batches of `batch_size`.

    `exclude_ids[i]` is the bundle id of query i (or -1): that id is removed from its hits, so a
    duplicate of the query stays a hit while the query itself does not. Deleted items
    (bundle.deleted) are never returned: the index is asked for more hits than k, and again
    for twice as many where too few live ones came back, so a row still has k live hits when
    the bundle has them. Both arrays have capped_k(...) columns; a missing hit (an approximate
    index found fewer) has id -1.

    A binary bundle's hits are its codes' nearest, rescored by exact cosine: `rescore`
    candidates per hit instead of the bundle's own depth (0: hits in Hamming order).
    """
    index = rescored(bundle.index, rescore)
    xq = np.ascontiguousarray(queries, dtype=np.float32)
    if xq.ndim != 2 or xq.shape[1] != index.d:
        raise PactlError(
            f"queries have shape {tuple(xq.shape)}; bundle {bundle.path} holds vectors of "
            f"dimension {index.d}"
        )
    nq = len(xq)
    own = np.full(nq, -1, dtype=np.int64) if exclude_ids is None else np.asarray(exclude_ids)
    if own.shape != (nq,):
        raise PactlError(f"exclude_ids needs one id per query ({nq}), got shape {own.shape}")
    excluding = bool((own >= 0).any())
    dead = bundle.deleted
    # The width is every row's cap: one less than the live items only when every row leaves
    # out a live item of its own (a deleted one takes no place); a row that excludes itself
    # beside rows that do not ends in a -1 instead, never costing the others a hit.
    own_live = bool(nq) and bool(((own >= 0) & ~in_sorted(own, dead)).all())
    width = capped_k(k, int(index.ntotal) - len(dead), own_live)
    # Over-fetch by as many as the deleted items, up to k more; rarely a second round is needed.
    fetch = min(width + int(excluding) + min(len(dead), width), int(index.ntotal))
    scores = np.full((nq, width), -np.inf, dtype=np.float32)
    ids = np.full((nq, width), -1, dtype=np.int64)
    if width == 0:
        return scores, ids
    for start in range(0, nq, max(1, batch_size)):
        stop = min(start + max(1, batch_size), nq)
        scores[start:stop], ids[start:stop] = _search_live(
            bundle, index, xq[start:stop], own[start:stop], width, fetch
        )
    return scores, ids


def rescored(index: Any, rescore: int | None) -> Any:
    """`index`, or a binary bundle's searched with another rescoring depth; a float bundle has
    nothing to rescore: refused in one line."""
    if rescore is None:
        return index
    other = getattr(index, "with_rescore", None)
    if other is None:
        raise PactlError(
            "--rescore is for bundles of lossy codes (binary, or a float factory such as "
            "IVF...,PQ): this one searches its float vectors exactly as they are"
        )
    return other(rescore)


def _search_live(
    bundle: Searchable, index: Any, xq: np.ndarray, own: np.ndarray, width: int, fetch: int
) -> tuple[np.ndarray, np.ndarray]:
    """`width` hits per row that are neither deleted nor the row's own id. A row left short
    (by deleted hits, or an approximate index that found fewer: an IVF search sees only its
    nprobe lists) is searched again, twice as deep and twice as wide (nprobe, efSearch) each
    time, until it is full or the search is exhaustive. `index`: the bundle's, or its codes
    with another rescoring depth."""
    dead = bundle.deleted
    live = int(index.ntotal) - len(dead)
    own_live = (own >= 0) & ~in_sorted(own, dead)
    wanted = np.minimum(width, live - own_live.astype(np.int64))  # what each row can have
    wider, widest = _widening(index)

    def live_hits(
        rows: np.ndarray | slice, depth: int, params: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        searcher = bundle.searcher(depth) if params is None and index is bundle.index else index
        kwargs = {} if params is None else {"params": params}
        found_scores, found_ids = searcher.search(xq[rows], depth, **kwargs)
        if len(dead):
            found_ids[in_sorted(found_ids, dead)] = -1
        return exclude_by_id(found_scores, found_ids, own[rows], width)

    scores, ids = live_hits(slice(None), fetch)
    short = np.flatnonzero((ids >= 0).sum(axis=1) < wanted)
    factor = 1
    while len(short) and not (fetch >= index.ntotal and widest(factor)):
        fetch, factor = min(2 * fetch, int(index.ntotal)), 2 * factor
        scores[short], ids[short] = live_hits(short, fetch, wider(factor))
        short = short[(ids[short] >= 0).sum(axis=1) < wanted[short]]
    return scores, ids


def _widening(index: Any) -> tuple[Any, Any]:
    """(factor -> search parameters `factor` times as wide as the tuned ones: IVF nprobe up to
    nlist, HNSW efSearch up to the items; None for other kinds), (factor -> whether that is
    as wide as the index goes)."""
    if hasattr(index, "widening"):  # codes rescored (pactl.index.binary.search, rescoring)
        return index.widening()
    return float_widening(index)


def float_widening(index: Any) -> tuple[Any, Any]:
    """_widening of a FAISS float index."""
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        nprobe, nlist = int(ivf.nprobe), int(ivf.nlist)
        ivf_params: Any = faiss.SearchParametersIVF  # (its stub lacks the keyword arguments)
        return (
            lambda f: ivf_params(nprobe=min(nprobe * f, nlist)),
            lambda f: nprobe * f >= nlist,
        )
    inner = faiss.downcast_index(index.index if isinstance(index, faiss.IndexIDMap) else index)
    if isinstance(inner, faiss.IndexHNSW):
        ef, n = int(inner.hnsw.efSearch), int(index.ntotal)
        hnsw_params: Any = faiss.SearchParametersHNSW  # type: ignore[attr-defined]
        return lambda f: hnsw_params(efSearch=min(ef * f, n)), lambda f: ef * f >= n
    return lambda f: None, lambda f: True


def exclude_by_id(
    scores: np.ndarray, ids: np.ndarray, exclude: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Drop `exclude[i]` (an id, or -1 for none) from row i and keep the first k of the rest.

    By id, never by position: with duplicate vectors the query's own item need not come first.
    Rows left short are padded with id -1 and score -inf.
    """
    drop = (ids == exclude[:, None]) & (exclude[:, None] >= 0)
    drop |= ids < 0  # FAISS's own "no result" slots
    order = np.argsort(drop, axis=1, kind="stable")[:, :k]  # kept entries first, in rank order
    kept_scores = np.take_along_axis(scores, order, axis=1).astype(np.float32)
    kept_ids = np.take_along_axis(ids, order, axis=1).astype(np.int64)
    empty = np.take_along_axis(drop, order, axis=1)
    kept_scores[empty], kept_ids[empty] = -np.inf, -1
    if kept_ids.shape[1] < k:  # fewer results than k were fetched
        pad = k - kept_ids.shape[1]
        kept_scores = np.pad(kept_scores, ((0, 0), (0, pad)), constant_values=-np.inf)
        kept_ids = np.pad(kept_ids, ((0, 0), (0, pad)), constant_values=-1)
    return kept_scores, kept_ids


def hits(
    bundle: Searchable, query_names: list[str], scores: np.ndarray, ids: np.ndarray
) -> list[list[Hit]]:
    """Result rows per query, with the items' paths and labels; -1 ids are dropped."""
    if len(query_names) != len(ids):
        raise ValueError(f"{len(query_names)} query names for {len(ids)} result rows")
    positions = bundle.items.positions(ids)  # (nq, k), -1 for unknown ids
    unknown = (ids >= 0) & (positions < 0)
    if unknown.any():
        raise PactlError(
            f"bundle {bundle.path} is inconsistent: id {int(ids[unknown][0])} is in the index "
            "but not in items.csv; rebuild it with `pactl index`"
        )
    paths, labels = bundle.items.paths, bundle.items.labels
    out: list[list[Hit]] = []
    for name, row_scores, row_ids, row_pos in zip(
        query_names, scores.tolist(), ids.tolist(), positions.tolist(), strict=True
    ):
        kept = [(s, i, p) for s, i, p in zip(row_scores, row_ids, row_pos, strict=True) if i >= 0]
        out.append(
            [
                Hit(name, rank, i, paths[p], labels[p], s)
                for rank, (s, i, p) in enumerate(kept, start=1)
            ]
        )
    return out
