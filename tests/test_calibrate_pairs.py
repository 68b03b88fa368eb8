"""The calibration's pairs and records: which pairs are scored (all, or a weighted sample drawn
as the module says), their cosines, a stored calibration read back field by field, its line in
words, and the threshold a same-item search takes from it. References: brute-force pair lists,
float64 dot products, draw counts against their expected shares, hand-written strings."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pactl import calibrate as cal_mod
from pactl.calibrate import (
    Calibration,
    CalibrationConfig,
    calibrate,
    describe,
    pair_scores,
    read_calibration,
    same_item_threshold,
    score_pairs,
)
from pactl.errors import PactlError, UsageError


def _unit_rows(rng: np.random.Generator, n: int, dim: int = 6) -> np.ndarray:
    x = rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _codes(sizes: list[int], rng: np.random.Generator) -> np.ndarray:
    """Class codes 0..C-1 with the given sizes, shuffled (members of a class not adjacent)."""
    return rng.permutation(np.repeat(np.arange(len(sizes)), sizes))


def _chi2_ok(counts: np.ndarray, expected: np.ndarray) -> bool:
    """Pearson's chi-square below its 99.99th percentile (Wilson-Hilferty) for len-1 dof."""
    dof = len(counts) - 1
    stat = float((((counts - expected) ** 2) / expected).sum())
    z = 3.719  # the normal's 99.99th percentile
    limit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    return stat < limit


