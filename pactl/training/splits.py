"""The train, validation and test parts of a run's manifest: unreadable images left out
(checked once, before training), validation classes held out of the train classes.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pactl.config import TrainConfig
from pactl.console import QUIET, Reporter, counted
from pactl.datasets import Manifest
from pactl.errors import PactlError
from pactl.runs import writing_in


@dataclass
class Splits:
    train: Manifest
    val: Manifest  # validation classes (may be empty): they choose best.pt
    test: Manifest  # test, or query + gallery


SKIPPED_FILE = "skipped.csv"  # the images of a run's manifest whose headers cannot be read
SPLIT_FILE = "split.csv"  # each image's split in the run: a manifest `pactl train` reads back
SIGMAS = 2.0  # how many standard errors of their difference validation and test may differ by


def readable_rows(
    manifest: Manifest, run_dir: Path, reporter: Reporter, main: bool, shared: Path | None = None
) -> Manifest:
    """The manifest less the images whose header cannot be read (checked all at once before
    training, not met one by one when drawn), which are reported once: one warning, and
    run_dir/skipped.csv (path, reason) written by the main process. With `shared` (a sweep's
    cache folder), a check of the same files, unchanged since, is read from there."""
    from pactl.store.csv_cells import write_rows

    bad = unreadable_files(manifest.files(), reporter if main else QUIET, shared)
    if not bad:
        return manifest
    if main:
        with writing_in(run_dir):
            write_rows(run_dir / SKIPPED_FILE, ("path", "reason"), bad)
        path, reason = bad[0]
        reporter.warn(
            f"{counted(len(bad), 'unreadable image')} left out of training and evaluation "
            f"({path}: {reason}); all listed in {run_dir / SKIPPED_FILE}"
        )
    gone = {path for path, _ in bad}
    keep = [i for i, f in enumerate(manifest.files()) if str(f) not in gone]
    return dataclasses.replace(manifest.subset(keep), duplicates=manifest.duplicates)


def unreadable_files(
    files: list[Path], reporter: Reporter, shared: Path | None
) -> list[tuple[str, str]]:
    """images.unreadable_images, or its result for the same files stored under `shared`."""
    from pactl.images import unreadable_images
    from pactl.training import start_cache

    if shared is None:
        return unreadable_images(files, reporter)
    folder, key = shared / start_cache.HEADERS, start_cache.headers_key(files)
    found = start_cache.read_unreadable(folder, key)
    if found is not None:
        reporter.log(f"image headers: checked before for these {len(files):,} files")
        return found
    bad = unreadable_images(files, reporter)
    why = start_cache.write_unreadable(folder, key, bad)
    if why is not None:
        reporter.log(f"header check not shared: {why}")
    return bad


def check_splits(manifest: Manifest, cfg: TrainConfig, unreadable: int = 0) -> Splits:
    """Train, validation and test parts; without a `val` split in the manifest, a share
    (cfg.val_classes) of the train classes is held out as validation classes. `unreadable`:
    images already left out, named when too few are left for a batch."""
    train = manifest.select("train")
    val = manifest.select("val")
    if not len(val) and cfg.val_classes > 0:
        train, val = hold_out_classes(train, cfg.val_classes, cfg.seed)
    evaluation = manifest.select(*manifest.eval_splits())
    if len(np.unique(train.labels)) < 2:
        raise PactlError(f"{manifest.source}: the train split needs at least 2 classes")
    if len(evaluation) == 0:
        raise PactlError(f"{manifest.source}: the test split is empty")
    if cfg.batch_size > len(train):
        left = f", {unreadable:,} unreadable images left out" if unreadable else ""
        raise PactlError(
            f"--batch-size {cfg.batch_size} is larger than the train split "
            f"({counted(len(train), 'readable image' if unreadable else 'image')}{left}): "
            "give a smaller --batch-size"
        )
    return Splits(train, val, evaluation)


def class_names(part: Manifest, codes: np.ndarray) -> list[str]:
    """The names of the classes `codes` as the data gives them (a folder's name, the CSV's
    class_name or label), in the proxies' order: config.json and best.pt record these, never
    pactl's own 0..C-1 numbering, which a reader would take for the CSV's labels."""
    name = dict(zip(part.labels.tolist(), part.class_names, strict=True))
    return [name[c] for c in codes.tolist()]


def hold_out_classes(train: Manifest, share: float, seed: int) -> tuple[Manifest, Manifest]:
    """(train, val): round(share x classes) train classes, drawn with `seed`, become val.

    At least 2 classes on each side, or nothing is held out (val empty): Recall on one class
    is always 1, and the loss needs 2 classes to learn from.
    """
    classes = np.unique(train.labels)
    count = max(2, round(share * len(classes)))
    if len(classes) - count < 2:
        return train, train.subset([])
    rng = np.random.default_rng(seed)
    held = set(rng.choice(classes, size=count, replace=False).tolist())
    is_val = np.array([int(label) in held for label in train.labels])
    val = train.subset(np.flatnonzero(is_val).tolist())
    val = dataclasses.replace(val, splits=("val",) * len(val))
    return train.subset(np.flatnonzero(~is_val).tolist()), val


def write_split(splits: Splits, run_dir: Path) -> None:
    """run_dir/split.csv: `path,label,split` of every image the run trains, validates and tests
    on (absolute paths, class names), so the split is on record and `pactl train split.csv`
    trains on the same one."""
    from pactl.store.csv_cells import csv_text
    from pactl.store.generations import atomic_write_text

    rows = [
        (os.path.abspath(path), name, split)
        for part in (splits.train, splits.val, splits.test)
        for path, name, split in zip(part.files(), part.class_names, part.splits, strict=True)
    ]
    with writing_in(run_dir):
        atomic_write_text(run_dir / SPLIT_FILE, csv_text(("path", "label", "split"), rows))


def disagreement(metrics: dict[str, float], splits: Splits) -> str | None:
    """A line when validation and test Recall@1 differ by more than SIGMAS binomial standard
    errors of their difference (each Recall@1 a share of its queries): then best.pt is chosen
    on classes that do not represent the test ones. None when they agree or one is missing."""
    val, test = metrics.get("val_recall@1"), metrics.get("recall@1")
    queries = splits.test.select("query") if splits.test.has_split("query") else splits.test
    n_val, n_test = len(splits.val), len(queries)
    if val is None or test is None or not n_val or not n_test:
        return None
    error = float(np.sqrt(val * (1 - val) / n_val + test * (1 - test) / n_test))
    if abs(val - test) <= SIGMAS * max(error, 1e-12):
        return None
    return (
        f"validation Recall@1 {val:.3f} ({n_val:,} images) and test Recall@1 {test:.3f} "
        f"({n_test:,} queries) differ by {abs(val - test):.3f}, more than {SIGMAS:g} standard "
        f"errors ({SIGMAS * error:.3f}): the validation classes, which chose best.pt, do not "
        "represent the test classes; give a `val` split like the test (split.csv in the run "
        "folder lists the split) or more --val-classes"
    )
