"""Calibration scores its pairs a block at a time: a set of a few thousand images has millions
of pairs, and gathering both rows of every pair at once took gigabytes (16 GiB for the 4M pairs
of 512-d vectors a sampled calibration scores), which a sweep paid at the end of every run."""

from __future__ import annotations

import tracemalloc

import numpy as np

from pactl.calibrate import CalibrationConfig, pair_scores, score_pairs


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_pair_scores_are_the_cosines_of_each_pair() -> None:
    rng = np.random.default_rng(0)
    v = unit(rng.standard_normal((50, 16)))
    i, j = rng.integers(0, 50, 40_000), rng.integers(0, 50, 40_000)  # more than one block
    want = (v.astype(np.float64)[i] * v.astype(np.float64)[j]).sum(axis=1)
    assert np.allclose(pair_scores(v, i, j), want, atol=1e-6)


def test_scoring_every_pair_does_not_gather_every_pair_at_once() -> None:
    """600 vectors of 256 dims: 179,700 pairs, whose rows gathered at once take 368 MB."""
    rng = np.random.default_rng(1)
    v = unit(rng.standard_normal((600, 256)))
    labels = rng.integers(0, 20, 600)
    tracemalloc.start()
    pairs = score_pairs(v, labels, CalibrationConfig())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert pairs.exact and len(pairs.scores) == 600 * 599 // 2
    assert peak < 100 * 2**20, f"{peak / 2**20:.0f} MiB"
