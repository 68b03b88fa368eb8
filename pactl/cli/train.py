"""`pactl train`: options -> ModelConfig and TrainConfig -> pactl.training.loop.fit, resumable."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pactl.cli.options import (
    Amp,
    Augment,
    Loss,
    Pooling,
    Quiet,
    Sampler,
    check_option,
    check_output,
    check_source,
    on_interrupt,
    option_name,
    reporter,
    to_stdout,
    with_preprocessing,
)
from pactl.config import (
    PRESETS,
    TRAIN_RULES,
    ModelConfig,
    Preset,
    TrainConfig,
    check,
    implied,
    override,
    preset_for,
)
from pactl.console import Reporter, literal, out, quoted
from pactl.errors import PactlError, UsageError
from pactl.paths import runs_dir

if TYPE_CHECKING:
    from pactl.datasets import Manifest


def train(
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
        typer.Option(
            help="small, bn_inception, resnet50, timm:<model>, ... (pactl list backbones)."
        ),
    ] = None,
    weights: Annotated[
        str | None,
        typer.Option(help="none | imagenet | PATH (a state_dict file, .pth or .safetensors)."),
    ] = None,
    dim: Annotated[int | None, typer.Option(help="Embedding size.")] = None,
    image_size: Annotated[int | None, typer.Option(help="Crop size the network sees.")] = None,
    resize_size: Annotated[int | None, typer.Option(help="Test-time resize before crop.")] = None,
    pooling: Annotated[
        Pooling | None,
        typer.Option(
            help="Feature pooling: avg+max (summed, the official head; the default), avg, max, "
            "token (a timm transformer's class token)."
        ),
    ] = None,
    epochs: Annotated[int | None, typer.Option(min=1, help="Epochs to train.")] = None,
    time_budget: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION",
            help="Fit the epochs (and the lr decay, in proportion) to this wall-clock budget "
            "from the run's measured step and evaluation times: 15m, 900s, 1.5h. Not with "
            "--epochs.",
        ),
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(min=2, help="Global batch size (2 at least: pairs to compare).")
    ] = None,
    lr: Annotated[float | None, typer.Option(help="AdamW learning rate.")] = None,
    weight_decay: Annotated[float | None, typer.Option(help="AdamW weight decay.")] = None,
    proxy_lr_mult: Annotated[float | None, typer.Option(help="Proxies' lr multiplier.")] = None,
    alpha: Annotated[float | None, typer.Option(help="Proxy-Anchor alpha.")] = None,
    delta: Annotated[float | None, typer.Option(help="Proxy-Anchor margin delta.")] = None,
    loss: Annotated[Loss | None, typer.Option(help="Loss to train with.")] = None,
    warmup_epochs: Annotated[int | None, typer.Option(min=0, help="Head-only epochs.")] = None,
    lr_decay_step: Annotated[
        int | None, typer.Option(min=1, help="Epochs between learning-rate decays.")
    ] = None,
    lr_decay_gamma: Annotated[
        float | None, typer.Option(help="Factor of each learning-rate decay.")
    ] = None,
    freeze_bn: Annotated[
        bool | None,
        typer.Option(
            "--freeze-bn/--no-freeze-bn",
            help="Keep BatchNorm statistics fixed. Default: frozen for pretrained weights (as the "
            "paper does for CUB and Cars), training with --weights none (frozen random "
            "statistics make the network collapse).",
        ),
    ] = None,
    sync_bn: Annotated[
        bool | None,
        typer.Option(
            "--sync-bn/--no-sync-bn",
            help="SyncBatchNorm under torchrun (default: on when BatchNorm trains on GPUs).",
        ),
    ] = None,
    val_classes: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=0.9,
            help="Share of the train classes held out as validation classes that choose "
            "best.pt (default 0.15 for your own data; 0: none, best.pt is the last epoch). "
            "Presets keep their own choice (the paper's: best test Recall@1) unless given.",
        ),
    ] = None,
    augment: Annotated[
        Augment | None,
        typer.Option(
            help="Train-time augmentation: rrc_flip (random resized crop + flip, the paper's), "
            "flip (the test transform's view, mirrored half the time), light (small affine "
            "jitter, no flip: glyphs, digits), none."
        ),
    ] = None,
    crop_scale: Annotated[
        float | None,
        typer.Option(
            help="rrc_flip's smallest crop as a share of the image's area (the paper's 0.08; "
            "1.0 keeps whole images, only reshaped).",
        ),
    ] = None,
    sampler: Annotated[Sampler | None, typer.Option(help="shuffle | m_per_class.")] = None,
    m: Annotated[int | None, typer.Option(min=1, help="Images per class (m_per_class).")] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seeds initialisation, sampling and augmentation.")
    ] = None,
    precision: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Same-item precision best.pt's calibrated cosine threshold reaches (0.99).",
        ),
    ] = None,
    seeds: Annotated[
        str | None,
        typer.Option(
            help="Train once per seed (0,1,2 or 0-4) into runs/<name>-s<seed>; prints and writes "
            "runs/<name>-seeds.csv: each metric's mean and std."
        ),
    ] = None,
    workers: Annotated[int | None, typer.Option(min=0, help="DataLoader workers.")] = None,
    device: Annotated[
        str | None, typer.Option(help="auto | cpu | cuda | cuda:N (default: auto).")
    ] = None,
    amp: Annotated[Amp | None, typer.Option(help="Mixed precision autocast.")] = None,
    channels_last: Annotated[
        bool | None,
        typer.Option(
            "--channels-last/--no-channels-last",
            help="NHWC memory layout for convolutions (default: on).",
        ),
    ] = None,
    compile_: Annotated[
        bool | None,
        typer.Option("--compile/--no-compile", help="torch.compile the model (default: off)."),
    ] = None,
    follow_links: Annotated[
        bool | None,
        typer.Option(
            "--follow-links",
            help="Follow links that lead out of the folder or the CSV's folder (default: "
            "skipped / refused). Kept for --resume.",
        ),
    ] = None,
    tensorboard: Annotated[
        bool | None,
        typer.Option(
            "--tensorboard",
            help="Log loss, lr and the metrics per epoch to runs/<run>/tensorboard (needs "
            "pip install 'pactl[tensorboard]').",
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
    EfficientNet-Lite0 at 128 px on whole images for 8 epochs (with --weights none ResNet-18 at
    64 px for 12, or on images of 32 px or less the small CNN at their own size for 36), on a
    GPU the paper's recipe on ResNet-50; 15% of its train classes choose best.pt.
    --print-config shows the settings and why.

    Options left out take the preset's value (pactl list presets).

    Examples:

    \b
      pactl train digits                # about 11 s on 2 CPU cores
      pactl train cars196               # the paper's recipe (float32), on the GPU
      pactl train my_photos/ --weights lite0.pth   # a state_dict file
      pactl train my_photos/ --time-budget 15m     # epochs fitted to 15 minutes
      torchrun --nproc-per-node 4 -m pactl train sop
      pactl train --resume latest
    """
    given = {k: v for k, v in locals().items() if k in RESUME_REFUSES and v is not None}
    log = reporter(quiet)

    @functools.cache
    def data(source: str, follow_links: bool) -> Manifest:
        """The source's manifest, read once: by the recipe's choice where it needs the images'
        size, else by the training itself."""
        from pactl.datasets import load_source

        return load_source(source, log, follow_links=follow_links)

    budget = checked_budget(time_budget, epochs)
    if name is not None:
        check_run_name(name)
    check_option("--device", device, TRAIN_RULES["device"])
    if resume:
        run, source, model_cfg, cfg = resumed(resume, given, epochs, device, workers)
        why: list[str] = []
    else:
        source = checked_source(source, preset)
        chosen = preset_for(
            source,
            preset,
            device_type(device),
            weights,
            lambda: side_of(data(source, bool(follow_links))),
        )
        model_cfg = model_settings(chosen, backbone, weights, dim, image_size, resize_size)
        model_cfg = override(model_cfg, pooling=_value(pooling))
        cfg = override(
            chosen.train,
            epochs=epochs,
            time_budget=budget,
            batch_size=batch_size,
            lr=lr,
            weight_decay=weight_decay,
            proxy_lr_mult=proxy_lr_mult,
            alpha=alpha,
            delta=delta,
            loss=_value(loss),
            warmup_epochs=warmup_epochs,
            lr_decay_step=lr_decay_step,
            lr_decay_gamma=lr_decay_gamma,
            freeze_bn=freeze_bn,
            sync_bn=sync_bn,
            augment=_value(augment),
            crop_scale=crop_scale,
            sampler=_value(sampler),
            m_per_class=m,
            seed=seed,
            precision=precision,
            workers=workers,
            device=device,
            amp=_value(amp),
            channels_last=channels_last,
            compile=compile_,
            val_classes=val_classes,
            follow_links=follow_links,
            tensorboard=tensorboard,
        )
        model_cfg, cfg, why = settled(chosen, model_cfg, cfg, given)
        run = runs_dir() / (name or default_run_name(source, model_cfg, cfg))
    if print_config:
        show_config(source, model_cfg, cfg, why)
        return
    if seeds is not None:
        if seed is not None:
            raise UsageError("give --seed or --seeds, not both")
        train_seeds(source, data, model_cfg, cfg, run, seeds, log, overwrite)
        return
    show_result(run_fit(source, data, model_cfg, cfg, run, log, bool(resume), overwrite))


