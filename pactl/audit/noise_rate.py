"""How many of a set's labels are wrong, estimated from the set itself (no rate to guess), in the
manner of Confident Learning (Northcutt et al., JAIR 2021, "Confident Learning: Estimating
Uncertainty in Dataset Labels"): a count of the confident joint's off-diagonal.

Each item's probability of a class is the share of its k nearest other items carrying that
label (the neighbours' witness of pactl.audit.doubt, for every label among them), out of as many
places as the label can fill: k, or the label's item count where smaller (less the item itself
for its own label), so that classes smaller than k are not all confident of their neighbours'.
A class's threshold is the mean share of its own label over the items given it. An item counts as
confidently of class j where its share of j reaches j's threshold (the largest such share; its
given label on a tie), and goes into the confident joint at (given, j); items confident of no
class are left out. Each row of the joint is scaled to the number of items given that label
(calibration, as Confident Learning does), and a label's estimated noise rate is the share of
its row off the diagonal; the overall rate is their mean weighted by the labels' counts.

The thresholds make the count fair under noise: at symmetric noise r a correctly labelled item's
share of its class and a flipped item's share of its true class are drawn alike (about 1 - r
of their neighbours), and the threshold (about (1 - r)^2 + r^2 / (C - 1)) sits below both.
tests/test_noise_rate.py plants 0, 10 and 30% symmetric flips in clustered vectors and holds
the estimate to within NOISE_TOLERANCE of the planted rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NOISE_TOLERANCE = 0.05  # what the tests hold the estimate to on clustered sets


@dataclass(frozen=True)
class NoiseEstimate:
    """The estimated share of wrong labels: overall, and per label code (NaN: no item of that
    label was confident of any class), with the counts behind them."""

    overall: float
    per_class: np.ndarray  # (C,) float64
    given: np.ndarray  # (C,) items given each label
    confident: int  # items in the confident joint

    def words(self, names: list[str], shown: int = 3) -> str:
        """One line: the overall rate and the labels estimated noisiest."""
        rates = np.nan_to_num(self.per_class, nan=-1.0)
        worst = [i for i in np.argsort(-rates, kind="stable")[:shown] if rates[i] > 0]
        named = ", ".join(f"{names[i]} {self.per_class[i]:.2f}" for i in worst)
        return (
            f"estimated noise rate {self.overall:.3f} ({self.confident:,} of "
            f"{int(self.given.sum()):,} items confident)"
            + (f"; noisiest: {named}" if named else "")
        )


def estimate_noise(labels: np.ndarray, given: np.ndarray, classes: int) -> NoiseEstimate:
    """`labels` (N, k): the label codes of each item's k nearest other items (-1: none);
    `given` (N,): each item's label code, of `classes` codes."""
    valid = labels >= 0
    counted = np.maximum(valid.sum(axis=1), 1)
    n = np.bincount(given, minlength=classes).astype(np.float64)
    # A label can fill at most as many of the k places as it has items (less the item itself
    # for its own): a class of 4 among 10 neighbours is whole at 4 (or 3), not at 10.
    supply = n[np.maximum(labels, 0)] - (labels == given[:, None])  # (N, k)
    room = np.minimum(counted[:, None], np.maximum(supply, 1))
    # (N, k) the share of the room of column c's label its neighbours fill; (N,) its own label's
    hits = (labels[:, :, None] == labels[:, None, :]).sum(axis=2)
    share = np.where(valid, np.minimum(hits / np.maximum(room, 1), 1.0), 0.0)
    own_room = np.maximum(np.minimum(counted, n[given] - 1), 1)
    own = np.minimum(((labels == given[:, None]) & valid).sum(axis=1) / own_room, 1.0)
    threshold = np.bincount(given, weights=own, minlength=classes) / np.maximum(n, 1)
    above = valid & (share >= threshold[np.maximum(labels, 0)]) & (share > 0)
    best = np.where(above, share, -1.0)
    column = best.argmax(axis=1)
    top = best[np.arange(len(given)), column]
    own_ok = (own >= threshold[given]) & (own > 0)
    chosen = np.where(own_ok & (own >= top), given, labels[np.arange(len(given)), column])
    sure = own_ok | (top >= 0)
    joint = np.zeros((classes, classes))
    np.add.at(joint, (given[sure], chosen[sure]), 1.0)
    rows = joint.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = 1.0 - np.diag(joint) / rows  # the calibrated row's off-diagonal share
    known = rows > 0
    overall = float((per_class[known] * n[known]).sum() / n[known].sum()) if known.any() else 0.0
    return NoiseEstimate(overall, per_class, n.astype(np.int64), int(sure.sum()))
