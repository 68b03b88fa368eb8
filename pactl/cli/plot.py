"""`pactl plot`: a run's test embeddings in 2-D (t-SNE) and its retrievals, as pictures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pactl.cli.options import (
    Device,
    Quiet,
    Workers,
    check_new_file,
    check_option,
    check_output,
    reporter,
)
from pactl.config import rules
from pactl.console import err, literal


def plot(
    run: Annotated[
        Path, typer.Argument(exists=True, file_okay=False, help="A run folder (with best.pt).")
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", file_okay=False, help="Folder for the pictures (default RUN/plots)."),
    ] = None,
    points: Annotated[
        int, typer.Option(min=4, max=20000, help="Test images sampled for t-SNE.")
    ] = 2000,
    thumbnails: Annotated[int, typer.Option(min=0, help="Images drawn on the t-SNE map.")] = 40,
    queries: Annotated[int, typer.Option(min=1, help="Queries in the retrieval figure.")] = 8,
    seed: Annotated[int, typer.Option(min=0, help="Seeds the sample, queries and t-SNE.")] = 0,
    device: Device = "auto",
    workers: Workers = 0,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace tsne.png and retrieval.png if there.")
    ] = False,
    quiet: Quiet = False,
) -> None:
    """tsne.png: a sample of the run's test embeddings (its best.pt) in 2-D by t-SNE, coloured
    by class, with thumbnails of some images; retrieval.png: queries from the sample with their
    top 4 among it (the query left out), framed green when of its class and red when not.
    Pictures already in the folder are replaced only with --overwrite.

    Examples:

    \b
      pactl plot runs/digits-small-proxy_anchor-20260101-120000
      pactl plot runs/cub --out figures/ --points 3000
      pactl plot runs/cub --overwrite     # draw RUN/plots again
    """
    from pactl.research.plot import PICTURES, READS, PlotConfig, plot_run

    check_option("--device", device, rules(PlotConfig)["device"])
    folder = out or run / "plots"
    check_output(folder, "--out", folder=True)
    for name in PICTURES:
        check_new_file(folder / name, overwrite, "--out", [run / n for n in READS])
    config = PlotConfig(
        points=points,
        thumbnails=thumbnails,
        queries=queries,
        seed=seed,
        device=device,
        workers=workers,
    )
    result = plot_run(run, folder, config, reporter(quiet))
    for path in result.written:
        err.print(literal(f"wrote {path}"))
