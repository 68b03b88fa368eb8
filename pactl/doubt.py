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
    return weight * np.asarray(classes) + (1 - weight) * np.asarray(neighbours)


def doubt(classes: np.ndarray | None, neighbours: np.ndarray | None) -> np.ndarray:
    """(N,) in [0, 1]: 1 - blend; highest for the labels most likely wrong."""
    return 1.0 - blend(classes, neighbours)
