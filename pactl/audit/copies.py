"""Copies in a labelled set: a test image that is a copy of a training image (the classic
benchmark leak) and copies that carry two labels.

Copies are found in two steps, neither by the network's embedding (a metric network puts a
class's images together, and on small images it puts a resized copy no nearer to its original
than the original's class-mates):

- proposed by the thumbnail descriptor (pactl.audit.thumbnails): every image's whole-image
  descriptor goes into a FAISS index (pactl.index.exact.cosine_index); each image's k nearest are
  candidates (k: audit's --neighbours, at least CANDIDATES), and so are the PER_BOX nearest of
  the descriptor of each of BOXES of each image (a crop of the image there), in sets of up to
  CROP_ITEMS images. Each copy keeps its k likeliest originals, and those whose cosine reaches
  the one PROPOSED of the copies the audit makes reach are aligned (the ALIGN_MOST likeliest
  where more do);
- accepted by aligning the two images pixel by pixel (pactl.audit.alignment): the likeness, 1 - the
  root-mean-square grey difference / 255 of the best placement.

Pairs at or above a likeness threshold are reported when they cross splits or carry two labels.
The threshold is calibrated on the set itself, precision first:

- recall: the likeness COPY_RECALL of the copies the audit makes of COPY_SAMPLE of the set's own
  images (resized, cropped, recompressed as JPEG, or all three) reach with their originals;
- precision: a pair within one split cannot be a leak across splits, so beyond the identical
  ones the aligned pairs within splits stand for the distinct images that look alike (a planted
  or real leak is not among them); scaled by how many pairs cross splits against how many lie
  within them, they estimate how many of the pairs reported across splits are false. The
  threshold is the lowest likeness where that estimate is at most COPY_FALSE of the pairs
  reported. Without splits, the pairs under two labels stand for both (then only identical
  pictures are sure to be reported).

The higher of the two is used (identical pictures are always reported), and stderr says which
kinds of the copies made are found there.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pactl.console import Reporter, counted
from pactl.errors import PactlError

COPY_SAMPLE = 256  # images copied to calibrate the threshold
COPY_RECALL = 0.98  # share of those copies at or above it
PROPOSED = 0.99  # share of those copies whose descriptor cosine a candidate must reach
COPY_FALSE = 0.01  # most share of the reported pairs estimated false
IDENTICAL = 0.9999  # a likeness only the same picture reaches: always a copy
CROP_ITEMS = 50_000  # sets up to this size are searched for crops, larger ones for whole copies
PER_BOX = 3  # nearest taken for each box of each image
CANDIDATES = 20  # likeliest originals kept for each image, at least
ALIGN_MOST = 200_000  # pairs aligned at most (the likeliest; ~2 ms each at 28 px, 17 on photos)
ALIGN_CHUNK = 500  # candidate pairs a process aligns at once
ALIGN_PARALLEL_FROM = 4_000  # candidate pairs from which processes share the alignment
CHANGES = ("resize", "crop", "jpeg", "all")


class CopySource(Protocol):
    """What the copy search reads of a labelled set: row i's image path, label code and split
    ('' unknown), and its name for messages (pactl.verbs.audit_inputs.Labelled is one)."""

    @property
    def paths(self) -> Sequence[str]: ...
    @property
    def codes(self) -> np.ndarray: ...
    @property
    def splits(self) -> Sequence[str]: ...
    @property
    def what(self) -> str: ...
    def __len__(self) -> int: ...


@dataclass(frozen=True)
class CopyThreshold:
    likeness: float  # the likeness at or above which two images are copies
    how: str  # where it came from, in words, with the descriptor that found the pairs


@dataclass(frozen=True)
class Copy:
    """Two items at or above the copy threshold: `row` and `other` (for a leak, the item outside
    the train split and the train item), their likeness, and what makes them worth a look; the
    box (left, top, right, bottom, shares of the sides) of `box_in`'s image the other one was
    aligned on (None: not known)."""

    row: int
    other: int
    score: float
    kind: str  # leak (across splits) | conflict (two labels) | copy (a set without either)
    box: tuple[float, float, float, float] | None = None
    box_in: int = -1


Pairs = tuple[np.ndarray, np.ndarray, np.ndarray]  # (low row, high row, likeness), each pair once


Found = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # originals, copies, cosines, boxes


@dataclass(frozen=True)
class Candidates:
    """Directed candidate pairs: `copy` may be `original` changed, its whole descriptor at
    `cosine` to that of BOXES[`box`] of `original` (each array (P,))."""

    original: np.ndarray
    copy: np.ndarray
    cosine: np.ndarray
    box: np.ndarray


@dataclass(frozen=True)
class Proposals:
    """Every audited row's whole-image descriptor (unit rows, zero where unread), the bases the
    boxes are cut from (None above CROP_ITEMS rows) and the candidate pairs."""

    describe: Any  # pactl.audit.thumbnails.Whitening: thumbnails -> descriptors
    descriptors: np.ndarray
    bases: np.ndarray | None
    candidates: Candidates


@dataclass(frozen=True)
class MadeCopies:
    """The copies the audit made of some rows: each row, its copy's best descriptor cosine to a
    box of it, its copy's likeness to it, and the change that made it (each (n,))."""

    rows: np.ndarray
    cosines: np.ndarray
    likeness: np.ndarray
    changes: np.ndarray


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
    data: CopySource,
    k: int,
    given: float | None,
    batch_size: int,
    reporter: Reporter,
    workers: int = 1,
    pictures: Any = None,
) -> tuple[list[Copy], CopyThreshold | None]:
    """The leaks and conflicts among the candidates proposed by the thumbnail descriptor and
    aligned (each image's k likeliest originals, at least CANDIDATES; by `workers` processes),
    at the `given` likeness or one calibrated on the set (none: too few images read);
    `pictures`: the images' thumbnails where already read (pactl.audit.thumbnails.Pictures)."""
    proposals = propose(data, max(k, CANDIDATES), batch_size, reporter, workers, pictures)
    if proposals is None:
        reporter.log("copies: not looked for (fewer than 2 of the images can be read)")
        return [], None
    return accepted_copies(data, proposals, given, reporter, workers)


