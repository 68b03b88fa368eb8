"""The noise rate estimated from a set itself (pactl.audit.noise_rate): planted symmetric flips in
clustered vectors, their neighbours found by brute force, are estimated within NOISE_TOLERANCE
overall and per label; noise planted in one label is found there."""

from __future__ import annotations

import numpy as np
import pytest

from pactl.audit.noise_rate import NOISE_TOLERANCE, estimate_noise

CLASSES, PER = 10, 80


def clusters(seed: int, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """(true labels (N,), each item's k nearest other items (N, k)): CLASSES Gaussian clusters
    of PER items in 32-D, the neighbours by brute force in float64."""
    rng = np.random.default_rng(seed)
    true = np.repeat(np.arange(CLASSES), PER)
    x = rng.standard_normal((CLASSES, 32))[true] + 0.6 * rng.standard_normal((len(true), 32))
    d = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)  # (N, N)
    np.fill_diagonal(d, np.inf)
    return true, np.argsort(d, axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_estimate_tracks_planted_symmetric_flips(rate: float, seed: int) -> None:
    true, nearest = clusters(seed)
    rng = np.random.default_rng(seed + 10)
    given = true.copy()
    pick = rng.choice(len(true), int(round(rate * len(true))), replace=False)
    given[pick] = (true[pick] + rng.integers(1, CLASSES, len(pick))) % CLASSES
    flipped = given != true
    got = estimate_noise(given[nearest], given, CLASSES)
    assert abs(got.overall - flipped.mean()) <= NOISE_TOLERANCE
    per = np.bincount(given, weights=flipped, minlength=CLASSES) / np.bincount(given)
    assert np.max(np.abs(got.per_class - per)) <= 2 * NOISE_TOLERANCE  # ~80 items a label


def test_noise_planted_in_one_label_is_found_in_that_label() -> None:
    """40 of class 0's items labelled 1: label 1 holds 40 wrong of 120, the others none. Noise
    this concentrated is underestimated (docs/audit.md): half a cluster relabelled leaves its
    items' neighbours split evenly, and only some of them are confident of their true class."""
    true, nearest = clusters(3)
    given = true.copy()
    given[np.random.default_rng(4).choice(PER, 40, replace=False)] = 1
    got = estimate_noise(given[nearest], given, CLASSES)
    assert 0.15 <= got.per_class[1] <= 40 / 120 + NOISE_TOLERANCE
    assert np.delete(got.per_class, 1).max() <= NOISE_TOLERANCE
    assert "noisiest: 1 " in got.words([str(c) for c in range(CLASSES)])


def test_classes_smaller_than_k_are_not_all_counted_wrong() -> None:
    """4 clean classes of 4 items, 10 neighbours each: an item's 3 class-mates fill its own
    label's room (3), so no label is wrong; counted out of 10 places, every item would look
    confident of the 4 items of a neighbouring class (4 of 10 beat 3 of 10)."""
    given = np.repeat(np.arange(4), 4)
    nearest = np.array(
        [[j for j in np.argsort(np.abs(given - given[i]) * 10 + np.arange(16)) if j != i][:10]
         for i in range(16)]
    )  # fmt: skip
    got = estimate_noise(given[nearest], given, 4)
    assert got.overall == 0.0 and got.confident == 16
