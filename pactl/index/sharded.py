"""Shard indexes searched as one (a bundle set's, pactl.index.sets): the top k of each shard,
searched with one setting, merged by score.

The shards are filled from copies of one trained index, so an IVF shard probes the same lists
for a query as any other (one quantiser): the merged top k is the top k of one index over all
their items. Lossy codes are merged on the codes' own scores first and rescored once, on the
shards' float vectors stacked (a RescoredIndex over ShardCodes and StackedRows), so the
candidates rescored are the ones one bundle would rescore.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pactl.index.mapped import drop_pages
from pactl.index.rescoring import RescoredIndex


@dataclass(frozen=True)
class ShardCodes:
    """The shards' FAISS indexes with the surface pactl.index.search and pactl.index.tune read
    of one: d, ntotal, metric_type, search and widening. `shards` is what a search setting is
    set on (each of them); they share one trained index."""

    shards: tuple[Any, ...]  # faiss.Index each, item ids as their ids, disjoint

    @property
    def d(self) -> int:
        return int(self.shards[0].d)

    @property
    def ntotal(self) -> int:
        return sum(int(shard.ntotal) for shard in self.shards)

    @property
    def metric_type(self) -> int:
        return int(self.shards[0].metric_type)

    def search(self, x: np.ndarray, k: int, params: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids), (nq, k), best first: each shard's top k merged by score, a shard
        before the next where scores tie; -1 and -inf where the shards found fewer."""
        kwargs = {} if params is None else {"params": params}
        scores, ids = [], []
        for shard in self.shards:
            found_scores, found_ids = shard.search(x, k, **kwargs)
            # FAISS pads a short answer with -1 and the lowest float: -inf sorts it last
            scores.append(np.where(found_ids >= 0, found_scores, -np.inf).astype(np.float32))
            ids.append(found_ids)
        return merge_by_score(scores, ids, k)

    def widening(self) -> tuple[Any, Any]:
        """pactl.index.search's widening, read from the largest shard: an IVF's nprobe and
        nlist are every shard's; an HNSW graph is searched whole once its largest shard is."""
        from pactl.index.search import float_widening

        return float_widening(max(self.shards, key=lambda shard: int(shard.ntotal)))


def merge_by_score(
    scores: Sequence[np.ndarray], ids: Sequence[np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The k best of each row over the parts (nq, k_i each), best first; a stable sort keeps
    the parts' order among equal scores."""
    all_scores, all_ids = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
    best = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]  # (nq, k)
    return np.take_along_axis(all_scores, best, axis=1), np.take_along_axis(all_ids, best, axis=1)


class StackedRows:
    """The shards' floats.npy (memory-mapped, row i its shard's item row i) as the rows of one
    (n, d) float32 matrix in shard order: row i is the set's item row i. Read only by gathering
    rows (pactl.index.rescoring.rescore), each shard's from its own map, its pages dropped
    after; a slice (rescore's page drop) is empty, the gather having dropped them already."""

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
        self.parts = list(parts)
        self.starts = np.cumsum([0, *(len(part) for part in self.parts)])  # (shards + 1,)
        self.shape = (int(self.starts[-1]), int(self.parts[0].shape[1]))
        self.dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: Any) -> np.ndarray:
        if isinstance(rows, slice):
            return np.empty((0, self.shape[1]), dtype=np.float32)
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.shape[1]), dtype=np.float32)
        shard_of = np.searchsorted(self.starts, rows, side="right") - 1
        for shard in np.unique(shard_of).tolist():
            mine = shard_of == shard
            local = rows[mine] - self.starts[shard]
            part = self.parts[shard]
            out[mine] = part[local]
            drop_pages(part[int(local.min()) : int(local.max()) + 1])
        return out


def as_one(
    codes: Sequence[Any],
    floats: Sequence[np.ndarray] | None,
    positions: Any,
    depth: int,
) -> Any:
    """The shards searched as one index: ShardCodes, or with `floats` (each shard's float
    vectors) its candidates rescored `depth` per hit by exact cosine; `positions` maps the
    set's item ids to its rows (the shards' item tables joined in shard order)."""
    joined = ShardCodes(tuple(codes))
    if floats is None:
        return joined
    stacked: Any = StackedRows(floats)  # what rescore() reads of a float matrix
    return RescoredShards(joined, stacked, positions, depth)


@dataclass
class RescoredShards(RescoredIndex):
    """A RescoredIndex over ShardCodes (the codes' candidates of all shards merged, then
    rescored once), widened as its shards are."""

    def widening(self) -> tuple[Any, Any]:
        return self.index.widening()
