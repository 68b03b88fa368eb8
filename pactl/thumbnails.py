"""The thumbnail descriptor: whether two image files hold the same picture, whatever a network
thinks of their classes.

A metric network is trained to put every image of a class together, so it puts a resized copy
no nearer to its original than the original's class-mates. The thumbnail keeps the picture
instead: the image in grey, squeezed to a square of 4 x SIDE, blurred (a Gaussian of 1/28 of the
side: resampling and JPEG blocks fall below it), averaged down to SIDE x SIDE and its own mean
taken off. Images of a set share their layout (a centred garment, a glyph on white), which makes
raw thumbnails alike; the set's own thumbnails whiten them (Whitening: the set's mean taken off,
the DIMS main axes each scaled to unit spread), so that what sets one picture apart from the
others counts, and copies are compared by the cosine of their unit descriptors.
docs/audit.md gives the measurements behind SIDE, the blur and DIMS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.console import QUIET, Reporter
from pactl.images import ImageError, load_image

SIDE = 16  # the thumbnail's side in pixels
DIMS = 32  # whitened axes kept
FIT_SAMPLE = 20_000  # thumbnails the whitening is fitted on, at most
FLOOR = 1e-3  # spread added to each axis, as a share of the largest (noise is not detail)


def thumbnail(image: Any) -> np.ndarray:
    """(SIDE * SIDE,) float32: a PIL image in grey, blurred and averaged down, its mean taken
    off."""
    from PIL import Image, ImageFilter

    grey = image.convert("L").resize((4 * SIDE, 4 * SIDE), Image.Resampling.BOX)
    grey = grey.filter(ImageFilter.GaussianBlur(4 * SIDE / 28))
    x = np.asarray(grey.resize((SIDE, SIDE), Image.Resampling.BOX), dtype=np.float32).ravel()
    return x - x.mean()


def read_thumbnails(
    paths: Sequence[str | Path], reporter: Reporter = QUIET
) -> tuple[np.ndarray, np.ndarray]:
    """(N, SIDE * SIDE) float16 thumbnails of the images at `paths` (zeros where unreadable;
    half precision keeps 1,000,000 of them in 0.5 GiB), and (N,) bool: which were read."""
    thumbs = np.zeros((len(paths), SIDE * SIDE), dtype=np.float16)
    read = np.zeros(len(paths), dtype=bool)
    with reporter.bar("reading thumbnails", total=len(paths)) as advance:
        for i, path in enumerate(paths):
            try:
                thumbs[i] = thumbnail(load_image(path, target_size=4 * SIDE))
                read[i] = True
            except ImageError:
                pass
            advance(1)
    return thumbs, read


@dataclass(frozen=True)
class Whitening:
    """Thumbnails -> unit descriptors: less `mean`, onto `axes` (SIDE², d), over `spread`."""

    mean: np.ndarray
    axes: np.ndarray
    spread: np.ndarray

    def __call__(self, thumbs: np.ndarray) -> np.ndarray:
        """(N, d) float32 unit rows; an all-zero thumbnail (unread) stays zero."""
        x = ((thumbs.astype(np.float64) - self.mean) @ self.axes) / self.spread
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        x = np.where(np.any(thumbs != 0, axis=1, keepdims=True), x / np.maximum(norms, 1e-12), 0)
        return x.astype(np.float32)

    def words(self) -> str:
        return f"{SIDE}x{SIDE} grey thumbnails whitened to {len(self.spread)} axes"


def fit_whitening(
    thumbs: np.ndarray,
    rng: np.random.Generator,
    read: np.ndarray | None = None,
    dims: int = DIMS,
) -> Whitening:
    """The whitening of a set's thumbnails (N, SIDE²), fitted on at most FIT_SAMPLE of them
    drawn by `rng` among the rows `read` (N,) bool (every row when None)."""
    rows = np.arange(len(thumbs)) if read is None else np.flatnonzero(read)
    if len(rows) > FIT_SAMPLE:
        rows = np.sort(rng.choice(rows, FIT_SAMPLE, replace=False))
    x = thumbs[rows].astype(np.float64)
    mean = x.mean(axis=0)
    _, values, axes = np.linalg.svd(x - mean, full_matrices=False)
    keep = max(1, min(dims, int(np.sum(values > 1e-9 * max(values[0], 1e-12)))))
    spread = values[:keep] / np.sqrt(len(x))
    return Whitening(mean, axes[:keep].T, spread + FLOOR * max(float(spread[0]), 1e-12))
