"""The cosine threshold at which "same class" reaches a target precision, from labelled vectors.

A pair of images is called "the same" when the cosine of their vectors is at least the
threshold. On held-out classes (never trained on) the pairs of one class are the positives and
the pairs of two classes the negatives; the threshold is the lowest at which the pairs above it
are still at least `precision` positives, so it keeps the most positives (the recall). Small
sets are measured on all pairs; large ones on every positive pair (or a sample of them) and a
uniform sample of the negative pairs, each weighted by how many pairs it stands for.

Vectors arrive as float32 numpy arrays, L2-normalised, so inner product is cosine similarity.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pactl.config import check_options, setting
from pactl.errors import PactlError, UsageError
from pactl.rules import MAX_SEED, integer, number

FORMAT = "pactl.calibration"
VERSION = 1
DEFAULT_PRECISION = 0.99
CURVE_STEP = 0.0025  # the stored precision-recall curve has a point every this much cosine


@dataclass(frozen=True)
class CalibrationConfig:
    precision: float = setting(
        DEFAULT_PRECISION, number(0, 1, above=True),
        "Share of \"same\" pairs above the threshold to reach.",
    )  # fmt: skip
    exact_pairs: int = setting(
        2_000_000, integer(0), "Measure all pairs of a set with at most this many.", cli=False
    )
    sample_pairs: int = setting(
        2_000_000, integer(1),
        "Else this many positive and this many negative pairs.", cli=False,
    )  # fmt: skip
    seed: int = setting(0, integer(0, MAX_SEED), "Draws the sampled pairs.", cli=False)


@dataclass(frozen=True)
class Calibration:
    precision: float  # the target precision
    threshold: float | None  # cosine at which pairs count as the same; None: nothing reaches it
    recall: float  # share of the same-class pairs at or above the threshold
    measured: float  # precision at the threshold (at least the target); 0.0 without one
    split: str  # the held-out classes it was measured on (val, test, ...)
    images: int
    classes: int
    pairs: int  # pairs scored (all of them when exact)
    exact: bool  # all pairs, or a weighted sample
    curve: tuple[tuple[float, float, float], ...]  # (threshold, precision, recall), descending

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, **asdict(self), "curve": self.curve_list()}

    def curve_list(self) -> list[list[float]]:
        return [[round(t, 6), round(p, 6), round(r, 6)] for t, p, r in self.curve]

    def point_for(self, precision: float) -> tuple[float, float, float] | None:
        """(threshold, precision, recall) for a target: the stored point for the calibrated
        target, else the lowest curve point that reaches `precision` (to within CURVE_STEP);
        None when no threshold reaches it."""
        if math.isclose(precision, self.precision):
            if self.threshold is None:
                return None
            return self.threshold, self.measured, self.recall
        precisions = np.array([p for _, p, _ in self.curve], dtype=np.float64)
        at = _deepest(precisions, precision)
        return None if at is None else self.curve[at]

    def threshold_for(self, precision: float) -> float | None:
        point = self.point_for(precision)
        return None if point is None else point[0]


@dataclass(frozen=True)
class ScoredPairs:
    scores: np.ndarray  # (P,) float32 cosine of each pair
    same: np.ndarray  # (P,) bool: both images of one class
    weights: np.ndarray  # (P,) float64: how many pairs of the set each stands for
    exact: bool


def calibrate(
    vectors: np.ndarray, labels: np.ndarray, config: CalibrationConfig, split: str = "test"
) -> Calibration:
    """The threshold and recall at `config.precision` on the pairs of a labelled set."""
    check_options(config)
    labels = np.asarray(labels)
    if len(vectors) != len(labels):
        raise ValueError(f"{len(vectors)} vectors for {len(labels)} labels")
    classes = len(np.unique(labels))
    if len(vectors) < 2 or classes == len(labels):
        raise PactlError(
            f"calibration needs two images of one class; the {split} split has "
            f"{len(labels)} images in {classes} classes"
        )
    pairs = score_pairs(np.asarray(vectors, dtype=np.float32), labels, config)
    thresholds, precision, recall = pr_points(pairs)
    at = _deepest(precision, config.precision)
    return Calibration(
        precision=config.precision,
        threshold=None if at is None else float(thresholds[at]),
        recall=0.0 if at is None else float(recall[at]),
        measured=0.0 if at is None else float(precision[at]),
        split=split,
        images=len(labels),
        classes=classes,
        pairs=len(pairs.scores),
        exact=pairs.exact,
        curve=curve(thresholds, precision, recall),
    )


def score_pairs(vectors: np.ndarray, labels: np.ndarray, config: CalibrationConfig) -> ScoredPairs:
    """All pairs i < j of a small set, else a weighted sample (see the module docstring)."""
    n = len(vectors)
    if n * (n - 1) // 2 <= config.exact_pairs:
        i, j = np.triu_indices(n, k=1)
        return ScoredPairs(
            pair_scores(vectors, i, j), labels[i] == labels[j], np.ones(len(i)), True
        )
    rng = np.random.default_rng(config.seed)
    _, codes, sizes = np.unique(labels, return_inverse=True, return_counts=True)
    pi, pj, positives = _positive_pairs(codes, sizes, config.sample_pairs, rng)
    ni, nj = _negative_pairs(codes, config.sample_pairs, rng)
    negatives = n * (n - 1) // 2 - positives
    i, j = np.concatenate([pi, ni]), np.concatenate([pj, nj])
    scores = pair_scores(vectors, i, j)
    weights = np.concatenate(
        [np.full(len(pi), positives / max(len(pi), 1)), np.full(len(ni), negatives / len(ni))]
    )
    return ScoredPairs(scores, codes[i] == codes[j], weights, exact=False)


PAIR_BLOCK = 16_384  # pairs scored at a time: two (block, D) float32 gathers, 64 MiB at D = 512


def pair_scores(vectors: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The cosine of each pair (i[p], j[p]) of unit rows, a block of pairs at a time: gathering
    the rows of millions of pairs at once would take gigabytes (4M pairs of 512-d rows: 16 GiB)."""
    scores = np.empty(len(i), dtype=np.float32)
    for start in range(0, len(i), PAIR_BLOCK):
        a, b = i[start : start + PAIR_BLOCK], j[start : start + PAIR_BLOCK]
        scores[start : start + len(a)] = np.einsum("pd,pd->p", vectors[a], vectors[b])
    return scores


