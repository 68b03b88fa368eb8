"""`pactl download`: fetch a dataset of the catalog into $PACTL_HOME/datasets/NAME."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pactl.cli.list import What, show_list
from pactl.cli.options import Quiet, reporter
from pactl.console import quoted
from pactl.errors import UsageError


def download(
    name: Annotated[str | None, typer.Argument(help="Dataset name (see --list).")] = None,
    source: Annotated[
        Path | None,
        typer.Option("--from", exists=True, help="Archives or an extracted folder you fetched."),
    ] = None,
    list_: Annotated[
        bool, typer.Option("--list", help="Show the known datasets (as pactl list datasets).")
    ] = False,
    quiet: Quiet = False,
) -> None:
    """Fetch a dataset and write its images and manifest.csv under $PACTL_HOME/datasets/NAME.

    Examples:

    \b
      pactl download digits     # bundled with scikit-learn, no network needed
      pactl download --list
      pactl download cub200 --from ~/Downloads/CUB_200_2011.tgz
    """
    from pactl.datasets import catalog

    if list_:
        show_list(What.datasets, None)
        return
    if name is None:
        raise UsageError("give a dataset name, or --list to see them")
    check_dataset(name)
    log = reporter(quiet)
    folder, did_work = catalog.prepare(name, log, source)
    if did_work:
        log.log(f"{name} ready in {folder}")
    else:
        log.log(f"{name} is already present in {folder}; nothing to do")


def check_dataset(name: str) -> None:
    """A name that is not in the catalog is a usage mistake: the message lists the known ones."""
    from pactl.datasets import CATALOG

    if name not in CATALOG:
        raise UsageError(
            f"unknown dataset {quoted(name)}; known datasets: {', '.join(sorted(CATALOG))}"
        )
