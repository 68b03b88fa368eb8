"""The thumbnail descriptor: whether two image files hold the same picture, whatever a network
thinks of their classes, and the boxes a cropped copy's original is looked for in.

A metric network is trained to put every image of a class together, so it puts a resized copy
no nearer to its original than the original's class-mates. The thumbnail keeps the picture
instead: the image in grey, squeezed to a GRID x GRID base, blurred (a Gaussian of BLUR_SHARE of the
side: resampling and JPEG blocks fall below it), averaged over SIDE x SIDE cells of a box of it
(the whole image, or one of BOXES) and its own mean taken off. Images of a set share their
layout (a centred garment, a glyph on white), which makes raw thumbnails alike; the set's own
thumbnails whiten them (Whitening: the set's mean taken off, the DIMS main axes each scaled to
unit spread), so that what sets one picture apart from the others counts, and candidates are
compared by the cosine of their unit descriptors. A crop's thumbnail is near the thumbnail of
the same box of its original: BOXES covers crops of 80 to 100% of each side at steps of 5%.
docs/audit.md gives the measurements behind SIDE, the blur, DIMS and the boxes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.console import QUIET, Reporter
from pactl.images import ImageError, load_image

GRID = 64  # the blurred base's side in pixels
BLUR_SHARE = 1.5 / 28  # the base's Gaussian, as a share of its side
SIDE = 12  # the thumbnail's side in cells
DIMS = 48  # whitened axes kept
FIT_SAMPLE = 20_000  # thumbnails the whitening is fitted on, at most
FLOOR = 1e-3  # spread added to each axis, as a share of the largest (noise is not detail)
READ_CHUNK = 2_000  # images a process reads at once
READ_PARALLEL_FROM = 8_000  # images from which processes share the reading
Box = tuple[float, float, float, float]  # left, top, right, bottom, as shares of the sides
WHOLE: Box = (0.0, 0.0, 1.0, 1.0)


def crop_boxes() -> tuple[Box, ...]:
    """The whole image, then boxes of 80, 85, 90, 95 and 100% of each side (every pair), their
    centres moved by -7.5, -2.5, 2.5 and 7.5% of each side that they are shorter than (kept
    inside the image)."""
    keeps, shifts = (0.8, 0.85, 0.9, 0.95, 1.0), (-0.075, -0.025, 0.025, 0.075)
    boxes = [WHOLE]
    for kx in keeps:
        for ky in keeps:
            for dx in shifts if kx < 1 else (0.0,):
                for dy in shifts if ky < 1 else (0.0,):
                    x0 = min(max(0.5 + dx - kx / 2, 0.0), 1.0 - kx)
                    y0 = min(max(0.5 + dy - ky / 2, 0.0), 1.0 - ky)
                    box = (round(x0, 4), round(y0, 4), round(x0 + kx, 4), round(y0 + ky, 4))
                    if box not in boxes:
                        boxes.append(box)
    return tuple(boxes)


BOXES = crop_boxes()


def base(image: Any) -> np.ndarray:
    """(GRID, GRID) uint8: a PIL image in grey, squeezed to GRID x GRID and blurred."""
    from PIL import Image, ImageFilter

    grey = image.convert("L").resize((GRID, GRID), Image.Resampling.BOX)
    return np.asarray(grey.filter(ImageFilter.GaussianBlur(GRID * BLUR_SHARE)), dtype=np.uint8)


def integral(bases: np.ndarray) -> np.ndarray:
    """(n, GRID + 1, GRID + 1) float64 sums of each base (n, GRID, GRID) above and left of each
    pixel corner: any box's sum in four lookups."""
    total = np.zeros((len(bases), GRID + 1, GRID + 1), dtype=np.float64)
    total[:, 1:, 1:] = bases.astype(np.float64).cumsum(axis=1).cumsum(axis=2)
    return total


