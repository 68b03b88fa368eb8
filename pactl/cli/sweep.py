"""`pactl sweep`: a grid or search of training runs under one folder, resumable, on Optuna."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from pactl.cli.compare import CompareFormat
from pactl.cli.options import (
    Quiet,
    check_output,
    check_source,
    on_interrupt,
    reporter,
    to_stdout,
)
from pactl.cli.train import check_run_name
from pactl.console import err, literal
from pactl.errors import UsageError
from pactl.store.home import runs_dir


def sweep(
    source: Annotated[
        str | None,
        typer.Argument(help="Dataset name, folder or CSV (not with --resume)."),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            help="A swept setting and its values: alpha=4,8,16 (repeat for a grid: "
            "--param delta=0.1,0.2). Any train setting: lr, dim, batch_size, pooling, ...",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="A setting every point shares: epochs=5 (repeatable)."),
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Settings preset, as train's.")] = None,
    seeds: Annotated[
        str, typer.Option(help="Train every point once per seed (0,1,2 or 0-2).")
    ] = "0",
    trials: Annotated[
        int | None,
        typer.Option(min=1, help="A TPE search of this many points instead of the whole grid."),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(file_okay=False, help="Sweep folder to continue (or to join, from a host)."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Sweep folder name under runs/.")] = None,
    fmt: Annotated[
        CompareFormat, typer.Option("--format", help="How stdout shows the results.")
    ] = CompareFormat.table,
    quiet: Quiet = False,
) -> None:
    """Train a grid (or, with --trials, a TPE search) of points under one sweep folder:
    points/<point>-s<seed>/ are ordinary run folders, journal.log is Optuna's JournalStorage.
    A finished point is never trained again and a killed one resumes from its checkpoint, so
    `pactl sweep --resume DIR` continues a sweep, and several hosts sharing DIR (NFS) share its
    points. Ends with pactl compare's table of the points (results.csv/md, compare.png) and
    sweep.png: Recall@1 against each swept value. Recipes are scored on validation Recall@1
    where there are validation classes.

    Examples:

    \b
      pactl sweep cub200 --param alpha=4,8,16,32,64 --seeds 0,1,2
      pactl sweep digits --param lr=1e-3,2e-3 --param dim=32,64 --set epochs=2
      pactl sweep --resume runs/sweep-digits-20260101-120000
    """
    from pactl.research.seeds import parse_seeds
    from pactl.research.sweep import SweepConfig, parse_setting, run_sweep
    from pactl.runtime import resolve_device

    log = reporter(quiet)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Each process would take points of its own while fit() waited for the others in the
        # first collective: a hang, not a sweep.
        raise UsageError(
            "pactl sweep trains each point in one process and does not run under torchrun: "
            "run one `pactl sweep --resume DIR` per GPU instead, each with its own "
            "CUDA_VISIBLE_DEVICES (docs/cli.md, sweep)"
        )
    config = None
    if resume is not None:
        if source is not None or param or set_ or trials or name or preset:
            raise UsageError(
                "--resume continues a sweep with its own settings: give only the folder"
            )
        folder = resume
    else:
        if source is None or not param:
            raise UsageError("give a dataset, folder or CSV and at least one --param (or --resume)")
        check_source(source)
        if name is not None:
            check_run_name(name)
        stem = Path(source).stem if ("/" in source or "." in source) else source
        folder = runs_dir() / (name or f"sweep-{stem}-{time.strftime('%Y%m%d-%H%M%S')}")
        config = SweepConfig(
            source=source,
            params=tuple(parse_setting(p, many=True) for p in param),
            fixed=tuple(parse_setting(s, many=False) for s in set_ or []),
            preset=preset,
            seeds=parse_seeds(seeds),
            trials=trials,
        )
    check_output(folder, "sweep folder", folder=True)
    device = resolve_device(dict(config.fixed).get("device", "auto") if config else "auto")
    with on_interrupt(lambda: f"continue with: pactl sweep --resume {folder}"):
        result = run_sweep(folder, config, device.type, log, fmt.value)
    with to_stdout():
        sys.stdout.write(result.table)
        sys.stdout.flush()
    for path in result.written:
        err.print(literal(f"wrote {path}"))