def accepted_copies(
    data: CopySource,
    proposals: Proposals,
    given: float | None,
    reporter: Reporter,
    workers: int = 1,
    every: bool = False,
) -> tuple[list[Copy], CopyThreshold]:
    """find_copies' second step: the proposals aligned and accepted at the `given` likeness or
    one calibrated on the set; `every`: each pair accepted is reported (kind copy), for a set
    without labels or splits."""
    made = made_copies(data, proposals, seed=0)
    floor = proposal_floor(made, crops=proposals.bases is not None)
    pairs, originals, boxes = aligned_with_boxes(
        data, proposals.candidates, floor, reporter, workers
    )
    if given is not None:
        threshold = CopyThreshold(given, f"{given:.4f} likeness (given)")
    else:
        threshold = choose_copy_threshold(data, made, floor, pairs)
    crops = "whole images and crops" if proposals.bases is not None else "whole images only"
    reporter.log(
        f"copies proposed by {proposals.describe.words()} ({crops}; not the network's embedding), "
        f"{counted(len(pairs[0]), 'candidate pair')} at cosine {floor:.4f} or more (where "
        f"{PROPOSED:.0%} of the copies made are) aligned pixel by pixel: {threshold.how}"
    )
    copies = copy_pairs(data, pairs, threshold.likeness, every)
    return [with_box(c, pairs, originals, boxes) for c in copies], threshold


def with_box(copy: Copy, pairs: Pairs, originals: np.ndarray, boxes: np.ndarray) -> Copy:
    """`copy` with the box its pair was aligned on, from the aligned pairs (low, high sorted)."""
    from dataclasses import replace

    from pactl.audit.thumbnails import BOXES

    low, high = min(copy.row, copy.other), max(copy.row, copy.other)
    at = np.flatnonzero((pairs[0] == low) & (pairs[1] == high))
    if not len(at):
        return copy
    return replace(copy, box=BOXES[int(boxes[at[0]])], box_in=int(originals[at[0]]))


def proposal_floor(made: MadeCopies, crops: bool) -> float:
    """The cosine PROPOSED of the copies made reach (of the resized and recompressed ones only
    where crops are not looked for: a crop's whole-image cosine would only lower it)."""
    whole = np.full(len(made.changes), crops) | ~np.isin(made.changes, ("crop", "all"))
    cosines = made.cosines[whole] if np.any(whole) else made.cosines
    return float(np.quantile(cosines, 1 - PROPOSED, method="lower"))


