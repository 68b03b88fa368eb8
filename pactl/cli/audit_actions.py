"""`pactl audit`'s options for acting on its findings (pactl.verbs.audit_actions): --relabel,
--keep-copies, --drop-top auto, --findings, --labelstudio and --fiftyone, checked before any
work, and the audit card printed at the end."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from pactl.cli.options import check_new_file, check_output
from pactl.errors import UsageError

if TYPE_CHECKING:
    from pactl.console import Reporter
    from pactl.verbs.audit import AuditResult
    from pactl.verbs.audit_actions import Actions


class KeepCopies(str, Enum):
    """--keep-copies: which image of a copy group stays (pactl.audit.decisions.kept_copy)."""

    first = "first"
    largest = "largest"
    train = "train"


def drop_top_value(text: str | None) -> int | str | None:
    """--drop-top N (a whole number from 1) or `auto`."""
    if text is None or text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--drop-top {text!r}: a number of labels from 1, or auto")
    return int(text)


def check_actions(asked: Actions, overwrite: bool, inputs: Sequence[Path]) -> None:
    """The files asked for, each one that can be written and none of the audit's inputs;
    --relabel and --keep-copies only with --write-manifest."""
    if asked.manifest is None and (asked.relabel is not None or asked.keep_copies is not None):
        raise UsageError("--relabel and --keep-copies change the rows of --write-manifest: give it")
    for path, option in (
        (asked.findings, "--findings"),
        (asked.labelstudio, "--labelstudio"),
        (asked.fiftyone, "--fiftyone"),
    ):
        if path is not None:
            check_output(path, option, folder=False)
            check_new_file(path, overwrite, option)
            if any(Path(p).resolve() == path.resolve() for p in inputs):
                raise UsageError(f"{option} {path} is one of the audit's inputs: name another file")


def card(result: AuditResult, log: Reporter) -> None:
    """The audit card on stderr: the estimated noise rate (what --drop-top auto drops) and the
    self-tests this audit ran (a run's planted flips, the copies it made to calibrate)."""
    from pactl.verbs.audit import planted_report
    from pactl.verbs.audit_actions import noise_estimate

    estimate = noise_estimate(result)
    n = int(round(estimate.overall * len(result.data)))
    log.log(f"audit card: {estimate.words(result.data.names)}; --drop-top auto drops {n:,}")
    planted = planted_report(result)
    if planted is not None:
        log.log(f"audit card: planted flips: {planted}")
    if result.threshold is not None:
        log.log(f"audit card: copies at {result.threshold.how}")
