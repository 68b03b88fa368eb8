"""Acting on `pactl audit`'s findings: the clean manifest with the labels a person accepted
(--relabel), one image of each copy group (--keep-copies), the top findings for Label Studio and
FiftyOne, the findings with the set's fingerprint (--findings), and the noise rate that
`--drop-top auto` drops. Everything is read and checked before the first file is written, and
each file is written whole (atomically) or not at all. No image is touched.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pactl.audit import decisions
from pactl.audit.noise_rate import NoiseEstimate, estimate_noise
from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.verbs.audit import AuditResult, Finding, chosen_rows


@dataclass(frozen=True)
class Actions:
    """What a user asked done with the findings (None: not asked)."""

    manifest: Path | None = None
    drop: Path | None = None  # a CSV whose `path` column names rows to leave out
    drop_above: float | None = None
    drop_top: int | str | None = None  # N, or "auto": the estimated number of wrong labels
    relabel: Path | None = None  # a decisions file (pactl.audit.decisions)
    keep_copies: str | None = None  # first | largest | train
    findings: Path | None = None  # every list's rows as JSON Lines, with the fingerprint
    labelstudio: Path | None = None
    fiftyone: Path | None = None
    labelstudio_prefix: str = ""
    labelstudio_root: Path | None = None


def audit_fingerprint(result: AuditResult) -> str:
    """The audited set's fingerprint (pactl.audit.decisions.fingerprint)."""
    data = result.data
    labels = [data.names[c] for c in data.codes.tolist()]
    return decisions.fingerprint(data.paths, labels, data.splits)


def noise_estimate(result: AuditResult) -> NoiseEstimate:
    """The noise rate per label and overall (pactl.audit.noise_rate) from the audit's neighbours."""
    data = result.data
    labels = np.where(result.found >= 0, data.codes[np.maximum(result.found, 0)], -1)
    return estimate_noise(labels, data.codes, len(data.names))


def drop_count(result: AuditResult, drop_top: int | str | None, log: Reporter) -> int | None:
    """--drop-top's N: as given, or for `auto` the estimated number of wrong labels."""
    if drop_top != "auto":
        return None if drop_top is None else int(drop_top)
    rate = noise_estimate(result).overall
    n = int(round(rate * len(result.data)))
    log.log(f"--drop-top auto: {counted(n, 'label')} (the estimated noise rate {rate:.3f})")
    return n


def act(
    result: AuditResult, lists: Sequence[Sequence[Finding]], asked: Actions, log: Reporter
) -> None:
    """Check every input first (the decisions against this audit, the drops, the tasks' image
    references), then write each output asked for."""
    from pactl.interop.labelstudio import labelstudio_tasks, write_fiftyone
    from pactl.store.generations import atomic_write_text

    relabelled = read_relabels(result, asked.relabel) if asked.relabel is not None else {}
    drop = manifest_drops(result, asked, log) if asked.manifest is not None else None
    rows = list(lists[0]) if lists else []  # the suspected labels, most doubted first
    tasks = None
    if asked.labelstudio is not None:
        tasks = labelstudio_tasks(rows, asked.labelstudio_prefix, asked.labelstudio_root)
    if asked.manifest is not None and drop is not None:
        report_manifest(result, drop, relabelled, asked.manifest, log)
    if asked.findings is not None:
        write_findings(result, lists, asked.findings, log)
    if asked.labelstudio is not None and tasks is not None:
        atomic_write_text(asked.labelstudio, json.dumps(tasks, indent=1) + "\n")
        log.log(f"wrote {asked.labelstudio}: {counted(len(tasks), 'Label Studio task')}")
    if asked.fiftyone is not None:
        written = write_fiftyone(rows, asked.fiftyone)
        log.log(f"wrote {asked.fiftyone}: {counted(written, 'row')} for FiftyOne's CSVDataset")


def read_relabels(result: AuditResult, path: Path) -> dict[int, str]:
    """{row: new label} from a decisions file, refused where it does not fit this audit."""
    data = result.data
    labels = [data.names[c] for c in data.codes.tolist()]
    suggested = [data.names[c] if c >= 0 else "" for c in result.scores.suggested.tolist()]
    made = decisions.read_decisions(path)
    return decisions.relabel(made, path, data.paths, labels, suggested, audit_fingerprint(result))


def manifest_drops(result: AuditResult, asked: Actions, log: Reporter) -> np.ndarray:
    """The rows the manifest leaves out: --drop, --drop-above, --drop-top (N or auto), and all
    but one of each copy group (--keep-copies)."""
    top = drop_count(result, asked.drop_top, log)
    drop = chosen_rows(result, asked.drop, asked.drop_above, top)
    if asked.keep_copies is not None:
        pairs = [(c.row, c.other) for c in result.copies]
        groups = decisions.copy_groups(pairs, len(result.data))
        data = result.data
        copies = decisions.copy_drops(groups, asked.keep_copies, data.paths, data.splits)
        log.log(
            f"--keep-copies {asked.keep_copies}: one image of each of "
            f"{counted(len(groups), 'copy group')} kept, {counted(len(copies), 'row')} left out"
        )
        drop = np.union1d(drop, copies)
    return drop


def write_acted_manifest(
    result: AuditResult, drop: np.ndarray, labels: dict[int, str], out: Path
) -> int:
    """A manifest of every audited row but `drop`, each with its label (or the one `labels`
    gives it), absolute paths: returns the rows written."""
    from pactl.datasets import write_manifest

    data = result.data
    keep = np.setdiff1d(np.arange(len(data)), drop)
    if not len(keep):
        raise PactlError(f"dropping {counted(len(drop), 'row')} leaves nothing to write to {out}")
    named = [labels.get(i, data.names[data.codes[i]]) for i in keep.tolist()]
    rows = [
        (data.paths[i], name, data.splits[i], name)
        for i, name in zip(keep.tolist(), named, strict=True)
    ]
    write_manifest(out, rows)
    return len(rows)


def report_manifest(
    result: AuditResult, drop: np.ndarray, labels: dict[int, str], out: Path, log: Reporter
) -> None:
    kept = {i: v for i, v in labels.items() if i not in set(drop.tolist())}
    written = write_acted_manifest(result, drop, kept, out)
    log.log(
        f"wrote {out}: {counted(written, 'row')} ({counted(len(drop), 'row')} left out, "
        f"{counted(len(kept), 'label')} changed)"
    )


def write_findings(
    result: AuditResult, lists: Sequence[Sequence[Finding]], out: Path, log: Reporter
) -> None:
    """Every list's rows as audit's JSON Lines, each with `fingerprint` (the audited set's) and
    each neighbour's `path`, for `pactl serve --findings` and --relabel."""
    import io

    from rich.console import Console

    from pactl.output import FindingWriter
    from pactl.store.generations import atomic_write_text

    buffer = io.StringIO()
    FindingWriter(Console(file=io.StringIO()), buffer, "jsonl", False, False, log).write(
        [list(rows) for rows in lists]
    )
    mark, paths = audit_fingerprint(result), result.data.paths
    lines = [json.loads(line) | {"fingerprint": mark} for line in buffer.getvalue().splitlines()]
    for line in lines:  # each neighbour's path too, for the review page's pictures
        for near in line.get("neighbours") or []:
            near["path"] = paths[near["id"]]
    atomic_write_text(out, "".join(json.dumps(line) + "\n" for line in lines))
    log.log(f"wrote {out}: {counted(len(lines), 'finding')} (fingerprint {mark[:12]})")
