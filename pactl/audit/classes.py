"""The class-level view of an audit: how many items each class holds and how unequal the
classes are, how much the audit believes each class's labels, and which pairs of classes its
suggested labels move items between most (the classes a person or a network confuses). Pure
numpy on the audit's per-item doubt and suggestion.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SUSPECTED = 0.5  # doubt at or above which an item is counted as suspected: the witnesses
# believe its label less than they believe it wrong


@dataclass(frozen=True)
class ClassView:
    """Per class (by label code): `counts`, `quality` (the mean belief in its items' labels,
    1 - doubt; NaN where it has none), `suspected` (its items doubted SUSPECTED or more); the
    confusable `pairs` (a, b, items suggested a -> b, b -> a), most moved first; and the
    imbalance: largest / smallest class, the Gini coefficient of the counts (0: equal) and the
    entropy of the class shares over its most (1: equal)."""

    names: list[str]
    counts: np.ndarray
    quality: np.ndarray
    suspected: np.ndarray
    pairs: list[tuple[int, int, int, int]]
    ratio: float
    gini: float
    entropy: float

    def worst(self) -> np.ndarray:
        """Classes with items, the lowest label quality first (ties: the earlier code)."""
        held = np.flatnonzero(self.counts > 0)
        return held[np.lexsort((held, self.quality[held]))]


def gini(counts: np.ndarray) -> float:
    """The Gini coefficient of `counts`: the mean absolute difference of two classes' counts
    over twice the mean count (0: every class alike; (n - 1) / n: one class holds everything)."""
    x = np.sort(np.asarray(counts, dtype=np.float64))
    n, total = len(x), float(x.sum())
    if n == 0 or total == 0:
        return 0.0
    ranks = np.arange(1, n + 1)
    return float(2 * (ranks * x).sum() / (n * total) - (n + 1) / n)


def balance(counts: np.ndarray) -> float:
    """The entropy of the class shares over log(classes): 1 when every class is alike."""
    held = np.asarray(counts, dtype=np.float64)
    held = held[held > 0]
    if len(held) < 2:
        return 1.0
    p = held / held.sum()
    return float(-(p * np.log(p)).sum() / np.log(len(held)))


def class_view(
    codes: np.ndarray, names: list[str], doubt: np.ndarray, suggested: np.ndarray
) -> ClassView:
    """The view of items labelled `codes` (N,) into `names`, doubted `doubt` (N,) with the
    labels `suggested` (N,) instead (-1: none)."""
    c = len(names)
    counts = np.bincount(codes, minlength=c)
    belief = np.bincount(codes, weights=1.0 - np.nan_to_num(doubt, nan=0.0), minlength=c)
    with np.errstate(invalid="ignore", divide="ignore"):
        quality = np.where(counts > 0, belief / np.maximum(counts, 1), np.nan)
    suspect = (doubt >= SUSPECTED) & (suggested >= 0) & (suggested != codes)
    suspected = np.bincount(codes[suspect], minlength=c)
    held = counts[counts > 0]
    ratio = float(held.max() / held.min()) if len(held) else 0.0
    return ClassView(
        names, counts, quality, suspected, confused(codes[suspect], suggested[suspect], c), ratio,
        gini(held), balance(held),
    )  # fmt: skip


def confused(
    given: np.ndarray, instead: np.ndarray, classes: int
) -> list[tuple[int, int, int, int]]:
    """(a, b, moved a -> b, moved b -> a) for each unordered pair of classes (a < b) that the
    suspected items' suggestions move between, the most moved in total first (ties: a, b)."""
    if not len(given):
        return []
    low, high = np.minimum(given, instead), np.maximum(given, instead)
    keys, at = np.unique(low.astype(np.int64) * classes + high, return_inverse=True)
    forward = np.bincount(at, weights=(given == low), minlength=len(keys)).astype(np.int64)
    total = np.bincount(at, minlength=len(keys))
    order = np.lexsort((keys, -total))
    return [
        (int(keys[i] // classes), int(keys[i] % classes), int(forward[i]),
         int(total[i] - forward[i]))
        for i in order.tolist()
    ]  # fmt: skip


def words(view: ClassView, shown: int = 3) -> str:
    """One line of the view: the classes' sizes and imbalance, the worst label quality, the
    most confused pairs."""
    held = view.counts[view.counts > 0]
    if not len(held):
        return "classes: none"
    worst = ", ".join(f"{view.names[i]} {view.quality[i]:.2f}" for i in view.worst()[:shown])
    pairs = ", ".join(
        f"{view.names[a]}↔{view.names[b]} {ab + ba:,}" for a, b, ab, ba in view.pairs[:shown]
    )
    return (
        f"classes: {len(held):,}, {int(held.min()):,} to {int(held.max()):,} items (largest / "
        f"smallest {view.ratio:.1f}, Gini {view.gini:.2f}, entropy {view.entropy:.2f} of "
        f"balanced); lowest label quality: {worst}; most confused: {pairs or 'none'}"
    )


COLUMNS = (
    "kind", "rank", "class", "other", "items", "share", "label_quality", "suspected",
    "suspected_share", "moved_to_other", "moved_from_other",
)  # fmt: skip


def rows(view: ClassView) -> list[list[object]]:
    """The view as COLUMNS rows: each class (kind class, the lowest label quality first), then
    each confusable pair (kind pair, the most moved first)."""
    total = max(int(view.counts.sum()), 1)
    out: list[list[object]] = []
    for rank, i in enumerate(view.worst().tolist(), start=1):
        n, s = int(view.counts[i]), int(view.suspected[i])
        out.append(
            ["class", rank, view.names[i], "", n, round(n / total, 6),
             round(float(view.quality[i]), 6), s, round(s / n, 6), "", ""]
        )  # fmt: skip
    for rank, (a, b, ab, ba) in enumerate(view.pairs, start=1):
        out.append(["pair", rank, view.names[a], view.names[b], ab + ba, "", "", "", "", ab, ba])
    return out