def resumed(
    resume: str, given: dict[str, Any], epochs: int | None, device: str | None, workers: int | None
) -> tuple[Path, str, ModelConfig, TrainConfig]:
    """The run --resume names and its own settings; only --epochs, --device, --workers change."""
    from pactl.training.loop import latest_run, resumed_configs

    if given:
        names = ", ".join("--" + k.rstrip("_").replace("_", "-") for k in sorted(given))
        raise UsageError(
            f"--resume continues a run with its own settings: it takes --epochs, --device "
            f"and --workers, not {names} (start a new run for other settings)"
        )
    run = latest_run(runs_dir()) if resume == "latest" else Path(resume)
    source, model_cfg, cfg = resumed_configs(run)
    cfg = check(
        override(cfg, epochs=epochs, device=device, workers=workers), option_name, UsageError
    )
    return run, source, model_cfg, cfg


def side_of(manifest: Manifest) -> int | None:
    """The typical short side of the training images, which the from-scratch CPU recipe's
    network depends on."""
    from pactl.datasets import typical_side

    return typical_side(manifest)


def checked_budget(text: str | None, epochs: int | None) -> float | None:
    """--time-budget in seconds; a budget chooses the epochs, so not with --epochs."""
    from pactl.budget import parse_duration

    if text is None:
        return None
    if epochs is not None:
        raise UsageError("give --epochs or --time-budget, not both (the budget chooses epochs)")
    try:
        return parse_duration(text)
    except UsageError as e:
        raise UsageError(f"--time-budget {e}") from None


