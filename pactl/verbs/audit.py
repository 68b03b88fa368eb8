"""`pactl audit`'s library side: ranked lists of the labels a set's classes and neighbours doubt,
of its outliers, and of its copies across splits or under two labels; a manifest without the
rows a user chose to drop. Nothing here deletes, moves or relabels an image.

Each item is scored in batches (pactl.audit.doubt): the classes' witness (its cosine to its own
class's mean without itself, or with --centres proxies to the run's proxy, against the other
classes'), the neighbours' witness (the share of its k nearest other items carrying its label),
their blend, the label they suggest instead, and how far it lies from every class and every
neighbour (outliers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.audit import doubt
from pactl.audit.checks import ImageChecks
from pactl.audit.classes import ClassView, class_view
from pactl.audit.classes import words as class_words
from pactl.audit.copies import Copy, CopyThreshold
from pactl.config import (
    AUDIT_CENTRES_NAMES,
    AUDIT_FEATURES_NAMES,
    AUDIT_SCORE_NAMES,
    check_options,
    setting,
)
from pactl.console import Reporter, counted
from pactl.errors import PactlError, UsageError
from pactl.rules import choice, device, flag, integer, number, optional, text
from pactl.verbs.audit_inputs import NO_PROXIES, Labelled


@dataclass(frozen=True)
class AuditConfig:
    source: str | None = setting(
        None, optional(text()), "The labelled images (default: the run's own data)."
    )
    score: str = setting("blend", choice(*AUDIT_SCORE_NAMES), "What ranks the suspected labels.")
    centres: str = setting(
        "means", choice(*AUDIT_CENTRES_NAMES), "What the classes' witness holds an item against."
    )  # means rank planted flips better: docs/audit.md
    neighbours: int = setting(doubt.NEIGHBOURS, integer(1, 1000), "Nearest other items asked.")
    copy_threshold: float | None = setting(
        None, optional(number(0, 1)), "Aligned likeness of copies; None: calibrated on the set."
    )
    copies: bool = setting(
        True, flag(), "Look for copies across splits and under two labels.", option="--no-copies"
    )
    checks: bool = setting(
        True, flag(), "Run the image checks (dark, bright, blurry, ...).", option="--no-checks"
    )
    device: str = setting("auto", device(), "Where a run's network embeds.")
    features: str = setting(
        "auto", choice(*AUDIT_FEATURES_NAMES),
        "What a label-free audit compares images by: pretrained (an ImageNet network's features), "
        "thumbnails, or auto (pretrained where its weights are here).",
    )  # fmt: skip  # pactl.audit.features
    weights: str | None = setting(
        None,
        optional(text()),
        "The pretrained features' weights file (default: the lite0 extra's).",
    )
    batch_size: int = setting(4096, integer(1), "Items scored at once.", cli=False)
    workers: int = setting(
        0, integer(0, 64),
        "Processes reading thumbnails, aligning copies (0: one per core, at most 8).",
    )  # fmt: skip


@dataclass
class Scores:
    """Per row: `doubt` of its label (ranks the suspects), each witness's share (NaN: none),
    the label suggested instead (a code, -1: none), and the outlier score."""

    doubt: np.ndarray
    classes: np.ndarray
    neighbours: np.ndarray
    suggested: np.ndarray
    outlier: np.ndarray


@dataclass
class AuditResult:
    data: Labelled
    scores: Scores
    copies: list[Copy]
    threshold: CopyThreshold | None
    witness: str  # what the classes' witness held items against, in words
    found: np.ndarray  # (N, k) each row's nearest other rows (-1: none), nearest first
    sims: np.ndarray  # (N, k) their cosines
    checks: ImageChecks | None = None  # the image checks (None: not run)
    classes: ClassView | None = None

    def ranked(self, values: np.ndarray, top: int) -> np.ndarray:
        """Rows by `values`, highest first (ties: the earlier row), the first `top` (0: all)."""
        order = np.lexsort((np.arange(len(values)), -values))
        return order[:top] if top else order


def audit(target: Path, config: AuditConfig, reporter: Reporter) -> AuditResult:
    """The audit of a run folder (its data embedded by its network) or a bundle."""
    from pactl.verbs.audit_inputs import read_bundle, read_run

    check_options(config, UsageError)
    if (target / "config.json").is_file():
        data = read_run(target, config.source, config.device, reporter, config.centres == "proxies")
    else:
        data = read_bundle(target, config.source, reporter)
    centres, witness = choose_centres(data, config)
    reporter.log(f"auditing {counted(len(data), 'labelled item')} of {data.what}: {witness}")
    scores, found, sims = score_rows(data, centres, config, reporter)
    view = class_view(data.codes, data.names, scores.doubt, scores.suggested)
    reporter.log(class_words(view))
    copies: list[Copy] = []
    threshold: CopyThreshold | None = None
    pictures = read_images(data.paths, config, reporter)
    checks = image_checks(pictures, reporter) if config.checks and pictures else None
    if config.copies:  # by the thumbnail descriptor, not the network's vectors
        from pactl.audit.copies import find_copies

        k, given, workers = config.neighbours, config.copy_threshold, worker_count(config)
        copies, threshold = find_copies(
            data, k, given, config.batch_size, reporter, workers, pictures
        )
    return AuditResult(data, scores, copies, threshold, witness, found, sims, checks, view)


def worker_count(config: AuditConfig) -> int:
    """--workers, or one process per core (at most 8)."""
    return config.workers or min(os.cpu_count() or 1, 8)


def read_images(paths: Sequence[str], config: AuditConfig, reporter: Reporter) -> Any:
    """The images' thumbnails and check measures, each image decoded once for the copies and the
    checks (pactl.audit.thumbnails.Pictures; the bases kept where crops are looked for), or None
    where neither is asked for."""
    from pactl.audit.copies import CROP_ITEMS
    from pactl.audit.thumbnails import read_pictures

    if not (config.copies or config.checks):
        return None
    bases = config.copies and len(paths) <= CROP_ITEMS
    return read_pictures(paths, reporter, bases, worker_count(config))


def image_checks(pictures: Any, reporter: Reporter) -> ImageChecks:
    """The image checks of the pictures read, and one line of what they found."""
    from pactl.audit.checks import run_checks, summary

    checks = run_checks(pictures.measures, pictures.read, pictures.reasons)
    reporter.log(summary(checks))
    return checks


def choose_centres(
    data: Labelled, config: AuditConfig
) -> tuple[tuple[doubt.ClassCentres | None, doubt.ClassCentres], str]:
    """(proxies or None, class means) and the words for them; --centres proxies on a network
    without proxies is one line."""
    if config.centres == "proxies" and data.proxies is None:
        raise UsageError(NO_PROXIES.format(what=data.what))
    means = class_means(data, config.batch_size)
    use = data.proxies if config.centres == "proxies" else None
    if use is None:
        return (None, means), "classes by their means (each item left out of its own)"
    return (use, means), (
        f"the network's proxies ({len(use.codes):,} trained classes), the class means for "
        "the others"
    )


def class_means(data: Labelled, batch_size: int) -> doubt.ClassCentres:
    """Every label's mean vector (unit), with the sums and counts that leave an item out."""
    sums: np.ndarray | None = None
    counts = np.bincount(data.codes, minlength=len(data.names)).astype(np.int64)
    for start in range(0, len(data), batch_size):
        rows = np.arange(start, min(start + batch_size, len(data)))
        q = data.vectors(rows).astype(np.float64)
        if sums is None:
            sums = np.zeros((len(data.names), q.shape[1]))
        order = np.argsort(data.codes[rows], kind="stable")
        codes = data.codes[rows][order]
        starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        sums[codes[starts]] += np.add.reduceat(q[order], starts, axis=0)
    if sums is None:
        raise PactlError(f"{data.what} holds no labelled items to audit")
    return doubt.mean_centres(sums, counts)