def box_thumbnails(
    bases: np.ndarray, box: Box = WHOLE, total: np.ndarray | None = None
) -> np.ndarray:
    """(n, SIDE * SIDE) float32: the mean of each of SIDE x SIDE cells of `box` of each base
    (n, GRID, GRID) (cell edges rounded to the base's pixels), each row's mean taken off;
    `total`: the bases' integral, where already made."""
    total = integral(bases) if total is None else total
    x = edges(box[0], box[2])
    y = edges(box[1], box[3])
    x0, x1, y0, y1 = x[:-1][None], x[1:][None], y[:-1][:, None], y[1:][:, None]
    sums = total[:, y1, x1] - total[:, y0, x1] - total[:, y1, x0] + total[:, y0, x0]
    cells = (sums / ((y1 - y0) * (x1 - x0))).reshape(len(total), -1).astype(np.float32)
    return cells - cells.mean(axis=1, keepdims=True)


def edges(low: float, high: float) -> np.ndarray:
    """SIDE + 1 cell edges between shares `low` and `high` of the base, in its pixels, each
    cell at least one pixel wide and inside the base."""
    step = np.arange(SIDE + 1)
    cuts = np.round(np.linspace(low * GRID, high * GRID, SIDE + 1)).astype(np.int64)
    cuts = np.maximum.accumulate(cuts - step) + step
    return cuts - max(0, int(cuts[-1]) - GRID)


def thumbnail(image: Any) -> np.ndarray:
    """(SIDE * SIDE,) float32: a PIL image's whole-image thumbnail."""
    return box_thumbnails(base(image)[None])[0]


@dataclass(frozen=True)
class Pictures:
    """What was read of each image: (N, SIDE²) float16 whole thumbnails (zeros where unread;
    half precision keeps 1,000,000 of them in 0.3 GiB), (N,) bool which were read, the
    (N, GRID, GRID) uint8 bases where they were kept (4 KiB an image), else None; the image
    checks' (N, len(MEASURES)) float32 measures (pactl.audit.checks, from the same decode) and
    why each unread image was not read ('' where it was)."""

    thumbs: np.ndarray
    read: np.ndarray
    bases: np.ndarray | None
    measures: np.ndarray
    reasons: tuple[str, ...]


def read_pictures(
    paths: Sequence[str | Path],
    reporter: Reporter = QUIET,
    keep_bases: bool = False,
    workers: int = 1,
) -> Pictures:
    """The whole thumbnails of the images at `paths` (and their bases, with `keep_bases`), read
    by `workers` processes from READ_PARALLEL_FROM images on (pactl.audit.processes)."""
    from functools import partial

    from pactl.audit.processes import in_chunks

    with reporter.bar("reading thumbnails", total=len(paths)) as advance:
        parts = in_chunks(
            partial(read_chunk, keep_bases=keep_bases), list(paths), READ_CHUNK, workers, advance,
            READ_PARALLEL_FROM,
        )  # fmt: skip
    if not parts:
        parts = [read_chunk([], keep_bases)]
    bases = [p.bases for p in parts if p.bases is not None]
    return Pictures(
        np.concatenate([p.thumbs for p in parts]),
        np.concatenate([p.read for p in parts]),
        np.concatenate(bases) if keep_bases else None,
        np.concatenate([p.measures for p in parts]),
        tuple(r for p in parts for r in p.reasons),
    )


def read_chunk(paths: Sequence[str | Path], keep_bases: bool) -> Pictures:
    """read_pictures of a few images, in this process."""
    from pactl.audit.checks import MEASURES, measure
    from pactl.images import FULL_SIZE

    thumbs = np.zeros((len(paths), SIDE * SIDE), dtype=np.float16)
    read = np.zeros(len(paths), dtype=bool)
    bases = np.zeros((len(paths), GRID, GRID), dtype=np.uint8) if keep_bases else None
    measures = np.zeros((len(paths), len(MEASURES)), dtype=np.float32)
    reasons = [""] * len(paths)
    for i, path in enumerate(paths):
        try:
            image = load_image(path, target_size=GRID)
        except ImageError as e:
            reasons[i] = e.reason
            continue
        b = base(image)
        measures[i] = measure(image, image.info.get(FULL_SIZE))
        thumbs[i] = box_thumbnails(b[None])[0]
        read[i] = True
        if bases is not None:
            bases[i] = b
    return Pictures(thumbs, read, bases, measures, tuple(reasons))


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
