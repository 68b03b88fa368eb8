"""`pactl dedup`: groups of the same item in a bundle or a vectors folder, one row per member
(or, with --keep, per file a user could delete); pactl itself never deletes a file."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from pactl.cli.options import Format, Quiet, reporter, to_stdout
from pactl.console import counted, out
from pactl.errors import UsageError


class Keep(str, Enum):
    first = "first"
    largest = "largest"
    newest = "newest"


def dedup(
    folder: Annotated[
        Path,
        typer.Argument(
            exists=True, file_okay=False, help="An index bundle, or a vectors folder (embed)."
        ),
    ],
    threshold: Annotated[
        float | None,
        typer.Option(
            min=-1.0, max=1.0, help="Cosine at or above which two images are the same item."
        ),
    ] = None,
    precision: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Use the calibrated threshold for this precision (default: the one the "
            "checkpoint was calibrated at, 0.99).",
        ),
    ] = None,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict", help="Every member must match its group's first (no chains of shots)."
        ),
    ] = False,
    keep: Annotated[
        Keep | None,
        typer.Option(help="Keep one file per group; print the others (that could be deleted)."),
    ] = None,
    paths_only: Annotated[
        bool, typer.Option("--paths-only", help="Print only the paths, one a line.")
    ] = False,
    null: Annotated[
        bool, typer.Option("--null", "-0", help="With --paths-only: NUL after each path.")
    ] = False,
    fmt: Annotated[
        Format | None,
        typer.Option(
            "--format", "-f", help="table | csv | jsonl (default: table on a terminal, csv else)."
        ),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Groups of the same item: every pair at or above the threshold (the one calibrated on
    the run's held-out classes, or --threshold), joined into groups; one row per member on
    stdout (group, id, path, score: its cosine to the group's first member), a summary on
    stderr. pactl never deletes a file: --keep prints those a user could delete.

    Examples:

    \b
      pactl dedup runs/<run>/index
      pactl dedup vectors/ --threshold 0.93 --strict -f csv > groups.csv
      pactl dedup runs/<run>/index --keep largest --paths-only -0 | xargs -0 ls -l
    """
    from pactl.output import GroupWriter
    from pactl.verbs.dedup import dedup as find

    if paths_only and fmt is not None:
        raise UsageError("--paths-only writes bare paths; leave out --format")
    if null and not paths_only:
        raise UsageError("-0 separates the paths --paths-only writes; give --paths-only too")
    if threshold is not None and precision is not None:
        raise UsageError("give --threshold or --precision, not both")
    if precision is not None and precision <= 0.0:
        raise UsageError(f"--precision must be above 0, got {precision}")
    log = reporter(quiet)
    keeping = keep.value if keep is not None else None
    result = find(folder, threshold, precision, strict, keeping, log)
    chosen = fmt.value if fmt else ("table" if out.is_terminal else "csv")
    writer = GroupWriter(out, sys.stdout, chosen, paths_only, null, log)
    rows = result.removable if result.removable is not None else result.members
    with to_stdout():
        if rows:
            writer.write(rows)
        writer.close()
    members = sum(len(g) for g in result.members)
    log.log(
        f"{counted(result.images, 'image')}: {counted(len(result.members), 'group')} of the "
        f"same item holding {counted(members, 'image')} ({result.threshold:.4f} cosine, "
        f"{'strict' if strict else 'connected'} groups)"
    )
    if result.removable is not None:
        could = sum(len(g) for g in result.removable)
        log.log(f"keeping the {keeping} of each group: {counted(could, 'file')} could go")