def score_rows(
    data: Labelled,
    centres: tuple[doubt.ClassCentres | None, doubt.ClassCentres],
    config: AuditConfig,
    reporter: Reporter,
) -> tuple[Scores, np.ndarray, np.ndarray]:
    """Every row's Scores, and its neighbours (N, k) and their cosines (for the copies)."""
    n, k = len(data), config.neighbours
    found = np.full((n, k), -1, dtype=np.int64)
    sims = np.full((n, k), -np.inf, dtype=np.float32)
    parts = {f: np.empty(n) for f in ("classes", "neighbours", "outlier")}
    suggested = np.full(n, -1, dtype=np.int64)
    with reporter.bar("scoring labels", total=n) as advance:
        for start in range(0, n, config.batch_size):
            rows = np.arange(start, min(start + config.batch_size, n))
            found[rows], sims[rows] = data.neighbours(rows, k)
            got = score_batch(data, rows, found[rows], sims[rows], centres)
            for name in parts:
                parts[name][rows] = got[name]
            suggested[rows] = got["suggested"]
            advance(len(rows))
    classes = parts["classes"] if config.score != "neighbours" else None
    neighbours = parts["neighbours"] if config.score != "classes" else None
    belief = doubt.blend(classes, neighbours)
    if config.score == "classes":  # no class opinion (a class of one): the neighbours'
        belief = np.where(np.isnan(belief), parts["neighbours"], belief)
    scores = Scores(
        1.0 - belief, parts["classes"], parts["neighbours"], suggested, parts["outlier"]
    )
    return scores, found, sims


