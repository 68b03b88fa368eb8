"""The image checks: dark, bright, blurry, low-information, odd size, odd aspect, grayscale
among colour, unreadable. Pure numpy on the pixels the thumbnails decode
(pactl.audit.thumbnails.read_pictures calls measure() on each image it reads), so an audit
decodes each image once.

Each check is a measure of the image (MEASURES, worked out at no more than CHECK_SIDE pixels a
side) and a threshold chosen on the set: the set's median, OUTLYING robust deviations (the
median absolute deviation x MAD_TO_SIGMA, at least the check's least spread) towards the
issue's side, on a log scale where the measure spreads by ratios. A set whose images are all
dark is not all flagged: a threshold is also never laxer than the check's bound, a value no
ordinary photo reaches (an image is dark only where its brightest 1% stays under 0.3), so an
image is flagged when it is both odd for its set and past the bound. docs/audit.md gives the
measurements behind the bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CHECK_SIDE = 128  # pixels a side the measures are taken at, at most (larger images shrunk)
OUTLYING = 3.0  # robust deviations from the set's median at which an image is odd
MAD_TO_SIGMA = 1.4826  # the median absolute deviation of a normal distribution x this: sigma
MEASURES = ("width", "height", "top_light", "bottom_light", "sharpness", "entropy", "colour")
SHARP_SIDE = 8  # pixels a side an image needs for its sharpness to be judged
COLOUR_FLOOR = 1e-3  # added before the log of the colour measure (a grey image's is 0)


@dataclass(frozen=True)
class Check:
    """One check: its measure (per image, from the set's MEASURES), whether a low value is the
    issue, the bound a threshold never passes, whether it spreads by ratios (log scale) and the
    least robust spread (on that scale) so that a set of identical values flags no small step."""

    name: str
    words: str  # the measure, for the reason in a row
    low: bool
    bound: float
    log: bool
    least_spread: float


CHECKS = (
    Check("dark", "brightest 1% of pixels at", True, 0.30, False, 0.02),
    Check("bright", "darkest 5% of pixels at", False, 0.70, False, 0.02),
    Check("blurry", "sharpness (Laplacian / grey spread)", True, 0.35, True, 0.05),
    Check("low_information", "grey entropy (bits)", True, 3.0, False, 0.1),
    Check("odd_size", "halvings from the set's median side", False, 2.0, False, 0.25),
    Check("odd_aspect", "long side / short side", False, 2.0, True, 0.05),
    Check("grayscale", "colour (mean channel spread)", True, 0.01, True, 0.1),
)
UNREADABLE = "unreadable"
NAMES = (*(c.name for c in CHECKS), UNREADABLE)


def measure(image: Any, size: tuple[int, int] | None = None) -> np.ndarray:
    """(len(MEASURES),) float32 of an RGB PIL image: its full `size` (width, height; default
    the image's own), the brightness of its brightest 1% and darkest 5% of pixels (0 to 1,
    luma), its sharpness, the entropy of its grey levels, its colour. One histogram of the grey
    levels gives the brightness and the entropy (an audit measures every image it reads)."""
    from PIL import Image

    width, height = size or image.size
    small = image
    if max(image.size) > CHECK_SIDE:
        scale = CHECK_SIDE / max(image.size)
        shape = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        small = image.resize(shape, Image.Resampling.BOX)
    rgb = np.asarray(small if small.mode == "RGB" else small.convert("RGB"))
    grey = np.asarray(small.convert("L"))
    counts = np.bincount(grey.ravel(), minlength=256)
    below = np.cumsum(counts)
    top, bottom = np.searchsorted(below, (0.99 * below[-1], 0.05 * below[-1])) / 255.0
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]  # elementwise: faster than a reduce
    spread = np.maximum(np.maximum(r, g), b) - np.minimum(np.minimum(r, g), b)
    colour = float(spread.mean()) / 255.0
    levels = np.arange(256.0)
    mean = float(levels @ counts) / below[-1]
    grey_spread = np.sqrt(max(float((levels - mean) ** 2 @ counts) / below[-1], 0.0))
    sharp = sharpness(grey.astype(np.float32), grey_spread)
    return np.array([width, height, top, bottom, sharp, bits(counts), colour], dtype=np.float32)


def sharpness(grey: np.ndarray, spread: float | None = None) -> float:
    """The standard deviation of the 4-neighbour Laplacian over the interior pixels, over the
    standard deviation of the grey levels: blur takes the fine detail out and leaves the spread,
    while a dim or low-contrast picture loses both alike. NaN where there is no spread (a blank
    image has no sharpness to judge) or under SHARP_SIDE pixels a side (too few to judge).
    `spread`: the grey levels' standard deviation, where known."""
    spread = float(grey.std()) if spread is None else spread
    if min(grey.shape) < SHARP_SIDE or spread < 1.0:
        return float("nan")
    laplacian = (
        grey[1:-1, :-2] + grey[1:-1, 2:] + grey[:-2, 1:-1] + grey[2:, 1:-1] - 4 * grey[1:-1, 1:-1]
    )
    return float(laplacian.std()) / spread


def entropy(grey: np.ndarray) -> float:
    """The entropy in bits of the histogram of 256 grey levels (0: one level, 8: all alike)."""
    return bits(np.bincount(np.clip(grey, 0, 255).astype(np.int64).ravel(), minlength=256))


def bits(counts: np.ndarray) -> float:
    """The entropy in bits of a histogram."""
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum()) + 0.0


