"""`pactl list`: the registries (backbones, presets, losses, datasets) as a table or CSV."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated

import typer

from pactl.cli.options import to_stdout
from pactl.console import out


class What(str, Enum):
    backbones = "backbones"
    presets = "presets"
    losses = "losses"
    datasets = "datasets"


class ListFormat(str, Enum):
    text = "text"
    tsv = "tsv"
    csv = "csv"
    json = "json"


def list_(
    what: Annotated[What, typer.Argument(help="The registry to show.")],
    fmt: Annotated[
        ListFormat | None,
        typer.Option(
            "--format",
            "-f",
            help="text: aligned columns under a header; tsv: tab-separated, no header; csv: "
            "with a header; json: a list of objects (default: text on a terminal, tsv in a "
            "pipe).",
        ),
    ] = None,
) -> None:
    """The names pactl knows: values of --backbone, --preset and --loss, and the datasets of
    pactl download (with whether each is present).

    Examples:

    \b
      pactl list backbones
      pactl list presets --format json
      pactl list datasets | cut -f1
    """
    show_list(what, fmt)


def show_list(what: What, fmt: ListFormat | None) -> None:
    from pactl.output import format_rows
    from pactl.verbs.listing import registry_rows

    chosen = fmt or (ListFormat.text if out.is_terminal else ListFormat.tsv)
    text = format_rows(*registry_rows(what.value), chosen.value)
    with to_stdout():
        sys.stdout.write(text)
        sys.stdout.flush()
