"""How much a labelled item's surroundings doubt its label: pure numpy on cosines.

Two witnesses, each a probability that the given label is right:

- the classes (class_share): the item's cosine to its own class's proxy (or the mean of its
  class's vectors) against its cosines to the other classes', as a softmax at `scale`, the share
  of the own class. A proxy network is trained to put an item nearest its own proxy; an item
  nearer another class's proxy than its own, by a margin, is what a wrong label looks like.
- the neighbours (neighbour_share): the share of its k nearest other items that carry its label.

`doubt` blends the two (1 - the weighted mean of the shares). pactl.training.robust ranks a
batch by it (--drop-noisy) and pactl.verbs.audit a whole set; docs/audit.md says which blend
ranks best and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCALE = 16.0  # softmax scale of the class cosines (Proxy-Anchor trains with alpha 32)
NEIGHBOURS = 10  # k nearest other items asked
CLASS_WEIGHT = 0.5  # the classes' share of the blend; the neighbours have the rest


def class_share(own: np.ndarray, others: np.ndarray, scale: float = SCALE) -> np.ndarray:
    """(N,) softmax share of the own class: `own` (N,) the cosine to the own class, `others`
    (N, M) the cosines to the other classes asked (NaN: none there; all the others, or only the
    nearest ones, whose sum then dominates the rest at this scale)."""
    own = np.asarray(own, dtype=np.float64)
    others = np.asarray(others, dtype=np.float64).reshape(len(own), -1)
    top = np.fmax(own, np.nanmax(others, axis=1, initial=-np.inf))  # (N,) for stable exp
    rest = np.nansum(np.exp(scale * (others - top[:, None])), axis=1)
    mine = np.exp(scale * (own - top))
    return mine / (mine + rest)


def neighbour_share(labels: np.ndarray, valid: np.ndarray, own: np.ndarray) -> np.ndarray:
    """(N,) share of the valid neighbours carrying the own label: `labels` (N, k) the
    neighbours' labels, `valid` (N, k) which of them exist; 0.5 (no opinion) with none."""
    valid = np.asarray(valid, dtype=bool)
    same = (np.asarray(labels) == np.asarray(own)[:, None]) & valid
    count = valid.sum(axis=1)
    return np.where(count > 0, same.sum(axis=1) / np.maximum(count, 1), 0.5)


