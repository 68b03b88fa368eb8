"""Whether one image is a changed copy of another, pixel by pixel: the copy resized onto a box
of the original (box sizes near the one the descriptors proposed, every second one first, then
those around the best; at every offset), both blurred alike, placed where their grey levels
differ least, and the root-mean-square difference of that placement over the three colour
channels: grey alone would take a red shape and the same shape in blue (or any colour of the
same brightness) for copies.

Thumbnails propose candidates (pactl.audit.thumbnails); they cannot tell a copy from a look-alike
garment or glyph, whose silhouettes agree. Aligned at full size, a copy differs from its
original only by resampling and JPEG noise, which the blur takes down; a look-alike differs in
its detail and its grey levels, which stay. The blur grows with how much the copy was shrunk
(a copy at half size holds no detail finer than two of the original's pixels), and only the
template's inside is compared (a blur near the crop's edge sees what lies outside it in the
original). Images are compared at no more than WORK pixels a side.

likeness = 1 - RMS / 255: 1 for the same picture, lower the more the aligned pixels differ (for
grey pictures, the grey difference: each channel then holds it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pactl.audit.thumbnails import Box

WORK = 64  # longest side images are compared at, in pixels
# both images' Gaussian, in the original's pixels (more where the copy is smaller)
BLUR_PIXELS = 1.2
MARGIN = 2.0  # the template's edge left out, in blurs
REACH = 0.1  # box sizes tried each side of the proposed one, as a share of the side
LEAST = 0.7  # the smallest box tried, as a share of each side
# box sides tried first every STEP pixels, then each one within STEP of the best of those: a third
# of the sizes, and the same best but for a copy's likeness down by at most 0.005 (4 of 200 planted
# photo copies; docs/benchmarks/audit.md)
STEP = 2


def working(image: Any) -> Any:
    """A PIL image in RGB, shrunk to at most WORK pixels a side (its aspect kept)."""
    from PIL import Image

    colour = image.convert("RGB")
    if max(colour.size) > WORK:
        scale = WORK / max(colour.size)
        size = (max(1, round(colour.size[0] * scale)), max(1, round(colour.size[1] * scale)))
        colour = colour.resize(size, Image.Resampling.BOX)
    return colour


def blurred(image: Any, sigma: float) -> np.ndarray:
    """(H, W) for a grey image, (H, W, 3) for a colour one, float32."""
    from PIL import ImageFilter

    return np.asarray(image.filter(ImageFilter.GaussianBlur(sigma)), dtype=np.float32)


def least_rms(image: np.ndarray, template: np.ndarray) -> float:
    """The smallest root-mean-square difference of `template` (h, w) and a window of `image`
    (H >= h, W >= w), over every placement."""
    return best_placement(image, template)[0]


def best_placement(image: np.ndarray, template: np.ndarray) -> tuple[float, int, int]:
    """(least_rms, y, x): the root-mean-square difference of `template` (h, w) and the window
    of `image` at (y, x) where it is smallest (the first such, row by row)."""
    return Scene.of(image).place(template)


@dataclass(frozen=True)
class Scene:
    """An image (H, W) made ready for templates to be placed on it: its integral of squares and
    its spectrum, computed once for the many box sizes a pair tries.

    A placement's squared error is the window's sum of squares (from the integral) less twice
    its correlation with the template (by FFT) plus the template's own: every placement at
    once, where a sliding window's product over each placement cost most of an alignment of
    photos (165 box sizes a pair at WORK pixels)."""

    shape: tuple[int, int]
    squares: np.ndarray  # (H + 1, W + 1) sums of the squared values above and left
    spectrum: np.ndarray  # rfft2 of the values

    @classmethod
    def of(cls, image: np.ndarray) -> Scene:
        x = image.astype(np.float64)
        squares = np.zeros((x.shape[0] + 1, x.shape[1] + 1))
        squares[1:, 1:] = (x * x).cumsum(axis=0).cumsum(axis=1)
        return cls((x.shape[0], x.shape[1]), squares, np.fft.rfft2(x))

    def place(self, template: np.ndarray) -> tuple[float, int, int]:
        """best_placement of `template` (h <= H, w <= W) on this image."""
        h, w = template.shape
        t = template.astype(np.float64)
        total = self.squares
        windows = total[h:, w:] - total[:-h, w:] - total[h:, :-w] + total[:-h, :-w]
        full = np.fft.irfft2(self.spectrum * np.conj(np.fft.rfft2(t, s=self.shape)), s=self.shape)
        cross = full[: self.shape[0] - h + 1, : self.shape[1] - w + 1]  # placements not wrapped
        costs = windows - 2 * cross  # the squared error less t's own sum
        y, x = np.unravel_index(int(np.argmin(costs)), costs.shape)
        rms = np.sqrt(max(float(costs[y, x]) + float((t * t).sum()), 0.0) / (h * w))
        return float(rms), int(y), int(x)


def likeness(original: Any, copy: Any, box: Box) -> float:
    """1 - RMS/255 over the colour channels of `copy` placed on a box of `original` (PIL images
    at working size, grey or colour) whose sides are within REACH of `box`'s, at the size and
    offset where their grey levels differ least: sizes tried every STEP pixels a side first,
    then every size within STEP of the best of those."""
    search = SizeSearch(original.convert("L"), copy.convert("L"))
    widths = around(box[2] - box[0], original.size[0])
    heights = around(box[3] - box[1], original.size[1])
    best = search.best(coarse(widths), coarse(heights))
    if best is None:
        return 0.0
    near_w = range(max(best[1] - STEP + 1, widths.start), min(best[1] + STEP, widths.stop))
    near_h = range(max(best[2] - STEP + 1, heights.start), min(best[2] + STEP, heights.stop))
    best = search.best(near_w, near_h) or best
    return max(0.0, 1.0 - colour_rms(original, copy, *best[1:]) / 255.0)


def coarse(sides: range) -> list[int]:
    """Every STEP-th side from the first, and the last (an uncropped copy's own side)."""
    return sorted({*sides[::STEP], *sides[-1:]})


class SizeSearch:
    """The grey copy placed on the grey original at box sizes w x h, each size once."""

    def __init__(self, original: Any, copy: Any) -> None:
        self.original, self.copy = original, copy
        self.scenes: dict[float, Scene] = {}  # the original blurred, by blur
        self.tried: dict[tuple[int, int], tuple[float, int, int, int, int] | None] = {}

    def best(
        self, widths: Sequence[int], heights: Sequence[int]
    ) -> tuple[float, int, int, int, int] | None:
        """(rms, w, h, y, x) of the least RMS among these sizes (the first of ties, by w then
        h, as an exhaustive search takes it); None where none leaves a template to place."""
        found = [self.at(w, h) for w in widths for h in heights]
        return min((f for f in found if f is not None), default=None)

    def at(self, w: int, h: int) -> tuple[float, int, int, int, int] | None:
        from PIL import Image

        if (w, h) not in self.tried:
            sigma, margin = blur_of(w, h, *self.copy.size)
            if min(w, h) - 2 * margin < 2:
                self.tried[w, h] = None
                return None
            if sigma not in self.scenes:
                self.scenes[sigma] = Scene.of(blurred(self.original, sigma))
            placed = blurred(self.copy.resize((w, h), Image.Resampling.BICUBIC), sigma)
            rms, y, x = self.scenes[sigma].place(placed[margin : h - margin, margin : w - margin])
            self.tried[w, h] = (rms, w, h, y, x)
        return self.tried[w, h]


def blur_of(w: int, h: int, cw: int, ch: int) -> tuple[float, int]:
    """The Gaussian (in the original's pixels) for a copy of cw x ch placed on w x h, more
    where it was shrunk, and the template's margin left out for it."""
    sigma = BLUR_PIXELS * max(1.0, w / cw, h / ch)
    return sigma, int(np.ceil(MARGIN * sigma))


def colour_rms(original: Any, copy: Any, w: int, h: int, y: int, x: int) -> float:
    """The root-mean-square difference over the three channels of `copy` resized to w x h
    (its margin left out) and `original` at (y, x) of its blurred inside, both blurred alike."""
    from PIL import Image

    sigma, margin = blur_of(w, h, *copy.size)
    big = blurred(original.convert("RGB"), sigma).astype(np.float64)
    placed = blurred(copy.convert("RGB").resize((w, h), Image.Resampling.BICUBIC), sigma)
    inside = placed[margin : h - margin, margin : w - margin].astype(np.float64)
    window = big[y : y + inside.shape[0], x : x + inside.shape[1]]
    return float(np.sqrt(np.mean((window - inside) ** 2)))


def around(share: float, side: int) -> range:
    """Box sides in pixels within REACH of `share` of `side` (at least LEAST of it)."""
    reach = int(np.ceil(REACH * side))
    guess = round(share * side)
    return range(max(guess - reach, int(np.ceil(LEAST * side)), 1), min(guess + reach, side) + 1)


def likeness_of_pairs(pairs: Sequence[tuple[str, str, Box]]) -> np.ndarray:
    """The likeness of each (original's path, copy's path, proposed box); NaN where either image
    cannot be read. Images are read once each (a process pool's unit of work)."""
    from pactl.images import ImageError, load_image

    read: dict[str, Any] = {}

    def picture(path: str) -> Any:
        if path not in read:
            try:
                read[path] = working(load_image(path))
            except ImageError:
                read[path] = None
        return read[path]

    scores = np.full(len(pairs), np.nan)
    for n, (first, second, box) in enumerate(pairs):
        a, b = picture(first), picture(second)
        if a is not None and b is not None:
            scores[n] = likeness(a, b, box)
    return scores
