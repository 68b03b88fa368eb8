"""Copies in a labelled set: a test image that is a copy of a training image (the classic
benchmark leak) and copies that carry two labels.

Copies are found by the thumbnail descriptor (pactl.thumbnails), not by the network's embedding:
a metric network puts a class's images together, and on small images it puts a resized copy no
nearer to its original than the original's class-mates. Every audited image's descriptor goes
into a FAISS index of its own (pactl.verbs.labelled.exact_neighbours), searched in batches for
each row's nearest, and pairs at or above a cosine threshold are reported when they cross splits
or carry two labels. The threshold is calibrated on the set itself, precision first:

- recall: the cosine COPY_RECALL of the copies the audit makes of COPY_SAMPLE of the set's own
  images (resized, cropped, recompressed as JPEG, or all three) reach with their originals;
- precision: a pair within one split cannot be a leak across splits, so beyond the identical
  ones the neighbour pairs within splits stand for the distinct images that look alike (a
  planted or real leak is not among them); scaled by how many pairs cross splits against how
  many lie within them, they estimate how many of the pairs reported across splits are false.
  The threshold is the lowest cosine where that estimate is at most COPY_FALSE of the pairs
  reported. Without splits, the pairs under two labels stand for both (then only identical
  pictures are sure to be reported).

The higher of the two is used (identical pictures are always reported), and stderr says which
kinds of the copies made are found there.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.verbs.labelled import Labelled, exact_neighbours

COPY_SAMPLE = 256  # images copied to calibrate the threshold
COPY_RECALL = 0.98  # share of those copies at or above it
COPY_FALSE = 0.01  # most share of the reported pairs estimated false
IDENTICAL = 0.9999  # a descriptor cosine only the same picture reaches: always a copy
CHANGES = ("resize", "crop", "jpeg", "all")


@dataclass(frozen=True)
class CopyThreshold:
    cosine: float
    how: str  # where it came from, in words, with the descriptor that found the pairs


@dataclass(frozen=True)
class Copy:
    """Two items at or above the copy threshold: `row` and `other` (for a leak, the item outside
    the train split and the train item), their cosine, and what makes them worth a look."""

    row: int
    other: int
    score: float
    kind: str  # leak (across splits) | conflict (two labels)


Pairs = tuple[np.ndarray, np.ndarray, np.ndarray]  # (low row, high row, cosine), each pair once


@dataclass(frozen=True)
class Looks:
    """Every audited row's copy descriptor (unit rows, zero where unread) and the pairs of
    each row and its nearest other rows by it (pactl.verbs.copies.neighbour_pairs)."""

    describe: Any  # pactl.thumbnails.Whitening: thumbnails -> descriptors
    descriptors: np.ndarray
    pairs: Pairs


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


def find_copies(
    data: Labelled, k: int, given: float | None, batch_size: int, reporter: Reporter
) -> tuple[list[Copy], CopyThreshold | None]:
    """The leaks and conflicts among each row's `k` nearest by the thumbnail descriptor, at
    the `given` cosine or one calibrated on the set (none: too few images read)."""
    looks = look(data, k, batch_size, reporter)
    if looks is None:
        reporter.log("copies: not looked for (fewer than 2 of the images can be read)")
        return [], None
    if given is not None:
        threshold = CopyThreshold(given, f"{given:.4f} cosine (given)")
    else:
        threshold = calibrate_copies(data, looks, seed=0)
    reporter.log(
        f"copies by {looks.describe.words()} (not the network's embedding): {threshold.how}"
    )
    return copy_pairs(data, looks.pairs, threshold.cosine), threshold


def look(data: Labelled, k: int, batch_size: int, reporter: Reporter) -> Looks | None:
    """Every row's descriptor, and its k nearest through a FAISS index of them, in batches
    (None: fewer than 2 images read)."""
    from pactl.thumbnails import fit_whitening, read_thumbnails

    thumbs, read = read_thumbnails(data.paths, reporter)
    if read.sum() < 2:
        return None
    if not read.all():
        reporter.log(f"copies: {counted(int((~read).sum()), 'unreadable image')} left out")
    describe = fit_whitening(thumbs, np.random.default_rng(0), read)
    descriptors = np.zeros((len(data), len(describe.spread)), dtype=np.float32)
    for start in range(0, len(data), batch_size):
        descriptors[start : start + batch_size] = describe(thumbs[start : start + batch_size])
    del thumbs
    search = exact_neighbours(descriptors)
    found = np.full((len(data), k), -1, dtype=np.int64)
    sims = np.full((len(data), k), -np.inf, dtype=np.float32)
    for start in range(0, len(data), batch_size):
        rows = np.arange(start, min(start + batch_size, len(data)))
        found[rows], sims[rows] = search(rows, k)
    blank = ~np.any(descriptors != 0, axis=1)  # unread or uniform: matches nothing
    gone = (found < 0) | blank[np.maximum(found, 0)] | blank[:, None]
    pairs = neighbour_pairs(np.where(gone, -1, found), np.where(gone, -np.inf, sims))
    return Looks(describe, descriptors, pairs)


def calibrate_copies(data: Labelled, looks: Looks, seed: int = 0) -> CopyThreshold:
    """The copy threshold, precision first: the higher of the cosine COPY_RECALL of the copies
    made of the set's images reach and the lowest at which the pairs estimated false are at
    most COPY_FALSE of those reported (identical pictures always reported)."""
    rows, cosines, changes = made_copy_cosines(data, looks, seed)
    reach = float(np.quantile(cosines, 1 - COPY_RECALL, method="lower"))
    close, null = precise_cosine(data, looks.pairs)
    cosine = min(max(reach, close), IDENTICAL)
    kept = ", ".join(f"{c} {np.mean(cosines[changes == c] >= cosine):.0%}" for c in CHANGES)
    how = (
        f"{cosine:.4f} cosine: {COPY_RECALL:.0%} of the copies made of {len(rows):,} of the set's "
        f"own images reach {reach:.4f}; {null}; copies made found at {cosine:.4f}: {kept}"
    )
    return CopyThreshold(cosine, how)


def made_copy_cosines(
    data: Labelled, looks: Looks, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, the descriptor cosine of each row's made copy to it, the change that made it)."""
    from pactl.thumbnails import read_thumbnails

    rng = np.random.default_rng(seed)
    seen = np.flatnonzero(np.any(looks.descriptors != 0, axis=1))
    sample = np.sort(rng.choice(seen, size=min(COPY_SAMPLE, len(seen)), replace=False))
    with tempfile.TemporaryDirectory(prefix="pactl-copies-") as tmp:
        files, kept = write_copies([data.paths[i] for i in sample.tolist()], Path(tmp), seed)
        thumbs, read = read_thumbnails(files)
    made = np.asarray(kept, dtype=np.int64)[read]
    if len(made) < 2:
        raise PactlError(f"{data.what}: too few readable images to calibrate copies on")
    rows = sample[made]
    cosines = np.einsum("ij,ij->i", looks.describe(thumbs[read]), looks.descriptors[rows])
    return rows, cosines, np.array([CHANGES[i % len(CHANGES)] for i in made.tolist()])