def values_of(measures: np.ndarray) -> dict[str, np.ndarray]:
    """Each check's measure (N,) from the images' MEASURES (N, len(MEASURES)); NaN where a row
    is unread (all zero)."""
    m = measures.astype(np.float64)
    width, height = m[:, 0], m[:, 1]
    read = (width > 0) & (height > 0)
    side = np.sqrt(np.where(read, width * height, np.nan))
    middle = np.nanmedian(side) if read.any() else np.nan
    values = {
        "dark": m[:, 2],
        "bright": m[:, 3],
        "blurry": m[:, 4],
        "low_information": m[:, 5],
        "odd_size": np.abs(np.log2(side / middle)),
        "odd_aspect": np.maximum(width, height) / np.maximum(np.minimum(width, height), 1),
        "grayscale": m[:, 6],
    }
    return {name: np.where(read, v, np.nan) for name, v in values.items()}


@dataclass(frozen=True)
class Threshold:
    value: float  # the measure at or past which an image is flagged
    how: str  # how it was chosen, in words


def choose_threshold(check: Check, values: np.ndarray) -> Threshold:
    """The set's median OUTLYING robust deviations towards the issue (on a log scale where the
    check spreads by ratios), never laxer than the check's bound."""
    seen = values[np.isfinite(values)]
    if not len(seen):
        return Threshold(check.bound, f"{check.bound:.4g} (the bound: no image measured)")
    scaled = np.log(seen + COLOUR_FLOOR) if check.log else seen
    middle = float(np.median(scaled))
    spread = max(MAD_TO_SIGMA * float(np.median(np.abs(scaled - middle))), check.least_spread)
    edge = middle - OUTLYING * spread if check.low else middle + OUTLYING * spread
    odd = float(np.exp(edge) - COLOUR_FLOOR) if check.log else edge
    value = min(odd, check.bound) if check.low else max(odd, check.bound)
    sign = "-" if check.low else "+"
    median = float(np.exp(middle) - COLOUR_FLOOR) if check.log else middle
    return Threshold(
        value,
        f"{value:.4g}: the stricter of the set's median {median:.4g} {sign} {OUTLYING:g} robust "
        f"deviations{' (log scale)' if check.log else ''} = {odd:.4g} and the bound "
        f"{check.bound:.4g}",
    )


@dataclass(frozen=True)
class ImageChecks:
    """Each check's measure (N,) per image (NaN: not measured), its threshold and the images
    it flags (N,) bool; and why each unreadable image could not be read ('' where it was)."""

    values: dict[str, np.ndarray]
    thresholds: dict[str, Threshold]
    flagged: dict[str, np.ndarray]
    reasons: Sequence[str]

    def reason(self, name: str, row: int) -> str:
        """Why image `row` is flagged by check `name`, in words."""
        if name == UNREADABLE:
            return f"unreadable: {self.reasons[row]}"
        check = next(c for c in CHECKS if c.name == name)
        side = "at most" if check.low else "at least"
        return (
            f"{name}: {check.words} {self.values[name][row]:.4g}, {side} "
            f"{self.thresholds[name].value:.4g}"
        )

    def ranked(self, name: str) -> np.ndarray:
        """The rows check `name` flags, the furthest past its threshold first."""
        rows = np.flatnonzero(self.flagged[name])
        if name == UNREADABLE:
            return rows
        check = next(c for c in CHECKS if c.name == name)
        v = self.values[name][rows]
        return rows[np.lexsort((rows, v if check.low else -v))]


def run_checks(measures: np.ndarray, read: np.ndarray, reasons: Sequence[str]) -> ImageChecks:
    """The checks of a set from its images' MEASURES (N, len(MEASURES)), which were `read` (N,)
    bool, and why the others were not (`reasons`, one per image)."""
    values = values_of(np.where(read[:, None], measures, 0))
    thresholds, flagged = {}, {}
    for check in CHECKS:
        v = values[check.name]
        thresholds[check.name] = t = choose_threshold(check, v)
        with np.errstate(invalid="ignore"):
            flagged[check.name] = np.isfinite(v) & ((v <= t.value) if check.low else (v >= t.value))
    flagged[UNREADABLE] = ~read
    return ImageChecks(values, thresholds, flagged, reasons)


def summary(checks: ImageChecks) -> str:
    """One line: how many images each check flags, and at which threshold."""
    parts = [
        f"{name} {int(checks.flagged[name].sum()):,} (at {checks.thresholds[name].value:.3g})"
        for name in (c.name for c in CHECKS)
    ]
    parts.append(f"{UNREADABLE} {int(checks.flagged[UNREADABLE].sum()):,}")
    return "image checks: " + ", ".join(parts)
