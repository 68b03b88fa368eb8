"""The same-item threshold: a hand-computed case, brute force, the sampled estimate."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pactl.calibrate import CalibrationConfig, calibrate, read_calibration
from pactl.errors import PactlError


def _at_angles(degrees: list[float]) -> np.ndarray:
    rad = np.radians(degrees)
    return np.stack([np.cos(rad), np.sin(rad)], axis=1).astype(np.float32)


def test_hand_computed_threshold_and_recall() -> None:
    # Pairs by cosine: a1a2 cos10 (same), a2b1 cos20, a1b1 cos30, b1b2 cos70 (same), a2b2 cos90,
    # a1b2 cos100. Precision 1 down to cos10 (1 of 2 positives), then 1/2, 1/3, 2/4 at cos70.
    vectors = _at_angles([0, 10, 30, 100])
    labels = np.array(["a", "a", "b", "b"])
    strict = calibrate(vectors, labels, CalibrationConfig(precision=0.99))
    assert strict.threshold == pytest.approx(math.cos(math.radians(10)), abs=1e-6)
    assert strict.recall == 0.5 and strict.measured == 1.0 and strict.exact
    assert strict.pairs == 6
    loose = calibrate(vectors, labels, CalibrationConfig(precision=0.5))
    assert loose.threshold == pytest.approx(math.cos(math.radians(70)), abs=1e-6)
    assert loose.recall == 1.0 and loose.measured == 0.5


def _brute_force(vectors: np.ndarray, labels: np.ndarray, target: float) -> tuple[float, float]:
    v = vectors.astype(np.float64)
    pairs = [
        (float(v[i] @ v[j]), labels[i] == labels[j])
        for i, j in itertools.combinations(range(len(v)), 2)
    ]
    positives = sum(same for _, same in pairs)
    best: tuple[float, float] | None = None
    for t, _ in pairs:
        above = [same for s, same in pairs if s >= t - 1e-7]
        if sum(above) / len(above) >= target and (best is None or t < best[0]):
            best = (t, sum(above) / positives)
    assert best is not None
    return best


@pytest.mark.parametrize("target", [0.99, 0.8, 0.5])
def test_threshold_matches_brute_force(target: float) -> None:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 6, size=40)
    centres = rng.normal(size=(6, 8))
    vectors = centres[labels] + rng.normal(scale=0.9, size=(40, 8))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    cal = calibrate(vectors, labels, CalibrationConfig(precision=target))
    threshold, recall = _brute_force(vectors, labels, target)
    assert cal.threshold == pytest.approx(threshold, abs=1e-5)
    assert cal.recall == pytest.approx(recall)


def test_sampled_estimate_is_close_to_all_pairs() -> None:
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 30, size=1500)
    centres = rng.normal(size=(30, 16))
    vectors = centres[labels] + rng.normal(scale=0.8, size=(1500, 16))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    exact = calibrate(vectors, labels, CalibrationConfig(precision=0.95))
    sampled = calibrate(
        vectors, labels, CalibrationConfig(precision=0.95, exact_pairs=1000, sample_pairs=200_000)
    )
    assert exact.exact and not sampled.exact
    assert sampled.threshold == pytest.approx(exact.threshold, abs=0.02)
    assert sampled.recall == pytest.approx(exact.recall, abs=0.03)


def test_unreachable_precision_has_no_threshold() -> None:
    # The closest pair is of two classes: no cut has precision 1.
    cal = calibrate(_at_angles([0, 1, 50, 60]), np.array([0, 1, 0, 1]), CalibrationConfig(1.0))
    assert cal.threshold is None and cal.recall == 0.0


def test_one_image_per_class_is_refused() -> None:
    with pytest.raises(PactlError, match="two images of one class"):
        calibrate(_at_angles([0, 10]), np.array([0, 1]), CalibrationConfig())


def test_round_trip_and_other_targets_from_the_curve() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 5, size=60)
    vectors = rng.normal(size=(5, 4))[labels] + rng.normal(scale=0.7, size=(60, 4))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    cal = calibrate(vectors, labels, CalibrationConfig(precision=0.9))
    again = read_calibration(cal.to_dict(), "meta.json")
    assert again.threshold == pytest.approx(cal.threshold) and again.recall == cal.recall
    loose = calibrate(vectors, labels, CalibrationConfig(precision=0.7))
    # From the curve's grid: within one step of the threshold measured directly.
    assert cal.threshold_for(0.7) == pytest.approx(loose.threshold, abs=0.0026)
    damaged = {**cal.to_dict(), "recall": 3.0}
    with pytest.raises(PactlError, match="calibration is damaged"):
        read_calibration(damaged, "meta.json")


def test_a_cut_never_splits_tied_scores() -> None:
    """Guards against a cut that splits tied scores: identical vectors (the normal duplicate
    case) tie at cosine 1, and "score >= t" takes every one of them or none. Items 0, 1, 2 are
    one picture, 0 and 1 of class a, 2 of class b: at cosine 1 one pair in three is of one
    class, so no threshold has precision 0.5 (a cut after the first tied pair would claim
    precision 1 at recall 1/2)."""
    u, v = [1.0, 0.0], [0.0, 1.0]
    vectors = np.array([u, u, u, v], dtype=np.float32)
    labels = np.array(["a", "a", "b", "b"])
    for target in (0.99, 0.5):
        cal = calibrate(vectors, labels, CalibrationConfig(precision=target))
        assert cal.threshold is None and cal.recall == 0.0, target
    # Pairs at cosine 1: (0,1) same, (0,2), (1,2) not; at cosine 0 the other three, one same.
    assert cal.curve == ((1.0, pytest.approx(1 / 3), 0.5),)
    loose = calibrate(vectors, labels, CalibrationConfig(precision=0.3))
    assert loose.threshold == 0.0 and loose.recall == 1.0
    assert loose.measured == pytest.approx(1 / 3)


@pytest.mark.parametrize("target", [0.7, 0.25, 0.14])
def test_threshold_matches_brute_force_on_many_ties(target: float) -> None:
    """Guards against a cut that splits tied scores, on a set where nearly every score ties: 40
    copies of 8 directions whose cosines are exact in float32 (the axes of 4-D and the rows of a
    Hadamard matrix over 2: cosines 1, 0.5, 0 and -0.5), labels mostly by direction."""
    hadamard = np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]])
    directions = np.concatenate([np.eye(4), hadamard / 2])
    rng = np.random.default_rng(7)
    which = rng.integers(0, 8, size=40)
    labels = np.where(rng.random(40) < 0.7, which, rng.integers(0, 8, size=40))
    vectors = directions[which].astype(np.float32)
    cal = calibrate(vectors, labels, CalibrationConfig(precision=target))
    threshold, recall = _brute_force(vectors, labels, target)
    assert cal.threshold == pytest.approx(threshold, abs=1e-5)
    assert cal.recall == pytest.approx(recall)


def test_calibration_limits_and_the_values_it_records() -> None:
    """Guards against limits moved by one (a target of 0 or above 1 accepted, two images of
    one class refused), the split's name lost or not "test" by default, and a precision
    recorded as measured where no threshold reaches the target."""
    two = calibrate(_at_angles([0, 10]), np.array([0, 0]), CalibrationConfig(precision=0.5))
    assert two.threshold == pytest.approx(math.cos(math.radians(10)), abs=1e-6)
    assert two.split == "test" and two.recall == 1.0
    assert calibrate(_at_angles([0, 10]), np.array([0, 0]), CalibrationConfig(), "val").split == (
        "val"
    )
    for bad in (0.0, 1.5):
        with pytest.raises(PactlError, match="--precision must be a number above 0 and at most 1"):
            calibrate(_at_angles([0, 10]), np.array([0, 0]), CalibrationConfig(precision=bad))
    none = calibrate(_at_angles([0, 1, 50, 60]), np.array([0, 1, 0, 1]), CalibrationConfig(1.0))
    assert none.measured == 0.0 and none.point_for(1.0) is None and none.threshold_for(1.0) is None


def test_other_targets_read_from_the_curve_at_its_ends() -> None:
    """Guards against the calibrated point read back wrongly, and a target no curve point
    reaches giving a point: the calibrated target gives its own threshold, 1.01 gives none."""
    cal = calibrate(_at_angles([0, 10, 30, 100]), np.array([0, 0, 1, 1]), CalibrationConfig(0.99))
    assert cal.point_for(0.99) == (cal.threshold, cal.measured, cal.recall)
    assert cal.threshold is not None and cal.point_for(1.01) is None
    assert cal.threshold_for(1.01) is None


def test_pr_points_with_one_positive_pair_or_none() -> None:
    """Guards against recall divided by a total of positives of exactly 1 (taken for none),
    and no positive pair giving NaN recall instead of 0."""
    from pactl.calibrate import ScoredPairs, pr_points

    scores = np.array([0.9, 0.5, 0.1], dtype=np.float32)
    one = ScoredPairs(scores, np.array([False, True, False]), np.ones(3), True)
    np.testing.assert_allclose(pr_points(one)[2], [0.0, 1.0, 1.0])
    none = ScoredPairs(scores, np.zeros(3, dtype=bool), np.ones(3), True)
    np.testing.assert_array_equal(pr_points(none)[2], [0.0, 0.0, 0.0])


def test_the_curve_has_a_point_at_every_step_of_cosine() -> None:
    """Guards against a curve whose grid starts at 0 (losing the negative cosines), is shifted
    by a step, or takes the last threshold above a grid value rather than at or above it: the
    curve is, for every multiple g of CURVE_STEP from just above the lowest threshold to the
    highest, the lowest-threshold point at or above g, once each."""
    from pactl.calibrate import CURVE_STEP, curve

    # 0.5 and 0 on the grid; -0.296 within the lowest grid step above -0.3
    thresholds = np.array([0.5, 0.499, 0.3, 0.0, -0.25, -0.296, -0.3])
    precision, recall = np.linspace(1.0, 0.5, 7), np.linspace(0.1, 1.0, 7)
    want = []
    for step in range(math.ceil(0.5 / CURVE_STEP), math.floor(-0.3 / CURVE_STEP), -1):
        g = step * CURVE_STEP
        at_or_above = [k for k, t in enumerate(thresholds) if t >= g - 1e-12]
        if at_or_above and at_or_above[-1] not in want:
            want.append(at_or_above[-1])
    got = curve(thresholds, precision, recall)
    assert [t for t, _, _ in got] == [float(thresholds[k]) for k in sorted(want)]
    assert got[-1][0] == pytest.approx(-0.296) and got[0][0] == 0.5