def score_batch(
    data: Labelled,
    rows: np.ndarray,
    found: np.ndarray,
    sims: np.ndarray,
    centres: tuple[doubt.ClassCentres | None, doubt.ClassCentres],
) -> dict[str, np.ndarray]:
    """One batch's witnesses: the neighbours' share and majority, the classes' share (proxies
    for the items whose class has one, means for the rest) and nearest other class."""
    own = data.codes[rows]
    queries = np.asarray(data.vectors(rows), dtype=np.float32)
    valid = found >= 0
    labels = np.where(valid, data.codes[np.maximum(found, 0)], -1)
    majority = doubt.majority(labels, valid)
    classes, other, top = (
        np.full(len(rows), np.nan),
        np.full(len(rows), -1),
        np.full(len(rows), -1.0),
    )
    proxies, means = centres
    by_proxy = np.zeros(len(rows), bool) if proxies is None else proxies.positions(own) >= 0
    for use, chosen in ((proxies, by_proxy), (means, ~by_proxy)):
        if use is None or not chosen.any():
            continue
        many = len(use.codes) > doubt.EXACT_CLASSES  # then the neighbours' labels are asked
        candidates = np.column_stack([labels, own])[chosen] if many else None
        said = doubt.ask_classes(queries[chosen], own[chosen], use, candidates)
        classes[chosen], other[chosen], top[chosen] = said.share, said.other, said.top
    instead = np.where((majority >= 0) & (majority != own), majority, other)
    return {
        "classes": classes,
        "neighbours": doubt.neighbour_share(labels, valid, own),
        "suggested": instead.astype(np.int64),
        "outlier": 1.0 - np.fmax(top, np.where(valid[:, 0], sims[:, 0], -1.0)),
    }


def chosen_rows(
    result: AuditResult,
    drop_file: Path | None,
    drop_above: float | None,
    drop_top: int | None = None,
) -> np.ndarray:
    """The rows a user chose to drop: those a CSV names in its `path` column (audit's own csv
    output, edited, or any list), those whose doubt is at or above `drop_above`, and the
    `drop_top` most doubted."""
    drop = np.zeros(len(result.data), dtype=bool)
    if drop_above is not None:
        drop |= result.scores.doubt >= drop_above
    if drop_top:
        drop[result.ranked(result.scores.doubt, drop_top)] = True
    if drop_file is not None:
        named = read_paths(drop_file)
        at = {p: i for i, p in enumerate(result.data.paths)}
        unknown = [p for p in named if p not in at]
        if unknown:
            raise PactlError(
                f"{drop_file} names {counted(len(unknown), 'path')} the audit does not hold, "
                f"such as {unknown[0]!r}: give the paths as audit prints them"
            )
        drop[[at[p] for p in named]] = True
    return np.flatnonzero(drop)