def propose(
    data: CopySource,
    k: int,
    batch_size: int,
    reporter: Reporter,
    workers: int = 1,
    pictures: Any = None,
) -> Proposals | None:
    """Every row's descriptor (the images read by `workers` processes, unless `pictures` holds
    them already) and the candidate pairs: each row's k nearest whole images, and the PER_BOX
    nearest of each box of it (up to CROP_ITEMS rows, where `pictures` kept the bases), through
    a FAISS index of the whole descriptors, in batches (None: fewer than 2 images read)."""
    from pactl.audit.thumbnails import (
        BOXES,
        DIMS,
        box_thumbnails,
        fit_whitening,
        integral,
        read_pictures,
    )
    from pactl.index.exact import cosine_index

    if pictures is None:
        pictures = read_pictures(data.paths, reporter, len(data) <= CROP_ITEMS, workers)
    if pictures.read.sum() < 2:
        return None
    if not pictures.read.all():
        reporter.log(f"copies: {counted(int((~pictures.read).sum()), 'unreadable image')} left out")
    dims = min(DIMS, max(8, int(pictures.read.sum()) // 8))  # axes a small set can estimate
    describe = fit_whitening(pictures.thumbs, np.random.default_rng(0), pictures.read, dims)
    descriptors = np.zeros((len(data), len(describe.spread)), dtype=np.float32)
    for start in range(0, len(data), batch_size):
        descriptors[start : start + batch_size] = describe(
            pictures.thumbs[start : start + batch_size]
        )
    bases, read = pictures.bases, pictures.read
    blank = ~np.any(descriptors != 0, axis=1) | ~read  # unread or uniform: matches nothing
    nearest = cosine_index(descriptors)
    found: list[Found] = []
    for start in range(0, len(data), batch_size):
        rows = np.arange(start, min(start + batch_size, len(data)))
        sims, hits = nearest(descriptors[rows], k + 1)
        found.append(
            (hits, np.broadcast_to(rows[:, None], hits.shape), sims, np.zeros(hits.shape, np.int16))
        )
    if bases is not None:
        boxes = np.arange(1, len(BOXES))
        with reporter.bar("looking in crop boxes", total=len(data)) as advance:
            for start in range(0, len(data), batch_size):
                rows = np.arange(start, min(start + batch_size, len(data)))
                total = integral(bases[rows])
                boxed = np.concatenate(
                    [describe(box_thumbnails(bases[rows], BOXES[b], total)) for b in boxes]
                )  # (boxes x rows, d), box by box
                sims, hits = nearest(boxed, PER_BOX)
                owner = np.tile(rows, len(boxes))[:, None]
                box = np.repeat(boxes.astype(np.int16), len(rows))[:, None]
                found.append(
                    (
                        np.broadcast_to(owner, hits.shape),
                        hits,
                        sims,
                        np.broadcast_to(box, hits.shape),
                    )
                )
                advance(len(rows))
    return Proposals(describe, descriptors, bases, likeliest(found, blank, k))


def mean_nearest(
    rows: np.ndarray, hits: np.ndarray, sims: np.ndarray, blank: np.ndarray, k: int
) -> np.ndarray:
    """Each row's mean cosine `sims` (B, k + 1) to its first k `hits` (B, k + 1) that are
    neither itself nor `blank` (an outlier's is low)."""
    others = (hits != rows[:, None]) & (hits >= 0) & ~blank[np.maximum(hits, 0)]
    use = others & (np.cumsum(others, axis=1) <= k)
    return np.where(use, sims, 0).sum(axis=1) / np.maximum(use.sum(axis=1), 1)


def likeliest(found: list[Found], blank: np.ndarray, k: int) -> Candidates:
    """Each pair of `found` (originals, copies, cosines, boxes) once, at its best cosine, and
    each copy's k best originals; none where either row is `blank`, none of a row with itself.
    Rows are held as int32 and pairs sorted by one int64 key (20,000,000 pairs at 1,000,000
    images)."""
    parts = []
    for o, c, s, b in found:
        o, c, s, b = o.ravel(), c.ravel(), s.ravel(), b.ravel()
        keep = (o >= 0) & (c >= 0) & (o != c)
        keep &= ~blank[np.maximum(o, 0)] & ~blank[np.maximum(c, 0)]
        parts.append((o[keep].astype(np.int32), c[keep].astype(np.int32), s[keep], b[keep]))
    original = np.concatenate([o for o, _, _, _ in parts])
    copy = np.concatenate([c for _, c, _, _ in parts])
    cosine = np.concatenate([s for _, _, s, _ in parts]).astype(np.float32)
    box = np.concatenate([b for _, _, _, b in parts]).astype(np.int16)
    del parts
    best = best_of_each(copy.astype(np.int64) * len(blank) + original, cosine)
    order = best[np.lexsort((-cosine[best], copy[best]))]  # each copy's best originals first
    group = copy[order]
    starts = np.r_[0, np.flatnonzero(group[1:] != group[:-1]) + 1]
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    chosen = order[rank < k]
    return Candidates(
        original[chosen].astype(np.int64), copy[chosen].astype(np.int64), cosine[chosen],
        box[chosen].astype(np.int64),
    )  # fmt: skip


def best_of_each(key: np.ndarray, score: np.ndarray) -> np.ndarray:
    """The position of the highest `score` of each distinct `key` (int64; the first of ties),
    in increasing key order."""
    order = np.lexsort((-score, key))
    ordered = key[order]
    return order[np.r_[True, ordered[1:] != ordered[:-1]]]


def made_copies(data: CopySource, proposals: Proposals, seed: int) -> MadeCopies:
    """Copies made of COPY_SAMPLE of the rows read (write_copies), and how the two steps see
    each: its whole descriptor's best cosine to a box of its row (the whole image alone where
    no bases were kept), and its likeness aligned on that box."""
    from pactl.audit.alignment import likeness_of_pairs
    from pactl.audit.thumbnails import BOXES, box_thumbnails, integral, read_pictures

    rng = np.random.default_rng(seed)
    seen = np.flatnonzero(np.any(proposals.descriptors != 0, axis=1))
    sample = np.sort(rng.choice(seen, size=min(COPY_SAMPLE, len(seen)), replace=False))
    with tempfile.TemporaryDirectory(prefix="pactl-copies-") as tmp:
        files, kept = write_copies([data.paths[i] for i in sample.tolist()], Path(tmp), seed)
        pictures = read_pictures(files)
        made = np.asarray(kept, dtype=np.int64)[pictures.read]
        if len(made) < 2:
            raise PactlError(f"{data.what}: too few readable images to calibrate copies on")
        rows = sample[made]
        copied = proposals.describe(pictures.thumbs[pictures.read])
        if proposals.bases is None:
            cosines = np.einsum("ij,ij->i", copied, proposals.descriptors[rows])[None]
        else:
            bases = proposals.bases[rows]
            total = integral(bases)
            cosines = np.stack(
                [np.einsum("ij,ij->i", copied, proposals.describe(box_thumbnails(bases, b, total)))
                 for b in BOXES]
            )  # fmt: skip
        box = np.argmax(cosines, axis=0)
        made_files = [str(f) for f, ok in zip(files, pictures.read.tolist(), strict=True) if ok]
        alike = likeness_of_pairs(
            [(str(data.paths[r]), f, BOXES[b])
             for r, f, b in zip(rows.tolist(), made_files, box.tolist(), strict=True)]
        )  # fmt: skip
    changes = np.array([CHANGES[i % len(CHANGES)] for i in made.tolist()])
    return MadeCopies(rows, cosines.max(axis=0), alike, changes)


def aligned_pairs(
    data: CopySource, candidates: Candidates, floor: float, reporter: Reporter, workers: int = 1
) -> Pairs:
    """(low row, high row, likeness) of each candidate pair whose cosine reaches `floor` (the
    ALIGN_MOST likeliest where more do), once (its best of the two directions), aligned by
    `workers` processes (in this one below ALIGN_PARALLEL_FROM pairs); a pair with an unreadable
    image is left out."""
    return aligned_with_boxes(data, candidates, floor, reporter, workers)[0]


def aligned_with_boxes(
    data: CopySource, candidates: Candidates, floor: float, reporter: Reporter, workers: int = 1
) -> tuple[Pairs, np.ndarray, np.ndarray]:
    """aligned_pairs, and for each pair the row it was aligned as the original of and the
    position in BOXES of the box of it."""
    from pactl.audit.thumbnails import BOXES

    keep = np.flatnonzero(candidates.cosine >= floor)
    if len(keep) > ALIGN_MOST:
        reporter.log(
            f"copies: {len(keep):,} candidate pairs reach cosine {floor:.4f}; the "
            f"{ALIGN_MOST:,} likeliest are aligned"
        )
        keep = keep[np.argsort(-candidates.cosine[keep], kind="stable")[:ALIGN_MOST]]
    keep = keep[np.argsort(candidates.original[keep], kind="stable")]  # originals read once
    paths = data.paths
    items = [
        (str(paths[o]), str(paths[c]), BOXES[b])
        for o, c, b in zip(
            candidates.original[keep].tolist(),
            candidates.copy[keep].tolist(),
            candidates.box[keep].tolist(),
            strict=True,
        )
    ]
    scores = align(items, workers, reporter)
    first, second = candidates.original[keep], candidates.copy[keep]
    low, high, ok = np.minimum(first, second), np.maximum(first, second), np.isfinite(scores)
    low, high, scores = low[ok], high[ok], scores[ok]
    originals, boxes = first[ok], candidates.box[keep][ok]
    chosen = best_of_each(low * len(data) + high, scores)
    pairs = (low[chosen], high[chosen], scores[chosen].astype(np.float32))
    return pairs, originals[chosen], boxes[chosen]


def align(items: list[Any], workers: int, reporter: Reporter) -> np.ndarray:
    """pactl.audit.alignment.likeness_of_pairs over `items`, ALIGN_CHUNK at a time, in `workers`
    processes where there are ALIGN_PARALLEL_FROM items or more."""
    from pactl.audit.alignment import likeness_of_pairs
    from pactl.audit.processes import in_chunks

    with reporter.bar("aligning candidate pairs", total=len(items)) as advance:
        parts = in_chunks(
            likeness_of_pairs, items, ALIGN_CHUNK, workers, advance, ALIGN_PARALLEL_FROM
        )
    return np.concatenate(parts) if parts else np.zeros(0)


def choose_copy_threshold(
    data: CopySource, made: MadeCopies, floor: float, pairs: Pairs
) -> CopyThreshold:
    """The copy threshold, precision first: the higher of the likeness COPY_RECALL of the copies
    made of the set's images reach and the lowest at which the pairs estimated false are at
    most COPY_FALSE of those reported (identical pictures always reported)."""
    reach = float(np.quantile(made.likeness, 1 - COPY_RECALL, method="lower"))
    close, null = precise_likeness(data, pairs)
    likeness = min(max(reach, close), IDENTICAL)
    found = (made.likeness >= likeness) & (made.cosines >= floor)
    kept = ", ".join(f"{c} {np.mean(found[made.changes == c]):.0%}" for c in CHANGES)
    how = (
        f"{likeness:.4f} likeness: {COPY_RECALL:.0%} of the copies made of {len(made.rows):,} of "
        f"the set's own images reach {reach:.4f}; {null}; copies made found at {likeness:.4f}: "
        f"{kept}"
    )
    return CopyThreshold(likeness, how)


def precise_likeness(data: CopySource, pairs: Pairs) -> tuple[float, str]:
    """The lowest likeness at which the pairs within one split (less the identical), scaled to the
    pairs across splits, are at most COPY_FALSE of the pairs across splits, among the aligned
    `pairs`; with one split, the pairs under two labels stand for both. And the words for it."""
    low, high, score = pairs
    _, split = np.unique(np.asarray(data.splits, dtype=object), return_inverse=True)
    two = data.codes[low] != data.codes[high]
    across, possible = split[low] != split[high], possible_pairs(split)
    several = possible[0] > 0
    null = np.sort(score[~across & (score < IDENTICAL)] if several else score[two])
    reported = np.sort(score[across] if several else score[two])
    if not len(null):
        return -1.0, (
            "no aligned pairs known to be distinct (within a split, or under two labels) to "
            "estimate false pairs by"
        )
    scale = possible[0] / possible[1] if several and possible[1] else 1.0
    candidates = np.unique(np.r_[reported, np.nextafter(null[-1], np.inf)])
    false = scale * (len(null) - np.searchsorted(null, candidates, side="left"))
    shown = len(reported) - np.searchsorted(reported, candidates, side="left")
    likeness = float(candidates[np.flatnonzero(false <= COPY_FALSE * shown)[0]])
    return likeness, (
        f"{counted(len(null), 'aligned pair')} within {'a split' if several else 'two labels'}, "
        "not identical "
        f"(x{scale:.2f} for the pairs across splits), estimate at most {COPY_FALSE:.0%} of the "
        f"pairs reported false from {likeness:.4f} up"
    )


def possible_pairs(split: np.ndarray) -> tuple[int, int]:
    """How many pairs of rows cross splits, and how many share a split."""
    n = len(split)
    per_split = np.bincount(split).astype(np.int64)
    one_split = int((per_split * (per_split - 1)).sum() // 2)
    return n * (n - 1) // 2 - one_split, one_split


def copy_pairs(data: CopySource, pairs: Pairs, threshold: float, every: bool = False) -> list[Copy]:
    """The leaks and the conflicts among the aligned `pairs` at or above `threshold`, likeliest
    first; `every`: each pair there as a copy (a set without labels or splits)."""
    low, high, score = pairs
    keep = score >= threshold
    copies = []
    splits = data.splits
    for a, b, s in zip(low[keep].tolist(), high[keep].tolist(), score[keep].tolist(), strict=True):
        if every:
            copies.append(Copy(a, b, s, "copy"))
            continue
        if splits[a] and splits[b] and splits[a] != splits[b]:
            first, second = (b, a) if splits[a] == "train" else (a, b)
            copies.append(Copy(first, second, s, "leak"))
        if data.codes[a] != data.codes[b]:
            copies.append(Copy(a, b, s, "conflict"))
    return sorted(copies, key=lambda c: (-c.score, c.row, c.other))
