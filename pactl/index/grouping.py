"""Groups of the same item: every pair of a collection at or above a cosine threshold, asked of
a Searcher (pactl.index.dedup's range searches) one batch of queries at a time, joined into
groups.

Two ways to group: connected components (a union-find over positions, fed batch by batch, so
memory is the batch and one int64 per item), or strict, where every member must match the
group's first member, so a chain of similar shots (a~b, b~c, c not ~a) does not merge; strict
keeps the pairs found (a few per duplicate) until the end. A group's first member is its
earliest item; scores are each member's cosine to it, from the vectors themselves.

Nothing here deletes anything: `removable` says which members a user could delete, keeping one
per group.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pactl.config import REQUIRED, check_options, setting
from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.rules import cosine, flag, integer

KEEP_CHOICES = ("first", "largest", "newest")


@dataclass(frozen=True)
class DedupConfig:
    threshold: float = setting(
        REQUIRED, cosine(), "Cosine at or above which two images are the same item."
    )
    strict: bool = setting(
        False, flag(), "Every member must match its group's first (no chains of shots)."
    )
    batch_size: int = setting(
        4096, integer(1), "Query vectors per range search: memory grows with this.", cli=False
    )


class Searcher(Protocol):
    """Range search over n items numbered by position 0..n-1."""

    n: int
    approximate: bool  # scores of the index are not exact cosines (compressed codes)
    margin: float  # so candidates are searched this far below the threshold, then rescored

    def vectors(self, rows: np.ndarray) -> np.ndarray: ...

    def candidates(self, queries: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
        """(lims (B + 1,), rows) of range_search: query b's candidates are rows[lims[b]:lims[b+1]],
        each scoring above `radius` by the index (-1: not a live item)."""
        ...


@dataclass
class Groups:
    rows: np.ndarray  # (M,) positions of the members, group by group, first member first
    group: np.ndarray  # (M,) group number, from 1, in the order of the groups' first members
    score: np.ndarray  # (M,) float32 cosine of each member to its group's first (1 for it)
    images: int  # items searched
    pairs: int  # pairs found at or above the threshold

    @property
    def count(self) -> int:
        return int(self.group[-1]) if len(self.group) else 0


def find_groups(searcher: Searcher, config: DedupConfig, reporter: Reporter = QUIET) -> Groups:
    """The groups of two or more items of `searcher` at `config.threshold`."""
    check_options(config)
    n = searcher.n
    joined = UnionFind(n) if not config.strict else None
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    found = 0
    for first, second in _pairs(searcher, config, reporter):
        found += len(first)
        if joined is not None:
            joined.union(first, second)
        else:
            kept.append((first, second))
    if joined is not None:
        leader = joined.roots()
    else:
        pairs = [np.concatenate(p) for p in zip(*kept, strict=True)] if kept else None
        leader = _leaders(n, pairs)
    rows, group = _members(leader)
    score = _scores(searcher, leader[rows], rows, config.batch_size)
    return Groups(rows, group, score, n, found)


def _pairs(
    searcher: Searcher, config: DedupConfig, reporter: Reporter
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per batch of queries, the pairs (a < b, positions) whose cosine is at least the
    threshold; each pair once per direction it was found in."""
    t = config.threshold
    # range_search keeps scores strictly above the radius: just below t keeps t itself.
    radius = t - searcher.margin if searcher.margin else float(np.nextafter(np.float32(t), -2))
    with reporter.bar("searching pairs", total=searcher.n) as advance:
        for start in range(0, searcher.n, config.batch_size):
            rows = np.arange(start, min(start + config.batch_size, searcher.n))
            queries = searcher.vectors(rows)
            lims, found = searcher.candidates(queries, radius)
            counts: np.ndarray = np.diff(np.asarray(lims, dtype=np.int64))
            own = np.repeat(rows, counts)
            keep = (found >= 0) & (found != own)
            own, found = own[keep], found[keep]
            if len(found):
                at = own - start
                scores = np.einsum("ij,ij->i", queries[at], searcher.vectors(found))
                good = scores >= t
                own, found = own[good], found[good]
                yield np.minimum(own, found), np.maximum(own, found)
            advance(len(rows))


