"""Copies in a labelled set: a test image that is a copy of a training image (the classic
benchmark leak) and copies that carry two labels.

Pairs come from each item's nearest neighbours at or above a copy threshold. The threshold is
calibrated on copies the audit makes itself of a sample of the set's own images, each resized,
cropped, recompressed as JPEG, or all three (as a leaked image usually is), embedded by the
network that made the vectors: the cosine that COPY_RECALL of those copies reach with their
originals, raised (precision first) until at most COPY_APART of the set's items have a distinct
item (of another split or label) that close. A metric network is trained to put a class's images
together, so on small images of few details copies may sit no nearer than their class-mates:
stderr then says which kinds of copies are still found at the threshold.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.verbs.labelled import Labelled

COPY_SAMPLE = 256  # images copied to calibrate the threshold
COPY_RECALL = 0.98  # share of those copies at or above it
COPY_APART = 0.01  # most share of the set's items with a distinct item that close
CHANGES = ("resize", "crop", "jpeg", "all")


@dataclass(frozen=True)
class CopyThreshold:
    cosine: float
    how: str  # where it came from, in words
    distinct: float | None = None  # share of sampled images whose nearest other item reaches it


@dataclass(frozen=True)
class Copy:
    """Two items at or above the copy threshold: `row` and `other` (for a leak, the item outside
    the train split and the train item), their cosine, and what makes them worth a look."""

    row: int
    other: int
    score: float
    kind: str  # leak (across splits) | conflict (two labels)


def changed_copy(image: Any, change: str, rng: np.random.Generator) -> tuple[Any, str]:
    """A copy of a PIL image as a leak would change it: (image, file suffix to save it as)."""
    from PIL import Image

    w, h = image.size
    suffix = ".png"
    if change in ("crop", "all"):
        keep = rng.uniform(0.8, 0.95, size=2)
        cw, ch = max(1, round(w * keep[0])), max(1, round(h * keep[1]))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        image = image.crop((x, y, x + cw, y + ch))
    if change in ("resize", "all"):
        scale = rng.uniform(0.5, 0.8) if rng.random() < 0.5 else rng.uniform(1.25, 2.0)
        image = image.resize(
            (max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BICUBIC
        )
    if change in ("jpeg", "all"):
        suffix = ".jpg"
    return image.convert("RGB"), suffix


def write_copies(paths: list[str], folder: Path, seed: int) -> tuple[list[Path], list[int]]:
    """A changed copy of each readable image of `paths` in `folder`: (files, their positions)."""
    from pactl.images import ImageError, load_image

    rng = np.random.default_rng(seed)
    files, kept = [], []
    for i, path in enumerate(paths):
        try:
            image = load_image(Path(path))
        except ImageError:
            continue
        copy, suffix = changed_copy(image, CHANGES[i % len(CHANGES)], rng)
        out = folder / f"{i:05d}{suffix}"
        copy.save(out, quality=int(rng.integers(30, 71))) if suffix == ".jpg" else copy.save(out)
        files.append(out)
        kept.append(i)
    return files, kept


def calibrate_copies(
    data: Labelled, found: np.ndarray, sims: np.ndarray, seed: int = 0, reporter: Reporter = QUIET
) -> CopyThreshold:
    """The copy threshold: the cosine COPY_RECALL of the copies made of COPY_SAMPLE of the set's
    images reach, raised where needed until at most COPY_APART of the set's items have an item
    of another split or label that close among their neighbours `found` (N, k), `sims`: where a
    network puts copies no nearer than distinct images, precision first."""
    if data.network is None:
        raise PactlError(
            f"{data.what}: no network to embed copies with; give --copy-threshold COSINE"
        )
    rows, cosines, changes = copy_cosines(data, seed)
    reach = float(np.quantile(cosines, 1 - COPY_RECALL, method="lower"))
    apart = nearest_apart(data, np.arange(len(data)), found, sims)
    close = float(np.quantile(np.where(np.isfinite(apart), apart, -1.0), 1 - COPY_APART))
    cosine = max(reach, close)
    kept = ", ".join(f"{c} {np.mean(cosines[changes == c] >= cosine):.0%}" for c in CHANGES)
    how = (
        f"{cosine:.4f} cosine: {COPY_RECALL:.0%} of the copies made of {len(rows):,} of the set's "
        f"own images reach {reach:.4f}; {COPY_APART:.0%} of its items have an item of another "
        f"split or label at {close:.4f} or closer; copies found at {cosine:.4f}: {kept}"
    )
    reporter.log(f"copies: {how}")
    return CopyThreshold(cosine, how, float(np.mean(apart >= cosine)))


def copy_cosines(data: Labelled, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, the cosine of each row's made copy to it, the change that made it)."""
    from pactl.embed import embed_files
    from pactl.runtime import resolve_device

    model, network = data.network
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(len(data), size=min(COPY_SAMPLE, len(data)), replace=False))
    with tempfile.TemporaryDirectory(prefix="pactl-copies-") as tmp:
        files, kept = write_copies([data.paths[i] for i in sample.tolist()], Path(tmp), seed)
        done = embed_files(model, files, network.config, resolve_device("cpu"), QUIET)
    made = np.asarray(kept, dtype=np.int64)[done.rows]
    if len(made) < 2:
        raise PactlError(f"{data.what}: too few readable images to calibrate copies on")
    rows = sample[made]
    cosines = np.einsum("ij,ij->i", done.vectors, data.vectors(rows))
    return rows, cosines, np.array([CHANGES[i % len(CHANGES)] for i in made.tolist()])


def nearest_apart(
    data: Labelled, rows: np.ndarray, found: np.ndarray, sims: np.ndarray
) -> np.ndarray:
    """(B,) the cosine of each row's nearest item of another split or another label among its
    neighbours `found` (B, k), `sims` (-inf: none there)."""
    other = np.maximum(found, 0)
    splits = np.asarray(data.splits, dtype=object)
    apart = (data.codes[other] != data.codes[rows][:, None]) | (
        splits[other] != splits[rows][:, None]
    )
    return np.where((found >= 0) & apart, sims, -np.inf).max(axis=1)


def copy_pairs(data: Labelled, found: np.ndarray, sims: np.ndarray, threshold: float) -> list[Copy]:
    """The leaks and the conflicts among each row's neighbours `found` (N, k) at or above
    `threshold`, each pair once, highest cosine first."""
    rows = np.repeat(np.arange(len(found)), found.shape[1])
    other, score = found.ravel(), sims.ravel()
    keep = (other >= 0) & (score >= threshold)
    low, high = np.minimum(rows, other)[keep], np.maximum(rows, other)[keep]
    pair, first = np.unique(np.stack([low, high], axis=1), axis=0, return_index=True)
    pairs = zip(pair[:, 0].tolist(), pair[:, 1].tolist(), score[keep][first].tolist(), strict=True)
    copies = []
    splits = data.splits
    for a, b, s in pairs:
        if splits[a] and splits[b] and splits[a] != splits[b]:
            first, second = (b, a) if splits[a] == "train" else (a, b)
            copies.append(Copy(first, second, s, "leak"))
        if data.codes[a] != data.codes[b]:
            copies.append(Copy(a, b, s, "conflict"))
    return sorted(copies, key=lambda c: (-c.score, c.row, c.other))