def read_paths(path: Path) -> list[str]:
    """The `path` column of a CSV with a header."""
    import csv
    import io

    from pactl.store.csv_cells import unescape_cell

    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise PactlError(f"cannot read {path}: {e.strerror or e}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if "path" not in (reader.fieldnames or []):
        raise PactlError(f"{path} has no `path` column: give a CSV with a header naming `path`")
    return [unescape_cell(r["path"]) for r in reader if r.get("path")]


def write_clean_manifest(result: AuditResult, drop: np.ndarray, out: Path) -> int:
    """A manifest of every audited row but `drop`, with the labels audited (absolute paths):
    returns the rows written. The images themselves are never touched."""
    from pactl.datasets import write_manifest

    data = result.data
    keep = np.setdiff1d(np.arange(len(data)), drop)
    if not len(keep):
        raise PactlError(f"dropping {counted(len(drop), 'row')} leaves nothing to write to {out}")
    rows = [
        (data.paths[i], data.names[data.codes[i]], data.splits[i], data.names[data.codes[i]])
        for i in keep.tolist()
    ]
    write_manifest(out, rows)
    return len(rows)


Neighbour = tuple[int, str, float]  # an audited row's id, its label, its cosine


@dataclass(frozen=True)
class Finding:
    """One row of `pactl audit`'s output (pactl.output.FindingWriter), with its evidence: the
    row's `id` (its position among the audited items), for a suspected label the two witnesses'
    shares and the k nearest items, for a copy the box aligned on (shares of the sides of
    `box_in`'s image: path or other) and for every row the reason in words."""

    kind: str  # label | outlier | leak | conflict | copy | an image check (pactl.audit.checks)
    rank: int
    score: float
    path: str
    split: str
    label: str
    suggested: str = ""
    other: str = ""
    other_split: str = ""
    other_label: str = ""
    id: int = -1
    class_share: float = float("nan")
    neighbour_share: float = float("nan")
    neighbours: tuple[Neighbour, ...] = ()
    box: tuple[float, float, float, float] | None = None
    box_in: str = ""
    reason: str = ""


def findings(result: AuditResult, top: int) -> list[list[Finding]]:
    """The lists, each its first `top` rows (0: all): suspected labels by doubt, outliers,
    leaks and conflicts by likeness (their score), then each image check's images."""
    data, scores = result.data, result.scores

    def name(code: int) -> str:
        return data.names[code] if code >= 0 else ""

    def near(i: int) -> tuple[Neighbour, ...]:
        hits = zip(result.found[i].tolist(), result.sims[i].tolist(), strict=True)
        return tuple((j, name(int(data.codes[j])), round(s, 6)) for j, s in hits if j >= 0)

    def item(kind: str, rank: int, score: float, row: int, **more: Any) -> Finding:
        label = name(int(data.codes[row]))
        return Finding(kind, rank, score, data.paths[row], data.splits[row], label, id=row, **more)

    labels = [
        item(
            "label", r, scores.doubt[i], i, suggested=name(int(scores.suggested[i])),
            class_share=float(scores.classes[i]), neighbour_share=float(scores.neighbours[i]),
            neighbours=near(i), reason=doubt_reason(scores, i),
        )
        for r, i in enumerate(result.ranked(scores.doubt, top).tolist(), start=1)
    ]  # fmt: skip
    outliers = [
        item(
            "outlier", r, scores.outlier[i], i, neighbours=near(i),
            reason=f"nearest class or neighbour at cosine {1 - scores.outlier[i]:.4f}",
        )
        for r, i in enumerate(result.ranked(scores.outlier, top).tolist(), start=1)
    ]  # fmt: skip
    pairs = copy_findings(result.copies, top, item, lambda j: name(int(data.codes[j])), data)
    lists = [labels, outliers, pairs["leak"], pairs["conflict"]]
    if result.checks is not None:
        lists += check_findings(result.checks, top, item)
    return lists


def doubt_reason(scores: Scores, i: int) -> str:
    """A suspected label's evidence in words: each witness's belief in it."""
    parts = [
        f"{what} {value:.2f}"
        for what, value in (
            ("class share", scores.classes[i]), ("neighbour share", scores.neighbours[i])
        )
        if np.isfinite(value)
    ]  # fmt: skip
    return "label believed by " + (", ".join(parts) or "no witness")


def copy_findings(
    copies: list[Copy], top: int, item: Any, label_of: Any, data: Any
) -> dict[str, list[Finding]]:
    """The copies' rows by kind (leak, conflict, copy), each its first `top`, with the box the
    pair was aligned on and its likeness in words."""
    pairs: dict[str, list[Finding]] = {"leak": [], "conflict": [], "copy": []}
    for c in copies:
        kept = pairs[c.kind]
        if top and len(kept) >= top:
            continue
        other, box_in = c.other, {c.row: "path", c.other: "other"}.get(c.box_in, "")
        where = f" on a box of {box_in}'s image" if c.box is not None and box_in else ""
        kept.append(
            item(
                c.kind, len(kept) + 1, c.score, c.row, other=data.paths[other],
                other_split=data.splits[other], other_label=label_of(other), box=c.box,
                box_in=box_in, reason=f"aligned{where}: likeness {c.score:.4f}",
            )
        )  # fmt: skip
    return pairs


def check_findings(checks: ImageChecks, top: int, item: Any) -> list[list[Finding]]:
    """Each image check's list (pactl.audit.checks.NAMES order): the images it flags, the
    furthest past its threshold first, each its first `top`; score: the check's measure."""
    from pactl.audit.checks import NAMES, UNREADABLE

    lists = []
    for check in NAMES:
        rows = checks.ranked(check).tolist()
        rows = rows[:top] if top else rows
        lists.append(
            [
                item(
                    check, r, 0.0 if check == UNREADABLE else float(checks.values[check][i]), i,
                    reason=checks.reason(check, i),
                )
                for r, i in enumerate(rows, start=1)
            ]
        )  # fmt: skip
    return lists


SheetTile = tuple[str, str, float]  # pactl.report.SheetTile: path, caption's label, score


def sheet_rows(
    result: AuditResult, top: int, shown: int = 3
) -> list[tuple[SheetTile, list[SheetTile], list[SheetTile]]]:
    """The contact sheet's rows (pactl.report.suspect_sheet) for the `top` suspects: the image,
    then its `shown` nearest carrying the given label, then those carrying the suggested one.
    Each searched within its class, not among the image's k nearest overall: a suspect is one
    because its nearest carry other labels, so those would leave the given label's column empty."""
    data, scores = result.data, result.scores

    def nearest(i: int, code: int) -> list[SheetTile]:
        members = np.flatnonzero(data.codes == code)
        members = members[members != i]
        if code < 0 or not len(members):
            return []
        sims = data.vectors(members) @ data.vectors(np.array([i]))[0]  # (M,) cosines
        order = np.argsort(-sims, kind="stable")[:shown]
        return [
            (data.paths[j], data.names[code], float(sims[o]))
            for j, o in zip(members[order], order, strict=True)
        ]

    rows = []
    for i in result.ranked(scores.doubt, top).tolist():
        given, instead = int(data.codes[i]), int(scores.suggested[i])
        caption = f"{data.names[given]}→{data.names[instead] if instead >= 0 else '?'}"
        rows.append(
            (
                (data.paths[i], caption, float(scores.doubt[i])),
                nearest(i, given),
                nearest(i, instead),
            )
        )
    return rows


def sheet_notes(result: AuditResult, top: int) -> list[str]:
    """The evidence written on each of the `top` suspects' tiles of the contact sheet (rows as
    sheet_rows): the class share and the neighbour share behind its doubt."""
    scores = result.scores

    def short(value: float) -> str:
        return f"{value:.2f}".removeprefix("0") if np.isfinite(value) else "-"

    return [
        f"class {short(scores.classes[i])} nb {short(scores.neighbours[i])}"
        for i in result.ranked(scores.doubt, top).tolist()
    ]


def planted_report(result: AuditResult) -> str | None:
    """For a run trained with --label-noise: how well the ranking of its training rows (where
    the noise went) finds the labels it changed: AUROC, and precision among the top K (K the
    number changed)."""
    planted = result.data.planted
    if planted is None:
        return None
    train = np.array([s == "train" for s in result.data.splits])
    planted, doubted = planted[train], result.scores.doubt[train]
    if not planted.any() or planted.all():
        return None
    k = int(planted.sum())
    top = result.ranked(doubted, k)
    return (
        f"the {counted(k, 'label')} --label-noise changed, among the {train.sum():,} training "
        f"rows: AUROC {doubt.auroc(doubted, planted):.4f}, precision among the top {k:,} "
        f"{planted[top].mean():.4f}"
    )