def precise_cosine(data: Labelled, pairs: Pairs) -> tuple[float, str]:
    """The lowest cosine at which the pairs within one split (less the identical), scaled to the
    pairs across splits, are at most COPY_FALSE of the pairs across splits, among the neighbour
    `pairs`; with one split, the pairs under two labels stand for both. And the words for it."""
    low, high, score = pairs
    _, split = np.unique(np.asarray(data.splits, dtype=object), return_inverse=True)
    two = data.codes[low] != data.codes[high]
    across, possible = split[low] != split[high], possible_pairs(split)
    several = possible[0] > 0
    null = np.sort(score[~across & (score < IDENTICAL)] if several else score[two])
    reported = np.sort(score[across] if several else score[two])
    if not len(null):
        return -1.0, "no neighbour pairs within a split to estimate false pairs by"
    scale = possible[0] / possible[1] if several and possible[1] else 1.0
    candidates = np.unique(np.r_[reported, np.nextafter(null[-1], np.inf)])
    false = scale * (len(null) - np.searchsorted(null, candidates, side="left"))
    shown = len(reported) - np.searchsorted(reported, candidates, side="left")
    cosine = float(candidates[np.flatnonzero(false <= COPY_FALSE * shown)[0]])
    return cosine, (
        f"{counted(len(null), 'neighbour pair')} within {'a split' if several else 'two labels'}, "
        "not identical "
        f"(x{scale:.2f} for the pairs across splits), estimate at most {COPY_FALSE:.0%} of the "
        f"pairs reported false from {cosine:.4f} up"
    )


def neighbour_pairs(found: np.ndarray, sims: np.ndarray) -> Pairs:
    """(low row, high row, cosine) of each pair among the neighbours `found` (N, k: -1 where
    none) at `sims`, once."""
    rows = np.repeat(np.arange(len(found)), found.shape[1])
    other, score = found.ravel(), sims.ravel()
    keep = other >= 0
    pair = np.stack([np.minimum(rows, other)[keep], np.maximum(rows, other)[keep]], axis=1)
    pair, first = np.unique(pair, axis=0, return_index=True)
    return pair[:, 0], pair[:, 1], score[keep][first]


def possible_pairs(split: np.ndarray) -> tuple[int, int]:
    """How many pairs of rows cross splits, and how many share a split."""
    n = len(split)
    per_split = np.bincount(split).astype(np.int64)
    one_split = int((per_split * (per_split - 1)).sum() // 2)
    return n * (n - 1) // 2 - one_split, one_split


def copy_pairs(data: Labelled, pairs: Pairs, threshold: float) -> list[Copy]:
    """The leaks and the conflicts among the neighbour `pairs` at or above `threshold`, highest
    cosine first."""
    low, high, score = pairs
    keep = score >= threshold
    copies = []
    splits = data.splits
    for a, b, s in zip(low[keep].tolist(), high[keep].tolist(), score[keep].tolist(), strict=True):
        if splits[a] and splits[b] and splits[a] != splits[b]:
            first, second = (b, a) if splits[a] == "train" else (a, b)
            copies.append(Copy(first, second, s, "leak"))
        if data.codes[a] != data.codes[b]:
            copies.append(Copy(a, b, s, "conflict"))
    return sorted(copies, key=lambda c: (-c.score, c.row, c.other))