def _positive_pairs(
    codes: np.ndarray, sizes: np.ndarray, budget: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int]:
    """Every same-class pair when there are at most `budget`, else `budget` drawn uniformly
    among them (a class in proportion to its pairs, then two distinct members); and how many
    same-class pairs the set has."""
    per_class = sizes * (sizes - 1) // 2
    total = int(per_class.sum())
    order = np.argsort(codes, kind="stable")  # members of class c: order[start[c]:start[c+1]]
    start = np.concatenate([[0], np.cumsum(sizes)])
    if total <= budget:
        firsts, seconds = [], []
        for c in np.flatnonzero(sizes > 1):
            a, b = np.triu_indices(int(sizes[c]), k=1)
            firsts.append(order[start[c] + a])
            seconds.append(order[start[c] + b])
        return np.concatenate(firsts), np.concatenate(seconds), total
    chosen = rng.choice(len(sizes), size=budget, p=per_class / total)
    a = rng.integers(0, sizes[chosen])
    b = rng.integers(0, sizes[chosen] - 1)
    b = b + (b >= a)  # a second member, never the first
    return order[start[chosen] + a], order[start[chosen] + b], total


def _negative_pairs(
    codes: np.ndarray, budget: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """`budget` pairs drawn uniformly among the pairs of two classes (by rejection)."""
    n = len(codes)
    firsts, seconds, found = [], [], 0
    while found < budget:
        i = rng.integers(0, n, size=2 * budget)
        j = rng.integers(0, n, size=2 * budget)
        keep = codes[i] != codes[j]
        firsts.append(i[keep])
        seconds.append(j[keep])
        found += int(keep.sum())
    return np.concatenate(firsts)[:budget], np.concatenate(seconds)[:budget]


def pr_points(pairs: ScoredPairs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision and recall of "score >= t" for each distinct pair score t, t descending."""
    order = np.argsort(-pairs.scores, kind="stable")
    scores = pairs.scores[order].astype(np.float64)
    weights = pairs.weights[order]
    tp = np.cumsum(np.where(pairs.same[order], weights, 0.0))
    taken = np.cumsum(weights)
    last_of_tie = np.append(scores[1:] != scores[:-1], True)  # a cut never splits equal scores
    positives = tp[-1]
    recall = tp / positives if positives > 0 else np.zeros_like(tp)
    return scores[last_of_tie], (tp / taken)[last_of_tie], recall[last_of_tie]


def _deepest(precision: np.ndarray, target: float) -> int | None:
    """The last (lowest-threshold) point whose precision reaches the target."""
    reached = np.flatnonzero(precision >= target - 1e-12)
    return int(reached[-1]) if len(reached) else None


def curve(
    thresholds: np.ndarray, precision: np.ndarray, recall: np.ndarray
) -> tuple[tuple[float, float, float], ...]:
    """The curve at every CURVE_STEP of cosine (the last point at or above each grid value)."""
    grid = np.arange(math.floor(thresholds[-1] / CURVE_STEP), math.ceil(thresholds[0] / CURVE_STEP))
    grid = (grid[::-1] + 1) * CURVE_STEP  # descending
    at = np.searchsorted(-thresholds, -grid, side="right") - 1  # last threshold >= grid value
    at = at[at >= 0]
    # Every cosine within one step (a collapsed network): no grid value has a point at or above
    # it, and the curve keeps its lowest point, so a plot and --precision still have one.
    at = np.unique(at) if at.size else np.array([len(thresholds) - 1])
    return tuple((float(thresholds[k]), float(precision[k]), float(recall[k])) for k in at.tolist())


def read_calibration(data: Any, where: str) -> Calibration:
    """A Calibration from its dict in a checkpoint or meta.json, every field checked."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PactlError(f"{where}: calibration must be a mapping with 'format: {FORMAT}'")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise PactlError(f"{where}: calibration version must be a positive integer")
    if version > VERSION:
        raise PactlError(f"{where}: calibration was written by a newer pactl; upgrade")
    try:
        cal = Calibration(
            precision=_unit(data["precision"]),
            threshold=None if data["threshold"] is None else _cosine(data["threshold"]),
            recall=_unit(data["recall"], zero=True),
            measured=float(data["measured"]),
            split=str(data["split"]),
            images=_count(data["images"]),
            classes=_count(data["classes"]),
            pairs=_count(data["pairs"]),
            exact=bool(data["exact"]),
            curve=tuple((_cosine(t), _unit(p, True), _unit(r, True)) for t, p, r in data["curve"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise PactlError(f"{where}: calibration is damaged ({type(e).__name__}: {e})") from None
    return cal


def _unit(value: Any, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r:.20} is not a number")
    if not (0.0 <= value <= 1.0) or (value == 0.0 and not zero):
        raise ValueError(f"{value} is not in (0, 1]")
    return float(value)


def _cosine(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r:.20} is not a number")
    if not -1.0 - 1e-4 <= value <= 1.0 + 1e-4:
        raise ValueError(f"{value} is not a cosine")
    return float(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r:.20} is not a count")
    return value


def describe(cal: Calibration) -> str:
    """One line: what was measured and what it gives."""
    how = "all" if cal.exact else "a weighted sample of"
    base = (
        f"{how} {cal.pairs:,} pairs of {cal.images:,} {cal.split} images in {cal.classes} classes"
    )
    if cal.threshold is None:
        return f"no cosine threshold reaches precision {cal.precision:g} on {base}"
    return (
        f"same-item threshold {cal.threshold:.4f}: precision {cal.measured:.4f} "
        f"(target {cal.precision:g}) at recall {cal.recall:.4f}, on {base}"
    )


NO_CALIBRATION = (
    "has no same-item calibration (its network is a backbone as published, not a trained "
    "run, or a checkpoint never calibrated): give --threshold T (a cosine, e.g. 0.9), or "
    "calibrate the checkpoint with `pactl eval --calibrate --checkpoint PATH`"
)


def same_item_threshold(
    calibration: dict[str, Any] | None,
    where: str,
    threshold: float | None = None,
    precision: float | None = None,
) -> tuple[float, str]:
    """The threshold a same-item search of `where` uses, and a line saying where it comes
    from: `threshold` as given, else the calibrated one (for `precision`, or for the precision
    it was calibrated at)."""
    if threshold is not None:
        if precision is not None:
            raise UsageError("give --threshold or --precision, not both")
        if not -1.0 <= threshold <= 1.0:
            raise UsageError(f"--threshold must be a cosine from -1 to 1, got {threshold}")
        return threshold, f"threshold {threshold:g} (given)"
    if precision is not None and not 0.0 < precision <= 1.0:
        raise UsageError(f"--precision must be in (0, 1], got {precision}")
    if calibration is None:
        raise UsageError(f"{where} {NO_CALIBRATION}")
    cal = read_calibration(calibration, f"{where}/meta.json")
    target = precision if precision is not None else cal.precision
    point = cal.point_for(target)
    if point is None:
        raise PactlError(
            f"no cosine threshold reaches precision {target:g} on the {cal.split} classes "
            f"{where} was calibrated on: ask for a lower --precision, or give --threshold"
        )
    t, reached, recall = point
    return t, (
        f"threshold {t:.4f}, calibrated on the {cal.split} classes: precision {reached:.4f} "
        f"at recall {recall:.4f} (target {target:g})"
    )