def test_positive_pairs_are_every_same_class_pair_when_they_fit() -> None:
    """Guards against a class's pairs left out (classes of one or two, the last class), a pair
    drawn twice or between classes, and a wrong total, when every positive pair fits the
    budget (exactly: budget = total): the pairs are the brute force's, once each."""
    rng = np.random.default_rng(0)
    sizes = [1, 2, 3, 5, 1, 4]
    codes = _codes(sizes, rng)
    want = {(i, j) for i, j in itertools.combinations(range(len(codes)), 2) if codes[i] == codes[j]}
    total = sum(s * (s - 1) // 2 for s in sizes)
    first, second, count = cal_mod._positive_pairs(codes, np.array(sizes), total, rng)
    got = [(int(min(a, b)), int(max(a, b))) for a, b in zip(first, second, strict=True)]
    assert count == total == len(want)
    assert sorted(got) == sorted(want)


def test_sampled_positive_pairs_are_uniform_over_same_class_pairs() -> None:
    """Guards against a draw that is not uniform over the same-class pairs: classes not in
    proportion to their pairs, a member never drawn first (the last) or second, a pair of one
    image with itself, a pair across classes. Drawn from 7,500 pairs, 60,000 times in batches
    under a budget below the total: each class's share and each member's appearances against
    their expected counts (chi-square at 99.99%)."""
    rng = np.random.default_rng(1)
    sizes = np.array([40, 60, 100])
    codes = _codes(sizes.tolist(), rng)
    per_class = sizes * (sizes - 1) // 2
    total = int(per_class.sum())
    firsts, seconds = [], []
    for _ in range(10):
        a, b, count = cal_mod._positive_pairs(codes, sizes, 6_000, rng)
        assert count == total and len(a) == len(b) == 6_000
        firsts.append(a)
        seconds.append(b)
    a, b = np.concatenate(firsts), np.concatenate(seconds)
    assert (codes[a] == codes[b]).all() and (a != b).all()
    drawn = np.bincount(codes[a], minlength=3)
    assert _chi2_ok(drawn, len(a) * per_class / total)
    for c in range(3):
        members = np.flatnonzero(codes == c)
        of_c = codes[a] == c
        for side in (a[of_c], b[of_c]):  # first and second members each uniform in the class
            counts = np.array([np.count_nonzero(side == m) for m in members])
            assert _chi2_ok(counts, np.full(len(members), of_c.sum() / len(members)))


def test_negative_pairs_are_uniform_over_pairs_of_two_classes() -> None:
    """Guards against negative pairs from one class, fewer or more than the budget, or drawn
    other than uniformly among the ordered pairs of two classes: a class of size s is first
    in s (n - s) of the n^2 - sum(s^2) such pairs."""
    rng = np.random.default_rng(2)
    sizes = np.array([2, 8, 30])
    codes = _codes(sizes.tolist(), rng)
    n = len(codes)
    a, b = cal_mod._negative_pairs(codes, 50_000, rng)
    assert len(a) == len(b) == 50_000
    assert (codes[a] != codes[b]).all()
    share = sizes * (n - sizes) / (n * n - (sizes**2).sum())
    assert _chi2_ok(np.bincount(codes[a], minlength=3), 50_000 * share)
    assert _chi2_ok(np.bincount(codes[b], minlength=3), 50_000 * share)
    size_of = sizes[codes]  # every image, first or second, in proportion to n - its class's size
    expected = 50_000 * (n - size_of) / (n * n - (sizes**2).sum())
    assert _chi2_ok(np.bincount(a, minlength=n), expected)
    assert _chi2_ok(np.bincount(b, minlength=n), expected)


def test_negative_pairs_are_always_the_budget_however_few_a_round_finds() -> None:
    """Guards against the count of pairs found starting above 0, which returns one pair short
    when a round of draws finds one fewer than the budget: two images of two classes, one pair
    asked 300 times (a round of two draws finds none a quarter of the time)."""
    rng = np.random.default_rng(10)
    codes = np.array([0, 1])
    for _ in range(300):
        a, b = cal_mod._negative_pairs(codes, 1, rng)
        assert len(a) == len(b) == 1 and a[0] != b[0]


def test_pair_scores_are_float64_dot_products_block_by_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guards against a block that skips or repeats pairs (blocks of 3 over 10 pairs: the last
    one short), or cosines of the wrong rows."""
    monkeypatch.setattr(cal_mod, "PAIR_BLOCK", 3)
    rng = np.random.default_rng(3)
    x = _unit_rows(rng, 7)
    i, j = rng.integers(0, 7, size=10), rng.integers(0, 7, size=10)
    want = np.einsum("pd,pd->p", x[i].astype(np.float64), x[j].astype(np.float64))
    got = pair_scores(x, i, j)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_all_pairs_up_to_exact_pairs_then_a_sample_weighted_to_the_whole() -> None:
    """Guards against the exact/sampled switch moved by one (5 images: 10 pairs, exact at
    exact_pairs = 10, sampled at 9), sampled weights that do not add up to the set's pairs
    (positives to its same-class pairs, the rest to the others), a sample not drawn from the
    configured seed, and `same` out of step with the labels."""
    rng = np.random.default_rng(4)
    labels = np.array(["b", "a", "b", "a", "c"])
    x = _unit_rows(rng, 5)
    exact = score_pairs(x, labels, CalibrationConfig(exact_pairs=10))
    assert exact.exact and len(exact.scores) == 10 and (exact.weights == 1).all()
    i, j = np.triu_indices(5, k=1)
    np.testing.assert_array_equal(exact.same, labels[i] == labels[j])
    config = CalibrationConfig(exact_pairs=9, sample_pairs=7, seed=5)
    sampled = score_pairs(x, labels, config)
    assert sampled.exact is False  # a bool: the record stores it
    assert sampled.weights.sum() == pytest.approx(10)
    assert sampled.weights[sampled.same].sum() == pytest.approx(2)  # a-a and b-b
    assert len(sampled.scores) == 2 + 7  # every positive pair fits the budget of 7
    again = score_pairs(x, labels, config)
    np.testing.assert_array_equal(again.scores, sampled.scores)
    other = score_pairs(x, labels, CalibrationConfig(exact_pairs=9, sample_pairs=7, seed=6))
    assert not np.array_equal(other.scores, sampled.scores)
    v = x.astype(np.float64)
    rows = {round(float(v[p] @ v[q]), 5): labels[p] == labels[q] for p, q in zip(i, j, strict=True)}
    for s, same in zip(sampled.scores, sampled.same, strict=True):
        assert rows[round(float(s), 5)] == same


def test_one_positive_pair_sampled_weighs_one_pair() -> None:
    """Guards against the positives' weight dividing by more than the pairs drawn when exactly
    one positive pair exists (weight 1, not 1/2)."""
    rng = np.random.default_rng(7)
    labels = np.array([0, 0, 1, 2, 3, 4])
    pairs = score_pairs(
        _unit_rows(rng, 6), labels, CalibrationConfig(exact_pairs=1, sample_pairs=4)
    )
    assert pairs.weights[pairs.same].tolist() == [1.0]
    assert pairs.weights[~pairs.same].sum() == pytest.approx(14)


def test_a_sampled_calibration_is_close_to_the_exact_one() -> None:
    """Guards against sampled weights that bias the threshold (the positives' or negatives'
    weight left at 1): 3,000 images of 30 classes, sampled with 40,000 pairs each way against
    all 4.5M pairs, within 0.01 of cosine and 0.02 of recall."""
    rng = np.random.default_rng(8)
    labels = rng.integers(0, 30, size=3000)
    centres = rng.normal(size=(30, 16))
    x = centres[labels] + rng.normal(scale=0.8, size=(3000, 16))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    exact = calibrate(x, labels, CalibrationConfig(precision=0.9, exact_pairs=5_000_000))
    sampled = calibrate(
        x, labels, CalibrationConfig(precision=0.9, exact_pairs=10, sample_pairs=40_000)
    )
    assert exact.exact and not sampled.exact
    assert exact.threshold is not None and sampled.threshold is not None
    assert sampled.threshold == pytest.approx(exact.threshold, abs=0.01)
    assert sampled.recall == pytest.approx(exact.recall, abs=0.02)


def _stored() -> dict:
    rng = np.random.default_rng(9)
    labels = np.repeat(np.arange(4), 5)
    x = np.repeat(_unit_rows(rng, 4, 8), 5, axis=0) + rng.normal(scale=0.3, size=(20, 8))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    return calibrate(x, labels, CalibrationConfig(precision=0.9), "val").to_dict()


def _made(**fields: object) -> Calibration:
    """A Calibration with hand-set fields (the rest as below)."""
    base = dict(
        precision=0.99,
        threshold=0.81234,
        recall=0.5,
        measured=0.991,
        split="test",
        images=1234,
        classes=7,
        pairs=760_761,
        exact=True,
        curve=(),
    )
    return Calibration(**(base | fields))  # type: ignore[arg-type]


def test_a_calibration_is_stored_with_its_curve_to_six_decimals() -> None:
    """Guards against the stored record's curve under another key (beside the tuples asdict
    gives) or rounded to other than six decimals (None rounds to an integer)."""
    cal = _made(curve=((0.12345678, 0.87654321, 0.55555555), (-0.5, 1.0, 0.0)))
    stored = cal.to_dict()
    assert set(stored) == {
        "format", "version", "precision", "threshold", "recall", "measured", "split", "images",
        "classes", "pairs", "exact", "curve",
    }  # fmt: skip
    assert stored["format"] == "pactl.calibration" and stored["version"] == 1
    assert stored["curve"] == [[0.123457, 0.876543, 0.555556], [-0.5, 1.0, 0.0]]
    assert all(isinstance(v, float) for point in stored["curve"] for v in point)


def test_float64_vectors_are_calibrated_as_their_float32_values() -> None:
    """Guards against float64 vectors scored in float64 (the module takes float32 vectors):
    the calibration of float64 vectors is that of the same vectors cast to float32, to the
    last bit of every curve point."""
    rng = np.random.default_rng(11)
    labels = rng.integers(0, 8, size=300)
    x = rng.standard_normal((8, 64))[labels] + rng.standard_normal((300, 64))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    config = CalibrationConfig(precision=0.9)
    assert calibrate(x, labels, config) == calibrate(x.astype(np.float32), labels, config)


def test_a_stored_calibration_reads_back_as_it_was() -> None:
    """Guards against a field read from the wrong key or dropped: every field equal after
    to_dict and read_calibration (the curve to its six stored decimals)."""
    stored = _stored()
    back = read_calibration(stored, "meta.json")
    assert back.to_dict() == stored
    assert back.split == "val" and back.exact is True and back.images == 20 and back.classes == 4


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"format": "other"}, "must be a mapping with 'format: pactl.calibration'"),
        ({"version": True}, "version must be a positive integer"),
        ({"version": 0}, "version must be a positive integer"),
        ({"version": "1"}, "version must be a positive integer"),
        ({"version": 2}, "written by a newer pactl"),
        ({"precision": 0.0}, "not in \\(0, 1\\]"),
        ({"precision": 1.5}, "not in \\(0, 1\\]"),
        ({"precision": True}, "is not a number"),
        ({"precision": "0.9"}, "is not a number"),
        ({"recall": -0.1}, "not in \\(0, 1\\]"),
        ({"threshold": 1.0002}, "is not a cosine"),
        ({"threshold": -1.0002}, "is not a cosine"),
        ({"threshold": False}, "is not a number"),
        ({"images": -1}, "is not a count"),
        ({"images": 2.0}, "is not a count"),
        ({"classes": True}, "is not a count"),
        ({"pairs": None}, "is not a count"),
        ({"measured": "x"}, "ValueError"),
        ({"curve": [[0.5, 1.5, 0.2]]}, "not in \\(0, 1\\]"),
        ({"curve": [[0.5, 0.9]]}, "ValueError"),
    ],
)
def test_a_damaged_calibration_gets_one_line_naming_it(change: dict, words: str) -> None:
    """Guards against a check that lets a damaged field through: each value out of its range
    or of the wrong type (a bool for a number) is refused with the place it was read from."""
    with pytest.raises(PactlError, match=words) as e:
        read_calibration(_stored() | change, "b/meta.json")
    assert str(e.value).startswith("b/meta.json: calibration")
    missing = _stored()
    del missing["split"]
    with pytest.raises(PactlError, match="KeyError"):
        read_calibration(missing, "b/meta.json")
    with pytest.raises(PactlError, match="must be a mapping"):
        read_calibration([_stored()], "b/meta.json")


def test_the_limits_a_stored_calibration_may_hold() -> None:
    """Guards against limits moved inwards: a recall and a curve precision of 0, a threshold of
    exactly -1 or 1 (and rounding just past, 1 + 1e-4), counts of 0, version 1, an integer
    precision of 1 and no threshold at all are valid records."""
    edge = _stored() | {
        "precision": 1,
        "recall": 0,
        "threshold": 1.0001,
        "pairs": 0,
        "curve": [[1.0, 1.0, 0.0], [-1.0, 0.0, 1.0], [-1.0001, 0.5, 1]],
    }
    back = read_calibration(edge, "m")
    assert back.precision == 1.0 and isinstance(back.precision, float)
    assert back.recall == 0.0 and back.threshold == 1.0001 and back.pairs == 0
    assert back.curve[2] == (-1.0001, 0.5, 1.0)
    assert read_calibration(_stored() | {"threshold": None}, "m").threshold is None


def test_describe_says_what_was_measured_and_what_it_gives() -> None:
    """Guards against the line's numbers or words out of place: hand-written lines for an
    exact calibration, a sampled one and one where no threshold reaches the target."""
    assert describe(_made()) == (
        "same-item threshold 0.8123: precision 0.9910 (target 0.99) at recall 0.5000, on all "
        "760,761 pairs of 1,234 test images in 7 classes"
    )
    assert describe(_made(exact=False, split="val", threshold=None, precision=0.995)) == (
        "no cosine threshold reaches precision 0.995 on a weighted sample of 760,761 pairs of "
        "1,234 val images in 7 classes"
    )


def test_same_item_threshold_given_calibrated_or_refused() -> None:
    """Guards against the source of a same-item threshold: a given threshold wins (and is
    refused with --precision, or outside [-1, 1], the limits themselves allowed), else the
    calibrated one at its own precision, or at another precision read from the curve; a bad
    precision, no calibration or an unreachable target get one line each."""
    stored = _stored()
    cal = read_calibration(stored, "m")
    assert same_item_threshold(stored, "b", threshold=0.5) == (0.5, "threshold 0.5 (given)")
    assert same_item_threshold(None, "b", threshold=-1.0)[0] == -1.0
    assert same_item_threshold(None, "b", threshold=1.0)[0] == 1.0
    with pytest.raises(UsageError, match="not both"):
        same_item_threshold(stored, "b", threshold=0.5, precision=0.9)
    for bad in (1.01, -1.01):
        with pytest.raises(UsageError, match="--threshold must be a cosine"):
            same_item_threshold(stored, "b", threshold=bad)
    t, line = same_item_threshold(stored, "b")
    assert cal.threshold is not None and t == cal.threshold
    assert line == (
        f"threshold {cal.threshold:.4f}, calibrated on the val classes: precision "
        f"{cal.measured:.4f} at recall {cal.recall:.4f} (target 0.9)"
    )
    low = cal.point_for(0.5)
    assert low is not None and low[0] < cal.threshold
    assert same_item_threshold(stored, "b", precision=0.5)[0] == low[0]
    assert same_item_threshold(stored, "b", precision=1.0)[0] == cal.point_for(1.0)[0]  # type: ignore[index]
    for bad in (0.0, 1.01):
        with pytest.raises(UsageError, match="--precision must be in"):
            same_item_threshold(stored, "b", precision=bad)
    with pytest.raises(UsageError, match="^b has no same-item calibration"):
        same_item_threshold(None, "b")
    with pytest.raises(PactlError, match="b/meta.json: calibration"):
        same_item_threshold({"format": "x"}, "b")
    never = stored | {"curve": [[0.9, 0.5, 0.1]], "precision": 0.99, "threshold": None}
    with pytest.raises(PactlError, match="no cosine threshold reaches precision 0.99 on the val"):
        same_item_threshold(never, "b")