class UnionFind:
    """Disjoint sets over 0..n-1 in numpy; a set's root is its smallest member."""

    def __init__(self, n: int) -> None:
        self.parent = np.arange(n, dtype=np.int64)

    def union(self, a: np.ndarray, b: np.ndarray) -> None:
        while len(a):
            ra, rb = self.find(a), self.find(b)
            differ = ra != rb
            a, b, ra, rb = a[differ], b[differ], ra[differ], rb[differ]
            np.minimum.at(self.parent, np.maximum(ra, rb), np.minimum(ra, rb))

    def find(self, x: np.ndarray) -> np.ndarray:
        root = self.parent[x]
        while True:
            up = self.parent[root]
            if np.array_equal(up, root):
                return root
            self.parent[x] = up  # path halving: later finds climb less
            root = up

    def roots(self) -> np.ndarray:
        parent = self.parent
        while True:
            up = parent[parent]
            if np.array_equal(up, parent):
                return parent
            parent = up


def _leaders(n: int, pairs: list[np.ndarray] | None) -> np.ndarray:
    """Strict groups: items in order; one not yet in a group starts one, and takes every later
    item it matches that is not in a group yet."""
    leader = np.arange(n, dtype=np.int64)
    if pairs is None:
        return leader
    first, second = pairs
    order = np.lexsort((second, first))
    first, second = first[order], second[order]
    taken = np.zeros(n, dtype=bool)
    starts = np.flatnonzero(np.append(True, first[1:] != first[:-1]))
    ends = np.append(starts[1:], len(first))
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        a = int(first[s])
        if taken[a]:
            continue
        joining = np.unique(second[s:e])
        joining = joining[~taken[joining]]
        taken[joining] = True
        leader[joining] = a
    return leader


def _members(leader: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, group numbers) of the items in groups of two or more, ordered by group (by first
    member) then position; the first member has the leader's own position."""
    sizes = np.bincount(leader, minlength=len(leader))
    rows = np.flatnonzero(sizes[leader] > 1)
    rows = rows[np.lexsort((rows, leader[rows]))]
    lead = leader[rows]
    group = np.cumsum(np.append(True, lead[1:] != lead[:-1])) if len(rows) else lead
    return rows, group.astype(np.int64)


def _scores(searcher: Searcher, firsts: np.ndarray, rows: np.ndarray, batch: int) -> np.ndarray:
    out = np.empty(len(rows), dtype=np.float32)
    for s in range(0, len(rows), batch):
        a, b = searcher.vectors(firsts[s : s + batch]), searcher.vectors(rows[s : s + batch])
        out[s : s + batch] = np.einsum("ij,ij->i", a, b)
    out[firsts == rows] = 1.0
    return out


def removable(groups: Groups, sizes: np.ndarray, mtimes: np.ndarray, keep: str) -> np.ndarray:
    """(M,) bool over the members: True for all but the one kept per group (its first, the
    largest file, or the newest; ties go to the earlier item). `sizes` and `mtimes` are per
    member, -1 when unknown."""
    if keep not in KEEP_CHOICES:
        raise PactlError(f"--keep {keep!r}: choose one of {', '.join(KEEP_CHOICES)}")
    if not len(groups.rows):
        return np.zeros(0, dtype=bool)
    value = {"first": -groups.rows, "largest": sizes, "newest": mtimes}[keep]
    # Within a group: highest value first, then the earliest position. In int64: as float64,
    # modification times in ns (about 1.7e18) within 256 ns of each other would tie.
    order = np.lexsort((groups.rows, -np.asarray(value, dtype=np.int64), groups.group))
    first_of_group = np.append(True, groups.group[order][1:] != groups.group[order][:-1])
    out = np.ones(len(groups.rows), dtype=bool)
    out[order[first_of_group]] = False
    return out
