"""Whether one image is a changed copy of another, pixel by pixel: the copy resized onto a box
of the original (every box size near the one the descriptors proposed, at every offset), both
blurred alike, and the root-mean-square grey difference of the best placement.

Thumbnails propose candidates (pactl.audit.thumbnails); they cannot tell a copy from a look-alike
garment or glyph, whose silhouettes agree. Aligned at full size, a copy differs from its
original only by resampling and JPEG noise, which the blur takes down; a look-alike differs in
its detail and its grey levels, which stay. The blur grows with how much the copy was shrunk
(a copy at half size holds no detail finer than two of the original's pixels), and only the
template's inside is compared (a blur near the crop's edge sees what lies outside it in the
original). Images are compared at no more than WORK pixels a side.

likeness = 1 - RMS / 255: 1 for the same picture, lower the more the aligned pixels differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pactl.audit.thumbnails import Box

WORK = 64  # longest side images are compared at, in pixels
# both images' Gaussian, in the original's pixels (more where the copy is smaller)
BLUR_PIXELS = 1.2
MARGIN = 2.0  # the template's edge left out, in blurs
REACH = 0.1  # box sizes tried each side of the proposed one, as a share of the side
LEAST = 0.7  # the smallest box tried, as a share of each side


def working(image: Any) -> Any:
    """A PIL image in grey, shrunk to at most WORK pixels a side (its aspect kept)."""
    from PIL import Image

    grey = image.convert("L")
    if max(grey.size) > WORK:
        scale = WORK / max(grey.size)
        size = (max(1, round(grey.size[0] * scale)), max(1, round(grey.size[1] * scale)))
        grey = grey.resize(size, Image.Resampling.BOX)
    return grey


def blurred(image: Any, sigma: float) -> np.ndarray:
    from PIL import ImageFilter

    return np.asarray(image.filter(ImageFilter.GaussianBlur(sigma)), dtype=np.float32)


def least_rms(image: np.ndarray, template: np.ndarray) -> float:
    """The smallest root-mean-square difference of `template` (h, w) and a window of `image`
    (H >= h, W >= w), over every placement."""
    from numpy.lib.stride_tricks import sliding_window_view

    h, w = template.shape
    windows = sliding_window_view(image.astype(np.float64), (h, w))
    t = template.astype(np.float64)
    squares = np.einsum("ijkl,ijkl->ij", windows, windows)
    cross = np.einsum("ijkl,kl->ij", windows, t)
    return float(
        np.sqrt(max(float((squares - 2 * cross).min()) + float((t * t).sum()), 0.0) / (h * w))
    )


def likeness(original: Any, copy: Any, box: Box) -> float:
    """1 - RMS/255 of `copy` placed on a box of `original` (PIL images, grey, working size)
    whose sides are within REACH of `box`'s, at the best size and offset."""
    from PIL import Image

    width, height = original.size
    cw, ch = copy.size
    sizes = [
        (w, h) for w in around(box[2] - box[0], width) for h in around(box[3] - box[1], height)
    ]
    best = np.inf
    seen: dict[float, np.ndarray] = {}
    for w, h in sizes:
        sigma = BLUR_PIXELS * max(1.0, w / cw, h / ch)
        margin = int(np.ceil(MARGIN * sigma))
        if min(w, h) - 2 * margin < 2:
            continue
        if sigma not in seen:
            seen[sigma] = blurred(original, sigma)
        placed = blurred(copy.resize((w, h), Image.Resampling.BICUBIC), sigma)
        best = min(best, least_rms(seen[sigma], placed[margin : h - margin, margin : w - margin]))
    return 0.0 if not np.isfinite(best) else max(0.0, 1.0 - best / 255.0)


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
