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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pactl.audit import doubt
from pactl.audit.copies import Copy, CopyThreshold
from pactl.config import AUDIT_CENTRES_NAMES, AUDIT_SCORE_NAMES, check_options, setting
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
    device: str = setting("auto", device(), "Where a run's network embeds.")
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
    copies: list[Copy] = []
    threshold: CopyThreshold | None = None
    if config.copies:  # by the thumbnail descriptor, not the network's vectors
        from pactl.audit.copies import find_copies

        k, given = config.neighbours, config.copy_threshold
        workers = config.workers or min(os.cpu_count() or 1, 8)
        copies, threshold = find_copies(data, k, given, config.batch_size, reporter, workers)
    return AuditResult(data, scores, copies, threshold, witness, found, sims)


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


@dataclass(frozen=True)
class Finding:
    """One row of `pactl audit`'s output (pactl.output.FindingWriter)."""

    kind: str  # label | outlier | leak | conflict
    rank: int
    score: float
    path: str
    split: str
    label: str
    suggested: str = ""
    other: str = ""
    other_split: str = ""
    other_label: str = ""


def findings(result: AuditResult, top: int) -> list[list[Finding]]:
    """The four lists, each its first `top` rows (0: all): suspected labels by doubt, outliers,
    leaks and conflicts by likeness (their score)."""
    data, scores = result.data, result.scores

    def name(code: int) -> str:
        return data.names[code] if code >= 0 else ""

    def item(kind: str, rank: int, score: float, row: int, **more: str) -> Finding:
        label = name(int(data.codes[row]))
        return Finding(kind, rank, score, data.paths[row], data.splits[row], label, **more)

    labels = [
        item("label", r, scores.doubt[i], i, suggested=name(int(scores.suggested[i])))
        for r, i in enumerate(result.ranked(scores.doubt, top).tolist(), start=1)
    ]
    outliers = [
        item("outlier", r, scores.outlier[i], i)
        for r, i in enumerate(result.ranked(scores.outlier, top).tolist(), start=1)
    ]
    pairs: dict[str, list[Finding]] = {"leak": [], "conflict": []}
    for c in result.copies:
        kept = pairs[c.kind]
        if top and len(kept) >= top:
            continue
        other = c.other
        kept.append(
            item(
                c.kind, len(kept) + 1, c.score, c.row, other=data.paths[other],
                other_split=data.splits[other], other_label=name(int(data.codes[other])),
            )
        )  # fmt: skip
    return [labels, outliers, pairs["leak"], pairs["conflict"]]


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