def checked_source(source: str | None, preset: str | None) -> str:
    if source is None:
        raise UsageError("give a dataset name, folder or CSV to train on (or --resume)")
    check_source(source)
    if preset and preset not in PRESETS:
        raise UsageError(f"unknown preset {quoted(preset)}; choose one of {', '.join(PRESETS)}")
    return source


def device_type(device: str | None) -> str:
    from pactl.runtime import resolve_device

    return resolve_device(device or "auto").type


def model_settings(
    chosen: Preset,
    backbone: str | None,
    weights: str | None,
    dim: int | None,
    image_size: int | None,
    resize_size: int | None,
) -> ModelConfig:
    """The preset's model with the options given; a new --image-size keeps the preset's own
    resize-to-crop ratio (24/24 for digits) unless --resize-size is given too."""
    model_cfg = override(
        chosen.model,
        backbone=backbone,
        weights=weights,
        embedding_dim=dim,
        image_size=image_size,
        resize_size=resize_size,
    )
    if image_size and not resize_size and chosen.model.resize_size:
        ratio = chosen.model.resize_size / chosen.model.image_size
        model_cfg = override(model_cfg, resize_size=round(image_size * ratio))
    return model_cfg


def settled(
    chosen: Preset, model_cfg: ModelConfig, cfg: TrainConfig, given: dict[str, Any]
) -> tuple[ModelConfig, TrainConfig, list[str]]:
    """What the options imply beyond themselves, checked, with the reasons for --print-config."""
    from pactl.model import check_model_config

    cfg, why = implied(model_cfg, cfg, given)
    why.insert(0, f"settings: {chosen.source}")
    model_cfg = with_preprocessing(model_cfg)
    check_model_config(model_cfg, name=option_name, error=UsageError)
    check(cfg, option_name, UsageError)
    return model_cfg, cfg, why


def show_config(source: str, model_cfg: ModelConfig, cfg: TrainConfig, why: list[str]) -> None:
    """--print-config: the settings as this machine would resolve them, and why, as JSON."""
    from pactl.distributed import World
    from pactl.training.loop import explain, resolve_train_config

    world = World(size=int(os.environ.get("WORLD_SIZE", "1")))
    cfg = resolve_train_config(model_cfg, cfg, world)
    why += explain(model_cfg, cfg)
    with to_stdout():
        out.print_json(data={"source": source, "why": why, **_configs(model_cfg, cfg)})


