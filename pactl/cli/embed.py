"""`pactl embed`: images -> a vectors folder (pactl.verbs.embed.embed_source)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pactl.cli.engines import Engine, EngineOption, RayAddress, Shards, engine_config
from pactl.cli.options import (
    Amp,
    Backbone,
    BackboneResize,
    BackboneSize,
    BackboneWeights,
    Device,
    FollowLinks,
    Quiet,
    Workers,
    check_option,
    check_output,
    check_source,
    model_source,
    on_interrupt,
    reporter,
    to_stdout,
)
from pactl.config import EmbedConfig, rules
from pactl.console import counted, literal, out
from pactl.errors import UsageError
from pactl.rules import COMMIT_EVERY, MAX_BATCH_SIZE, MAX_COMMIT_EVERY


def embed(
    source: Annotated[str, typer.Argument(help="Folder of images, dataset name, or CSV.")],
    checkpoint: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="best.pt or checkpoint.pt of a run."),
    ] = None,
    backbone: Backbone = None,
    weights: BackboneWeights = None,
    image_size: BackboneSize = None,
    resize_size: BackboneResize = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("vectors"),
    split: Annotated[str | None, typer.Option(help="Only this split of a manifest.")] = None,
    batch_size: Annotated[
        int, typer.Option(min=1, max=MAX_BATCH_SIZE, help="Images per forward pass.")
    ] = 128,
    workers: Workers = 0,
    device: Device = "auto",
    amp: Annotated[Amp, typer.Option(help="Mixed precision autocast.")] = Amp("none"),
    shard: Annotated[
        str | None, typer.Option(help="Embed slice i of n ('i/n', 0-based; 'auto' under torchrun).")
    ] = None,
    commit_every: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_COMMIT_EVERY,
            help="Images between progress commits: a stopped embed goes on from the last one.",
        ),
    ] = COMMIT_EVERY,
    gpu_decode: Annotated[
        bool,
        typer.Option(
            "--gpu-decode/--no-gpu-decode",
            help="On a CUDA device, decode JPEGs on the GPU (nvJPEG); other files, and any the "
            "GPU cannot read, go through PIL as usual.",
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace the vectors in --out when another network made them (without it, "
            "refused before any work).",
        ),
    ] = False,
    follow_links: FollowLinks = False,
    engine: EngineOption = Engine("local"),
    ray_address: RayAddress = None,
    shards: Shards = 0,
    quiet: Quiet = False,
) -> None:
    """Embed images into vectors.npy (float32, L2-normalised), items.csv and meta.json.

    Unreadable images are skipped and listed in skipped.csv. Run again into the same folder,
    only new or changed files (path, size, modification time) are embedded. Progress is
    committed every --commit-every images: after a kill or Ctrl-C, the same command goes on
    from the last commit.

    With --engine ray, one Ray task per shard writes --out/shards/<i>-of-<n>/ as --shard i/n
    does (on a GPU where the cluster has them); run again, the shards already committed are
    kept and only the others are embedded.

    Examples:

    \b
      pactl embed photos/ --checkpoint runs/<run>/best.pt --out vectors/
      pactl embed digits --split test --checkpoint runs/<run>/best.pt
      pactl embed photos/ --backbone resnet50      # no training: the baseline
      pactl embed photos/ --checkpoint best.pt --shard 0/4   # on 4 machines
      torchrun --nproc-per-node 8 -m pactl embed photos/ \\
          --checkpoint best.pt --shard auto
      pactl embed photos/ --checkpoint best.pt --engine ray \\
          --ray-address head:6379
    """
    from pactl.verbs.embed import embed_source

    cluster = engine_config(engine, ray_address, shards)  # fails fast: Ray, the address
    if cluster.engine == "ray" and shard is not None:
        raise UsageError("--shard is for one slice by hand; --engine ray runs every shard")
    check_source(source)
    check_option("--device", device, rules(EmbedConfig)["device"])
    check_output(out_dir, "--out", folder=True)
    model_from = model_source(checkpoint, backbone, weights, image_size, resize_size)
    config = EmbedConfig(
        device, batch_size, workers, amp.value, commit_every, gpu_decode, follow_links
    )
    log = reporter(quiet)
    with on_interrupt(lambda: "run the same command again to go on from the last commit"):
        if cluster.engine == "ray":
            from pactl.engines.embedding import embed_on_ray

            meta = embed_on_ray(source, model_from, out_dir, split, config, cluster, log, overwrite)
        else:
            meta = embed_source(
                source, model_from, out_dir, split, config, log, shard, overwrite=overwrite
            )
    fresh = f", {meta['embedded']:,} embedded now" if "embedded" in meta else ""
    with to_stdout():
        out.print(literal(f"{meta['count']:,} vectors ({meta['dimension']}-d) in {out_dir}{fresh}"))
    if meta["skipped"]:
        listed = out_dir / ("shards/*/skipped.csv" if "shards" in meta else "skipped.csv")
        log.warn(f"{counted(meta['skipped'], 'unreadable image')} skipped: see {listed}")