def majority(labels: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(N,) the most frequent label among each row's valid neighbours, ties to the nearer one
    (columns nearest first); -1 for a row with none."""
    labels, valid = np.asarray(labels), np.asarray(valid, dtype=bool)
    n, k = labels.shape
    votes = np.zeros((n, k), dtype=np.int64)  # votes[i, j]: how many valid columns match j
    for j in range(k):
        votes += (labels == labels[:, j : j + 1]) & valid & valid[:, j : j + 1]
    best = np.argmax(votes, axis=1)  # the first (nearest) of the most voted
    found = np.take_along_axis(labels, best[:, None], axis=1)[:, 0]
    return np.where(valid.any(axis=1), found, -1)


def blend(
    classes: np.ndarray | None, neighbours: np.ndarray | None, weight: float = CLASS_WEIGHT
) -> np.ndarray:
    """(N,) the probability that the label is right, from either witness or both."""
    if classes is None and neighbours is None:
        raise ValueError("blend needs the classes' share, the neighbours' share or both")
    if classes is None:
        return np.asarray(neighbours, dtype=np.float64)
    if neighbours is None:
        return np.asarray(classes, dtype=np.float64)
    classes, neighbours = np.asarray(classes, np.float64), np.asarray(neighbours, np.float64)
    both = weight * classes + (1 - weight) * neighbours
    return np.where(np.isnan(classes), neighbours, both)  # no class opinion: the neighbours


def doubt(classes: np.ndarray | None, neighbours: np.ndarray | None) -> np.ndarray:
    """(N,) in [0, 1]: 1 - blend; highest for the labels most likely wrong."""
    return 1.0 - blend(classes, neighbours)


# ---------------------------------------------------------------------------- a set's classes

EXACT_CLASSES = 1024  # up to this many classes every item is held against all of them


@dataclass(frozen=True)
class ClassCentres:
    """One unit vector per class the witness knows: `vectors` (K, D), `codes` (K,) the label
    code each stands for (ascending). Proxies come as they are; class means keep `sums` (K, D)
    and `counts` (K,), so that an item is held against its own class without itself."""

    vectors: np.ndarray
    codes: np.ndarray
    sums: np.ndarray | None = None
    counts: np.ndarray | None = None

    def positions(self, codes: np.ndarray) -> np.ndarray:
        """Each code's row, -1 for a class this witness does not know."""
        at = np.minimum(np.searchsorted(self.codes, codes), len(self.codes) - 1)
        return np.where(self.codes[at] == codes, at, -1)


def proxy_centres(proxies: np.ndarray, codes: np.ndarray) -> ClassCentres:
    order = np.argsort(codes)
    vectors = unit_rows(np.asarray(proxies, np.float64)[order]).astype(np.float32)
    return ClassCentres(vectors, np.asarray(codes)[order])


def mean_centres(sums: np.ndarray, counts: np.ndarray) -> ClassCentres:
    """The means of the classes present (count > 0), from per-code `sums` (C, D) and `counts`."""
    codes = np.flatnonzero(counts > 0)
    vectors = unit_rows(sums[codes]).astype(np.float32)  # float32: cosines to many classes
    return ClassCentres(vectors, codes, sums[codes], counts[codes])


def unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@dataclass
class ClassWitness:
    """What the classes say of a batch: the own class's share (NaN: no opinion), the nearest
    other class (its code, -1: none) and its share, and the highest cosine to any class."""

    share: np.ndarray
    other: np.ndarray
    other_share: np.ndarray
    top: np.ndarray


def ask_classes(
    queries: np.ndarray,
    own: np.ndarray,
    centres: ClassCentres,
    candidates: np.ndarray | None = None,
    scale: float = SCALE,
) -> ClassWitness:
    """The classes' witness for unit `queries` (B, D) labelled `own` (B,) codes: against every
    class, or with `candidates` (B, M) codes (-1: none) against those only (many classes)."""
    own_at = centres.positions(own)
    if candidates is None:
        at = np.broadcast_to(np.arange(len(centres.codes)), (len(queries), len(centres.codes)))
        cos = queries @ centres.vectors.T  # (B, K)
    else:
        at = np.where(candidates >= 0, centres.positions(np.maximum(candidates, 0)), -1)
        cos = np.einsum("bd,bmd->bm", queries, centres.vectors[np.maximum(at, 0)])  # (B, M)
    others = np.where((at == own_at[:, None]) | (at < 0), np.nan, cos)
    mine = own_cosine(queries, own_at, centres)
    share, shares = softmax_parts(mine, others, scale)
    none = np.isnan(others).all(axis=1)
    best = np.argmax(np.nan_to_num(others, nan=-np.inf), axis=1)[:, None]
    other = np.where(none, -1, centres.codes[np.take_along_axis(at, best, 1)[:, 0]])
    other_share = np.take_along_axis(shares, best, 1)[:, 0]
    top = np.fmax(np.nanmax(others, axis=1, initial=-1.0), np.nan_to_num(mine, nan=-1.0))
    return ClassWitness(share, other, other_share, top)


def own_cosine(queries: np.ndarray, at: np.ndarray, centres: ClassCentres) -> np.ndarray:
    """(B,) each query's cosine to its own class (NaN: a class the witness lacks); to a class
    mean without the query itself in it (NaN for a class of one)."""
    known = at >= 0
    rows = np.maximum(at, 0)
    if centres.sums is None or centres.counts is None:
        cos = np.einsum("bd,bd->b", queries, centres.vectors[rows])
        return np.where(known, cos, np.nan)
    rest = centres.sums[rows] - queries  # (B, D) the class without the query
    norm = np.linalg.norm(rest, axis=1)
    alone = (centres.counts[rows] <= 1) | (norm < 1e-9)
    cos = np.einsum("bd,bd->b", queries, rest) / np.maximum(norm, 1e-12)
    return np.where(known & ~alone, cos, np.nan)


def softmax_parts(
    mine: np.ndarray, others: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """The softmax at `scale` over the own cosine (B,) and the others (B, M), NaN left out:
    (the own share (NaN where `mine` is), the others' shares (B, M), 0 where NaN)."""
    stacked = np.concatenate([mine[:, None], others], axis=1)
    stacked[np.isnan(stacked)] = -np.inf  # exp(-inf) = 0: left out
    top = stacked.max(axis=1, keepdims=True)
    top[~np.isfinite(top)] = 0.0  # a row with nothing at all
    weights = np.exp(scale * (stacked - top))
    shares = weights / np.maximum(weights.sum(axis=1, keepdims=True), 1e-300)
    return np.where(np.isnan(mine), np.nan, shares[:, 0]), shares[:, 1:]


def auroc(scores: np.ndarray, positives: np.ndarray) -> float:
    """Area under the ROC curve of `scores` ranking the `positives` (bool) above the rest: the
    chance that a random positive scores above a random negative, ties counting half."""
    scores, positives = np.asarray(scores, np.float64), np.asarray(positives, bool)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2.0)[inverse]  # average 1-based rank of each tie
    p, n = int(positives.sum()), int((~positives).sum())
    if not p or not n:
        raise ValueError("AUROC needs positives and negatives")
    return float((ranks[positives].sum() - p * (p + 1) / 2.0) / (p * n))
