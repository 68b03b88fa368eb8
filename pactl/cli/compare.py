"""`pactl compare`: runs side by side (seeds as mean +- std) and the paper's Figure 1."""

from __future__ import annotations

import os
import shutil
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from pactl.cli.options import check_new_file, check_output, to_stdout
from pactl.console import err, literal, out, quoted
from pactl.errors import UsageError


class CompareFormat(str, Enum):
    table = "table"
    csv = "csv"
    markdown = "markdown"
    json = "json"


def compare(
    runs: Annotated[
        list[Path],
        typer.Argument(
            exists=True, file_okay=False, help="Run folders, or folders of runs (runs/, a sweep)."
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            file_okay=False,
            help="Folder for compare.csv, compare.md and compare.png (the Figure-1 plot).",
        ),
    ] = None,
    fmt: Annotated[
        CompareFormat, typer.Option("--format", help="How stdout shows the table.")
    ] = CompareFormat.table,
    at_epochs: Annotated[
        str | None,
        typer.Option(
            metavar="E,E...",
            help="Also Recall@1 and MAP@R after these epochs (1,2,5): how fast each recipe "
            "gets there.",
        ),
    ] = None,
    wide: Annotated[
        bool,
        typer.Option(
            "--wide",
            help="Every column in the table, however wide (a terminal gets the columns that "
            "differ and the key metrics, within its width; csv, json and markdown every one).",
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace compare.csv, .md and .png in --out if there."),
    ] = False,
) -> None:
    """One row per recipe: loss, backbone, the settings that differ, best and last Recall@K and
    MAP@R on the test classes, the best epoch and the split that chose it, epochs and seconds.
    On a terminal the table keeps to its width: the run, best Recall@1 and MAP@R, the columns
    that differ, then what else fits (--wide for all). Runs that differ only by seed are one
    row, mean ± std (sample std). A run still training shows the epochs it has. For the four
    benchmarks, the published Recall@1 of the same setting is beside it. --out adds the plot:
    Recall@1 against epochs and wall time, a line per recipe and a band of ± one std over its
    seeds. Files already in --out are replaced only with --overwrite.

    Examples:

    \b
      pactl compare runs/cub-pa-s0 runs/cub-pa-s1 runs/cub-nca
      pactl compare runs/ --out study/ --format markdown --overwrite
      pactl compare runs/sweep-fonts/points --at-epochs 1,2,5
      pactl compare runs/ --wide | less -S
    """
    from pactl.research.compare import OUTPUT_FILES, RUN_FILES, find_runs
    from pactl.research.compare import compare as compare_runs

    if out is not None:
        check_output(out, "--out", folder=True)
        read = [run / name for run in find_runs(list(runs)) for name in RUN_FILES]
        for name in OUTPUT_FILES:
            check_new_file(out / name, overwrite, "--out", read)
    width = None if wide else terminal_width()
    result = compare_runs(list(runs), fmt.value, out, epochs_given(at_epochs), width)
    with to_stdout():
        sys.stdout.write(result.text)
        sys.stdout.flush()
    if result.left_out:
        names = ", ".join(result.left_out)
        err.print(literal(f"{len(result.left_out)} more columns ({names}): --wide shows them"))
    for path in result.written:
        err.print(literal(f"wrote {path}"))


def terminal_width() -> int | None:
    """The width a table keeps to: the terminal's (COLUMNS where set); none for a pipe or a
    file, which gets every column."""
    if "COLUMNS" not in os.environ and not out.is_terminal:
        return None
    return shutil.get_terminal_size().columns


def epochs_given(text: str | None) -> tuple[int, ...]:
    """--at-epochs 1,2,5 -> (1, 2, 5): whole epochs from 0, each once."""
    if text is None:
        return ()
    try:
        epochs = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"--at-epochs {quoted(text)}: give epochs such as 1,2,5") from None
    if any(e < 0 for e in epochs) or len(set(epochs)) != len(epochs):
        raise UsageError(f"--at-epochs {quoted(text)}: epochs from 0, each once")
    return epochs
