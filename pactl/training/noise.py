"""--label-noise: the training labels corrupted on purpose, seeded, as PRISM's protocol does
(Liu et al., CVPR 2021, "Noise-resistant Deep Metric Learning with Ranking-based Instance
Selection"), so that a loss's robustness can be measured on a user's own data.

symmetric: round(rate x N) training images, drawn without replacement, each get a label drawn
uniformly from the other training classes. small_cluster: classes are drawn in a seeded order
and each drawn class is cut into small groups (an eighth of the class, 2 images at least); every
group but one moves whole to another training class, drawn uniformly, until round(rate x N)
images have moved. PRISM clusters a class by pretrained features; the noise here is drawn
before any network exists, so its groups are random subsets of one class, which move together
as PRISM's do. Only the train part is touched: the validation classes are held out before and
the test split is never read. The run folder lists every changed row in noise.csv.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.rules import label_noise_parts

NOISE_FILE = "noise.csv"
COLUMNS = ("path", "label", "noisy_label", "group")
GROUPS_PER_CLASS = 8  # small_cluster: a class is cut into this many groups (one stays)
STREAM = 0x6E6F6973  # "nois": the noise's own random stream beside the run's other draws


@dataclass(frozen=True)
class Noise:
    """Corrupted labels: `labels` (N,) the new codes, `rows` the positions changed (ascending),
    `groups` (len(rows),) the small-cluster group of each changed row (-1: symmetric)."""

    labels: np.ndarray
    rows: np.ndarray
    groups: np.ndarray


def parse_noise(text: str) -> tuple[float, str]:
    """--label-noise's (rate, kind); one line when it is neither RATE nor RATE:KIND."""
    parts = label_noise_parts(text)
    if parts is None:
        raise PactlError(
            f"--label-noise {text!r}: give RATE or RATE:symmetric or RATE:small_cluster, with "
            "RATE from 0 and below 1"
        )
    return parts


def corrupt(labels: np.ndarray, rate: float, kind: str, seed: int) -> Noise:
    """`labels` (N,) class codes with `rate` of them changed as `kind` says, drawn from `seed`."""
    labels = np.asarray(labels, dtype=np.int64)
    rng = np.random.default_rng([seed, STREAM])
    count = round(rate * len(labels))
    if count == 0:
        return Noise(labels.copy(), np.empty(0, np.int64), np.empty(0, np.int64))
    if len(np.unique(labels)) < 2:
        raise PactlError("label noise needs at least 2 training classes to move labels between")
    if kind == "symmetric":
        return symmetric(labels, count, rng)
    return small_cluster(labels, count, rng)


def other_class(classes: np.ndarray, own: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each code in `own`, a class of `classes` (sorted) other than it, drawn uniformly."""
    position = np.searchsorted(classes, own)
    drawn = rng.integers(0, len(classes) - 1, size=len(own))
    return classes[drawn + (drawn >= position)]


def symmetric(labels: np.ndarray, count: int, rng: np.random.Generator) -> Noise:
    rows = np.sort(rng.choice(len(labels), size=count, replace=False))
    noisy = labels.copy()
    noisy[rows] = other_class(np.unique(labels), labels[rows], rng)
    return Noise(noisy, rows, np.full(count, -1, np.int64))


def small_cluster(labels: np.ndarray, count: int, rng: np.random.Generator) -> Noise:
    """Whole groups of one class moved to one other class each, classes drawn in a seeded
    order, until `count` images have moved (the last group cut to fit); fewer when every class
    has given all but its first group."""
    classes = np.unique(labels)
    noisy, group_of = labels.copy(), np.full(len(labels), -1, np.int64)
    moved, group = 0, 0
    for c in rng.permutation(classes):
        members = rng.permutation(np.flatnonzero(labels == c))
        size = max(2, math.ceil(len(members) / GROUPS_PER_CLASS))
        for start in range(size, len(members), size):  # the first group stays
            rows = members[start : start + size][: count - moved]
            noisy[rows] = other_class(classes, np.array([c]), rng)[0]
            group_of[rows] = group
            moved, group = moved + len(rows), group + 1
            if moved == count:
                break
        if moved == count:
            break
    rows = np.flatnonzero(noisy != labels)
    return Noise(noisy, rows, group_of[rows])


def with_label_noise(
    labels: np.ndarray,
    paths: tuple[str, ...],
    classes: list[str],
    spec: str,
    seed: int,
    run_dir: Path,
    reporter: Reporter,
    main: bool = True,
) -> np.ndarray:
    """The training labels (codes into `classes`) as the run trains on them: unchanged for a
    rate of 0, else corrupted and every change written to run_dir/noise.csv (path, the label,
    the noisy label, the group) by the main process."""
    from pactl.runs import writing_in
    from pactl.store.csv_cells import write_rows

    rate, kind = parse_noise(spec)
    if rate == 0:
        return labels
    noise = corrupt(labels, rate, kind, seed)
    if main:
        rows = (
            (paths[i], classes[labels[i]], classes[noise.labels[i]], int(g))
            for i, g in zip(noise.rows.tolist(), noise.groups.tolist(), strict=True)
        )
        with writing_in(run_dir):
            write_rows(run_dir / NOISE_FILE, COLUMNS, rows)
    short = "" if len(noise.rows) == round(rate * len(labels)) else " (all small_cluster can)"
    reporter.log(
        f"label noise {rate:.0%} {kind}: {counted(len(noise.rows), 'training label')} of "
        f"{len(labels):,} changed{short}, listed in {run_dir / NOISE_FILE}"
    )
    return noise.labels


def noise_record(run_dir: Path) -> dict[str, Any] | None:
    """provenance.json's account of a run's label noise: the changed rows' count and noise.csv's
    sha256 (None: the run's labels are as its data gives them)."""
    path = run_dir / NOISE_FILE
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return {
        "file": NOISE_FILE,
        "changed": max(0, data.count(b"\n") - 1),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def read_noise(run_dir: Path) -> dict[str, str]:
    """noise.csv as path -> noisy label (empty when the run has none)."""
    import csv
    import io

    from pactl.store.csv_cells import unescape_cell

    path = run_dir / NOISE_FILE
    if not path.is_file():
        return {}
    try:
        reader = csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"), newline=""))
        return {unescape_cell(r["path"]): unescape_cell(r["noisy_label"]) for r in reader}
    except (OSError, KeyError, csv.Error, UnicodeDecodeError) as e:
        raise PactlError(f"cannot read {path}: {e}") from None