def run_fit(
    source: str,
    data: Callable[[str, bool], Manifest],
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    run: Path,
    log: Reporter,
    resume: bool,
    overwrite: bool,
) -> Any:
    """Train into `run` on `data(source, follow_links)`; a run that fails before its first
    checkpoint leaves no folder behind."""
    from pactl.training.loop import fit, prepare_run_dir

    check_output(run, "run folder", folder=True)
    manifest = data(source, cfg.follow_links)
    created = not run.exists() or not any(run.iterdir())
    prepare_run_dir(run, resume=resume, overwrite=overwrite)
    try:
        with on_interrupt(lambda: _resume_hint(run, created)):
            return fit(source, manifest, model_cfg, cfg, run, log, resume=resume)
    except PactlError:
        if created and not (run / "checkpoint.pt").exists():  # nothing to resume: no dead end
            shutil.rmtree(run, ignore_errors=True)
        raise


CHOOSERS = {
    "val": "validation Recall@1, then MAP@R",
    "test": "test Recall@1, then MAP@R",
    "last": "last epoch",
}


def show_result(result: Any) -> None:
    best = ", ".join(f"{k} {v:.4f}" for k, v in result.best_metrics.items() if "@" in k)
    with to_stdout():
        out.print(literal(f"run: {result.run_dir}"))
        chosen_by = CHOOSERS[result.selection]
        out.print(literal(f"best epoch {result.best_epoch} (by {chosen_by}): {best}"))


# Settings a resumed run keeps from its config.json; --epochs, --device, --workers may change.
RESUME_REFUSES = {
    "source", "preset", "backbone", "weights", "dim", "image_size", "resize_size", "batch_size",
    "lr", "weight_decay", "proxy_lr_mult", "alpha", "delta", "loss", "warmup_epochs",
    "lr_decay_step", "lr_decay_gamma", "freeze_bn", "sync_bn", "val_classes", "augment",
    "crop_scale", "sampler", "m", "seed", "amp", "channels_last", "compile_", "follow_links",
    "name", "pooling", "seeds", "tensorboard", "time_budget",
}  # fmt: skip


def train_seeds(
    source: str,
    data: Callable[[str, bool], Manifest],
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    run: Path,
    seeds: str,
    log: Reporter,
    overwrite: bool,
) -> None:
    """--seeds: the recipe once per seed into sibling run folders, then mean +- std."""
    from pactl.research.seeds import parse_seeds, seed_run_name, shown
    from pactl.research.seeds import train_seeds as run_seeds

    chosen = parse_seeds(seeds)
    for s in chosen:
        check_output(run.parent / seed_run_name(run.name, s), "run folder", folder=True)
    manifest = data(source, cfg.follow_links)
    with on_interrupt(lambda: "finished seeds are kept; start the rest with --seeds"):
        result = run_seeds(
            source, manifest, model_cfg, cfg, run.parent, run.name, chosen, log, overwrite
        )
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


def _value(choice: Enum | None) -> Any:
    return None if choice is None else choice.value


def _configs(model_cfg: ModelConfig, cfg: TrainConfig) -> dict[str, Any]:
    return {"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(cfg)}


def default_run_name(source: str, model_cfg: ModelConfig, cfg: TrainConfig) -> str:
    """SOURCE-BACKBONE-LOSS-TIME, every character outside letters, digits, `.`, `-` and `_`
    replaced by `_`: one plain folder name whatever the source is called."""
    import time

    stem = Path(source).stem if ("/" in source or "." in source) else source
    name = f"{stem}-{model_cfg.backbone}-{cfg.loss}-{time.strftime('%Y%m%d-%H%M%S')}"
    return re.sub(r"[^\w.-]", "_", name)


def check_run_name(name: str) -> None:
    """--name is one plain folder name under the runs folder: not empty, `.` or `..`, no `/` or
    `\\`, no NUL or other control characters, at most 255 bytes. Anything else could name a
    folder outside runs/ (which --overwrite would then remove)."""
    plain = (
        name not in ("", ".", "..")
        and not any(c in name for c in "/\\")
        and name.isprintable()
        and len(name.encode("utf-8", "surrogateescape")) <= 255
    )
    if not plain:
        raise UsageError(
            f"--name {quoted(name)} must be one plain folder name under {runs_dir()}: no '/', "
            "backslash, '.', '..' or control characters"
        )
