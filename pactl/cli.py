"""The `pactl` command line: thin commands over the library (no torch/faiss at import time)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from pactl import __version__
from pactl.config import (
    COMMIT_EVERY,
    MAX_BATCH_SIZE,
    MAX_COMMIT_EVERY,
    MAX_K,
    MAX_WORKERS,
    PRESETS,
    TRAIN_RULES,
    IndexConfig,
    ModelConfig,
    Rule,
    TrainConfig,
    check,
    override,
    preset_for,
)
from pactl.console import Reporter, counted, err, literal, out, quoted
from pactl.errors import PactlError, UsageError
from pactl.paths import runs_dir

if TYPE_CHECKING:  # the library's heavy side is imported by the commands that use it
    from pactl.output import HitWriter
    from pactl.pipeline import QueryChunk


class Commands(TyperGroup):
    """pactl's verbs. Typer's own usage errors (an option value of the wrong type or out of
    range, an unknown option or verb) end as one line like pactl's, not a framed panel."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args:  # `pactl` alone: the help, as no_args_is_help asks
            return super().parse_args(ctx, args)
        with one_line_usage_errors():
            return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        fill_closed_descriptors()
        with one_line_usage_errors():
            return super().invoke(ctx)


@contextmanager
def one_line_usage_errors() -> Iterator[None]:
    try:
        yield
    except typer.TyperException as e:
        if getattr(e, "exit_code", None) != 2:  # 2: click's UsageError and its kinds
            raise
        where = getattr(getattr(e, "ctx", None), "command_path", "pactl")
        message = " ".join(e.format_message().split())
        raise UsageError(f"{message} (see {where} --help)") from None


def fill_closed_descriptors() -> None:
    """A closed stdin, stdout or stderr (`<&-`, `>&-`) gets /dev/null on its number, so that no
    file pactl opens later takes that number (where a library's own prints would land)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


app = typer.Typer(
    cls=Commands,
    name="pactl",
    help="Proxy-Anchor metric learning and FAISS retrieval: labelled images in, "
    "top-k answers out.\n\n"
    "Examples:\n\n\b\n  pactl download digits\n  pactl train digits\n  pactl index\n"
    "  pactl query img.png --k 4\n  pactl serve\n  pactl list backbones",
    no_args_is_help=True,
    add_completion=False,
    # Click's plain help: option names and choices are never cut or folded at 80 columns, and
    # `\b` paragraphs (the examples) keep their lines.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)

Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="No progress bars or log lines (warnings and errors still show)."
    ),
]
FollowLinks = Annotated[
    bool,
    typer.Option(
        "--follow-links",
        help="Follow links that lead out of the folder (default: skipped / refused).",
    ),
]
Device = Annotated[
    str, typer.Option(help="auto (CUDA, then MPS, then CPU) | cpu | mps | cuda | cuda:N.")
]
Workers = Annotated[int, typer.Option(min=0, max=MAX_WORKERS, help="DataLoader worker processes.")]
Backbone = Annotated[
    str | None,
    typer.Option(
        help="Instead of --checkpoint: this backbone's pooled features with no training (the "
        "baseline to compare a run with), e.g. resnet50 or timm:efficientnet_lite0."
    ),
]
BackboneWeights = Annotated[
    str | None, typer.Option(help="With --backbone: imagenet (default) | none | PATH.")
]
BackboneSize = Annotated[
    int | None, typer.Option(min=1, help="With --backbone: crop size (default 224).")
]
BackboneResize = Annotated[
    int | None,
    typer.Option(min=1, help="With --backbone: resize before the crop (default: the weights')."),
]
# Option names of config fields, where they differ from the field's name.
OPTIONS = {"embedding_dim": "--dim", "m_per_class": "--m", "compile": "--compile"}


def option_name(field: str) -> str:
    return OPTIONS.get(field, "--" + field.replace("_", "-"))


def check_option(option: str, value: Any, rule: Rule) -> None:
    """A plain option value (not part of a config) in its range: a usage error naming it."""
    if value is not None and not rule.ok(value):
        raise UsageError(f"{option} must be {rule.wants} (got {quoted(value, 40)})")


class Amp(str, Enum):
    none = "none"
    bf16 = "bf16"
    fp16 = "fp16"


class Loss(str, Enum):
    proxy_anchor = "proxy_anchor"
    proxy_nca = "proxy_nca"
    multi_similarity = "multi_similarity"
    triplet = "triplet"
    contrastive = "contrastive"


class Augment(str, Enum):
    rrc_flip = "rrc_flip"
    light = "light"
    none = "none"


class Sampler(str, Enum):
    shuffle = "shuffle"
    m_per_class = "m_per_class"


class Format(str, Enum):
    table = "table"
    csv = "csv"
    jsonl = "jsonl"


class OnDisk(str, Enum):
    auto = "auto"
    yes = "yes"
    no = "no"


class FaissDevice(str, Enum):
    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"


SearchDevice = Annotated[
    FaissDevice,
    typer.Option(
        "--faiss-device",
        help="Where FAISS searches: auto copies a Flat index onto the GPUs when FAISS has them "
        "(the gpu extra); other kinds search on the CPU.",
    ),
]


def reporter(quiet: bool) -> Reporter:
    return Reporter(err, quiet=quiet)


def version_callback(value: bool) -> None:
    if value:
        with to_stdout():
            out.print(f"pactl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Version.")
    ] = False,
) -> None:
    """Proxy-Anchor metric learning and FAISS retrieval from the command line."""


@app.command(short_help="Fetch a dataset into $PACTL_HOME/datasets/NAME.")
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


def check_source(source: str) -> None:
    """SOURCE is a dataset of the catalog or an existing path; anything else is a usage mistake
    (a misspelt dataset name, most often), said before any work."""
    from pactl.datasets import CATALOG

    if source not in CATALOG and not os.path.lexists(source):
        raise UsageError(
            f"{quoted(source)} is neither a known dataset ({', '.join(sorted(CATALOG))}) "
            "nor an existing folder or CSV file"
        )


@app.command(short_help="Train an embedding network with the Proxy-Anchor loss.")
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
    epochs: Annotated[int | None, typer.Option(min=1, help="Epochs to train.")] = None,
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
            "light (small affine jitter, no flip: glyphs, digits), none."
        ),
    ] = None,
    sampler: Annotated[Sampler | None, typer.Option(help="shuffle | m_per_class.")] = None,
    m: Annotated[int | None, typer.Option(min=1, help="Images per class (m_per_class).")] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seeds initialisation, sampling and augmentation.")
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
    EfficientNet-Lite0 at 128 px for 8 epochs, on a GPU the paper's recipe on ResNet-50; 15% of
    its train classes choose best.pt. --print-config shows the settings and why.

    Options left out take the preset's value (pactl list presets).

    Examples:

    \b
      pactl train digits                # about 11 s on 2 CPU cores
      pactl train cars196               # the paper's recipe (float32), on the GPU
      pactl train my_photos/ --weights lite0.pth   # a state_dict file
      torchrun --nproc-per-node 4 -m pactl train sop
      pactl train --resume latest
    """
    from pactl.datasets import load_source
    from pactl.model import check_model_config
    from pactl.runtime import resolve_device
    from pactl.train import fit, latest_run, prepare_run_dir, resumed_configs

    log = reporter(quiet)
    if name is not None:
        check_run_name(name)
    check_option("--device", device, TRAIN_RULES["device"])
    if resume:
        given = {k: v for k, v in locals().items() if k in RESUME_REFUSES and v is not None}
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
        why: list[str] = []
    else:
        if source is None:
            raise UsageError("give a dataset name, folder or CSV to train on (or --resume)")
        check_source(source)
        if preset and preset not in PRESETS:
            raise UsageError(f"unknown preset {quoted(preset)}; choose one of {', '.join(PRESETS)}")
        chosen = preset_for(source, preset, resolve_device(device or "auto").type)
        model_cfg = override(
            chosen.model,
            backbone=backbone,
            weights=weights,
            embedding_dim=dim,
            image_size=image_size,
            resize_size=resize_size,
        )
        if image_size and not resize_size and chosen.model.resize_size:
            # keep the preset's own resize-to-crop ratio (24/24 for digits)
            ratio = chosen.model.resize_size / chosen.model.image_size
            model_cfg = override(model_cfg, resize_size=round(image_size * ratio))
        cfg = override(
            chosen.train,
            epochs=epochs,
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
            sampler=_value(sampler),
            m_per_class=m,
            seed=seed,
            workers=workers,
            device=device,
            amp=_value(amp),
            channels_last=channels_last,
            compile=compile_,
            val_classes=val_classes,
            follow_links=follow_links,
        )
        why = [f"settings: {chosen.source}"]
        if val_classes and cfg.selection != "val":  # classes held out are there to choose
            cfg = override(cfg, selection="val")
            why.append("best.pt chosen by the validation classes --val-classes holds out")
        if model_cfg.weights == "none":  # the preset's freezing and warm-up are for its weights
            if freeze_bn is None and cfg.freeze_bn:
                cfg = override(cfg, freeze_bn=False)
            if warmup_epochs is None and cfg.warmup_epochs:
                cfg = override(cfg, warmup_epochs=0)
                why.append("no warm-up epochs: a random backbone has no features to protect")
        model_cfg = with_preprocessing(model_cfg)
        check_model_config(model_cfg, name=option_name, error=UsageError)
        check(cfg, option_name, UsageError)
        run = runs_dir() / (name or default_run_name(source, model_cfg, cfg))
    if print_config:
        from pactl.distributed import World
        from pactl.train import explain, resolve_train_config

        world = World(size=int(os.environ.get("WORLD_SIZE", "1")))
        cfg = resolve_train_config(model_cfg, cfg, world)
        why += explain(model_cfg, cfg)
        with to_stdout():
            out.print_json(data={"source": source, "why": why, **_configs(model_cfg, cfg)})
        return
    check_output(run, "run folder", folder=True)
    manifest = load_source(source, log, follow_links=cfg.follow_links)
    created = not run.exists() or not any(run.iterdir())
    prepare_run_dir(run, resume=bool(resume), overwrite=overwrite)
    try:
        with on_interrupt(lambda: _resume_hint(run, created)):
            result = fit(source, manifest, model_cfg, cfg, run, log, resume=bool(resume))
    except PactlError:
        if created and not (run / "checkpoint.pt").exists():  # nothing to resume: no dead end
            shutil.rmtree(run, ignore_errors=True)
        raise
    best = ", ".join(f"{k} {v:.4f}" for k, v in result.best_metrics.items() if "@" in k)
    chooser = {
        "val": "validation Recall@1, then MAP@R",
        "test": "test Recall@1, then MAP@R",
        "last": "last epoch",
    }
    with to_stdout():
        out.print(literal(f"run: {result.run_dir}"))
        chosen_by = chooser[result.selection]
        out.print(literal(f"best epoch {result.best_epoch} (by {chosen_by}): {best}"))


@contextmanager
def on_interrupt(hint: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C: one line saying how to go on (`hint()`, worked out when it happens), exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        err.print(literal(f"interrupted; {hint()}"))
        raise typer.Exit(130) from None


# Settings a resumed run keeps from its config.json; --epochs, --device, --workers may change.
RESUME_REFUSES = {
    "source", "preset", "backbone", "weights", "dim", "image_size", "resize_size", "batch_size",
    "lr", "weight_decay", "proxy_lr_mult", "alpha", "delta", "loss", "warmup_epochs",
    "lr_decay_step", "lr_decay_gamma", "freeze_bn", "sync_bn", "val_classes", "augment",
    "sampler", "m", "seed", "amp", "channels_last", "compile_", "follow_links", "name",
}  # fmt: skip


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


@contextmanager
def to_stdout() -> Iterator[None]:
    """Results on stdout: a reader that went away (`| head`) ends the command quietly with exit
    0; a stdout that cannot be written (a full disk behind `>`, /dev/full) is one line, exit 1."""
    try:
        yield
    except BrokenPipeError:
        quiet_stdout()
        raise typer.Exit(0) from None
    except OSError as e:
        quiet_stdout()
        raise PactlError(f"cannot write to standard output ({e.strerror or e})") from None


def quiet_stdout() -> None:
    """Point descriptor 1 at /dev/null: what stdout still buffers is dropped at exit instead of
    failing a second time (where Python would print a warning and exit 120)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # closed, or not a file (tests' capture)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def check_output(path: Path, option: str, folder: bool) -> None:
    """Refuse, before any work, an output that cannot be written: a folder where a file goes or
    a file where a folder goes, a parent that is a file, a folder that takes no new files
    (read-only, or not ours to write). Checked with a nameless file (O_TMPFILE) where the output
    will go: nothing is left behind."""
    import tempfile

    if folder and path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file, not a folder")
    if not folder and path.is_dir():
        raise UsageError(f"{option} {path} is a folder; give a file name")
    parent = path if folder else path.parent
    existing = next(p for p in (parent, *parent.parents) if p.exists() or p == Path("."))
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise PactlError(f"cannot write {option} {path}: {existing} ({e.strerror})") from None


@app.command(short_help="Embed images into vectors.npy, items.csv and meta.json.")
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
    amp: Annotated[Amp, typer.Option(help="Mixed precision autocast.")] = Amp.none,
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
    follow_links: FollowLinks = False,
    quiet: Quiet = False,
) -> None:
    """Embed images into vectors.npy (float32, L2-normalised), items.csv and meta.json.

    Unreadable images are skipped and listed in skipped.csv. Run again into the same folder,
    only new or changed files (path, size, modification time) are embedded. Progress is
    committed every --commit-every images: after a kill or Ctrl-C, the same command goes on
    from the last commit.

    Examples:

    \b
      pactl embed photos/ --checkpoint runs/<run>/best.pt --out vectors/
      pactl embed digits --split test --checkpoint runs/<run>/best.pt
      pactl embed photos/ --backbone resnet50      # no training: the baseline
      pactl embed photos/ --checkpoint best.pt --shard 0/4   # on 4 machines
      torchrun --nproc-per-node 8 -m pactl embed photos/ \\
          --checkpoint best.pt --shard auto
    """
    from pactl.pipeline import embed_source

    check_source(source)
    check_option("--device", device, TRAIN_RULES["device"])
    check_output(out_dir, "--out", folder=True)
    model_from = model_source(checkpoint, backbone, weights, image_size, resize_size)
    log = reporter(quiet)
    with on_interrupt(lambda: "run the same command again to go on from the last commit"):
        meta = embed_source(
            source,
            model_from,
            out_dir,
            split,
            device,
            log,
            batch_size,
            workers,
            amp.value,
            shard,
            follow_links=follow_links,
            commit_every=commit_every,
            gpu_decode=gpu_decode,
        )
    fresh = f", {meta['embedded']:,} embedded now" if "embedded" in meta else ""
    with to_stdout():
        out.print(literal(f"{meta['count']:,} vectors ({meta['dimension']}-d) in {out_dir}{fresh}"))
    if meta["skipped"]:
        log.warn(
            f"{counted(meta['skipped'], 'unreadable image')} skipped: see {out_dir / 'skipped.csv'}"
        )


@app.command(short_help="Build a FAISS index bundle from vectors or images.")
def index(
    source: Annotated[
        str | None,
        typer.Argument(
            help="An embed output folder, or images with --checkpoint (default: the "
            "latest run's test images)."
        ),
    ] = None,
    checkpoint: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="Embed images with this.")
    ] = None,
    backbone: Backbone = None,
    weights: BackboneWeights = None,
    image_size: BackboneSize = None,
    resize_size: BackboneResize = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Bundle folder (default: runs/<run>/index for a run's checkpoint, else ./index).",
        ),
    ] = None,
    factory: Annotated[
        str | None,
        typer.Option(help="FAISS factory string, e.g. Flat (default: chosen by the set's size)."),
    ] = None,
    target_recall: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Recall@10 against exact search a tuned index needs."),
    ] = 0.95,
    split: Annotated[str | None, typer.Option(help="Only this split of a manifest.")] = None,
    add: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            file_okay=False,
            help="Append SOURCE's new images to this bundle, and replace those whose file "
            "changed (size or mtime); images gone from SOURCE stay (see --delete), and "
            "deleted ones stay out while unchanged.",
        ),
    ] = None,
    delete: Annotated[
        list[str] | None,
        typer.Option(
            "--delete",
            metavar="ID_OR_PATH",
            help="Delete an item (its id, or its image's path) from the bundle SOURCE; "
            "repeatable; '-' reads one a line from stdin. Searches skip it at once.",
        ),
    ] = None,
    compact: Annotated[
        bool,
        typer.Option(
            "--compact", help="Remove the deleted items from the bundle SOURCE's index for real."
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Rebuild a bundle even if the new input lacks some of its items (those added "
            "with --add, or other images), which it then drops.",
        ),
    ] = False,
    on_disk: Annotated[
        OnDisk,
        typer.Option(
            "--on-disk",
            help="Index shards one at a time and merge their IVF lists into index.ivfdata, "
            "read from disk at query time (for sets larger than memory). auto: when the shards' "
            "vectors exceed the memory budget and the factory is IVF.",
        ),
    ] = OnDisk.auto,
    faiss_device: Annotated[
        FaissDevice,
        typer.Option(
            help="Where FAISS trains IVF lists, assigns vectors to them and searches exactly: "
            "auto takes the GPUs when FAISS has them (the gpu extra), else the CPU.",
        ),
    ] = FaissDevice.auto,
    device: Device = "auto",
    follow_links: FollowLinks = False,
    quiet: Quiet = False,
) -> None:
    """Build a FAISS inner-product index bundle (index.faiss, items.csv, meta.json).

    An embed folder with shards/ (from `pactl embed --shard i/n`) is merged in shard order.

    With --on-disk, shards are indexed one at a time into an IVF whose lists stay on disk.

    --delete marks items deleted (searches skip them at once, and a rebuild of the bundle
    keeps them deleted); --compact removes them from the index for good. An integer names
    an id: give a file named like one as ./123.

    Examples:

    \b
      pactl index                          # right after `pactl train NAME`
      pactl index vectors/ --out my_index/
      pactl index photos/ --checkpoint runs/<run>/best.pt --factory Flat
      pactl index photos/ --backbone resnet50 --out baseline/   # no training
      pactl index vectors/ --on-disk yes --factory IVF4096,Flat
      pactl index new_photos/ --add runs/<run>/index      # no rebuild
      pactl index my_index/ --delete 42 --delete photos/old.jpg
      find gone/ -name '*.jpg' | pactl index my_index/ --delete -
      pactl index my_index/ --compact      # drop deleted items from the index
    """
    from pactl import pipeline

    log = reporter(quiet)
    config = IndexConfig(
        factory=factory,
        target_recall=target_recall,
        on_disk=on_disk.value,
        faiss_device=faiss_device.value,
    )
    check(config, option_name, UsageError)
    if factory is not None:
        from pactl.index.build import check_factory_parses

        try:
            check_factory_parses(factory)
        except PactlError as e:
            raise UsageError(f"--factory: {e}") from None
    if faiss_device is FaissDevice.gpu:  # before any embedding: a machine without one says so
        from pactl.index.build import faiss_gpus

        faiss_gpus(config.faiss_device)
    check_option("--device", device, TRAIN_RULES["device"])
    if out_dir is not None:
        check_output(out_dir, "--out", folder=True)
    if source is not None:
        check_source(source)
    if delete or compact:
        return keep_bundle(source, delete or [], compact, add, log)
    if add is not None:
        if source is None:
            raise UsageError("--add needs the images to add: pactl index IMAGES --add BUNDLE")
        done = pipeline.add_to_index(source, add, split, device, log, follow_links=follow_links)
        replaced = done["replaced"]
        also = f" and replaced {counted(replaced, 'changed one')}" if replaced else ""
        added = counted(done["added"], "item")
        with to_stdout():
            out.print(literal(f"added {added}{also} to {add} ({done['count']:,} in all)"))
        return
    if source is None:
        bundle, meta = pipeline.index_latest_run(
            runs_dir(), config, device, log, follow_links, overwrite=overwrite
        )
    elif (Path(source) / "vectors.npy").is_file() or (Path(source) / "shards").is_dir():
        images_only = {"--follow-links": follow_links, "--checkpoint": checkpoint is not None}
        images_only |= {"--backbone": backbone is not None, "--split": split is not None}
        for flag in [flag for flag, given in images_only.items() if given]:
            raise UsageError(
                f"{flag} is for indexing images; {source} holds vectors already embedded "
                "(`pactl embed` takes it)"
            )
        if out_dir is not None:
            check_apart(Path(source), out_dir)
        bundle, meta = pipeline.index_vectors(
            Path(source), out_dir, config, log, overwrite=overwrite
        )
    elif checkpoint is None and backbone is None:
        raise UsageError(
            f"{source} is not an embed output folder; to index images pass --checkpoint "
            "or --backbone"
        )
    else:
        model_from = model_source(checkpoint, backbone, weights, image_size, resize_size)
        bundle, meta = pipeline.index_images(
            source,
            model_from,
            out_dir,
            split,
            config,
            device,
            log,
            follow_links=follow_links,
            overwrite=overwrite,
        )
    with to_stdout():
        factory = meta.get("factory", "?")
        out.print(literal(f"indexed {counted(meta['count'], 'item')} ({factory}) in {bundle}"))


def keep_bundle(
    bundle: str | None, delete: list[str], compact: bool, add: Path | None, log: Reporter
) -> None:
    """`pactl index BUNDLE --delete ID_OR_PATH... [--compact]`: tombstones, then compaction."""
    from pactl.index import bundle_count, compact_bundle, delete_items

    if bundle is None:
        raise UsageError("--delete and --compact need the bundle: pactl index BUNDLE --delete ID")
    if add is not None:
        raise UsageError("--add does not go with --delete or --compact: run them one after another")
    names = [given for name in delete for given in (stdin_names() if name == "-" else [name])]
    if delete and not names:
        raise PactlError("--delete - read no ids or paths from standard input")
    ids = [int(name) for name in names if re.fullmatch(r"[0-9]+", name)]
    paths = [name for name in names if not re.fullmatch(r"[0-9]+", name)]
    lines = []
    if names:
        n = delete_items(Path(bundle), ids, paths, log)
        lines.append(
            f"deleted {counted(n, 'item')} from {bundle} ({bundle_count(Path(bundle)):,} left)"
        )
    if compact:
        done = compact_bundle(Path(bundle), log)
        lines.append(
            f"compacted {bundle}: removed {counted(done['removed'], 'deleted item')} "
            f"({done['count']:,} in all)"
        )
    with to_stdout():
        for line in lines:
            out.print(literal(line))


def check_apart(vectors: Path, bundle: Path) -> None:
    """A bundle is never written into the vectors folder it is built from (or a folder inside
    it): its items.csv and meta.json would replace the vectors' own."""
    source, target = vectors.resolve(), bundle.resolve()
    if target == source or source in target.parents:
        raise UsageError(
            f"--out {bundle} is the vectors folder {vectors} or inside it: the bundle would "
            "overwrite its own input; give another folder"
        )


@app.command(short_help="Top-k most similar indexed images for each query image.")
def query(
    images: Annotated[
        list[str],
        typer.Argument(help="Image files or folders; '-' reads paths from stdin."),
    ],
    k: Annotated[
        int, typer.Option("--k", "-k", min=1, max=MAX_K, help="Neighbours per query.")
    ] = 4,
    index_dir: Annotated[
        Path | None, typer.Option("--index", help="Bundle folder (default: newest under runs/).")
    ] = None,
    checkpoint: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="Default: the bundle's.")
    ] = None,
    fmt: Annotated[
        Format | None,
        typer.Option(
            "--format",
            "-f",
            help="table | csv | jsonl (default: table on a terminal, jsonl in a pipe).",
        ),
    ] = None,
    exclude_self: Annotated[
        bool,
        typer.Option("--exclude-self", help="Drop the query image itself from its hits (by id)."),
    ] = False,
    paths_only: Annotated[
        bool, typer.Option("--paths-only", help="Print only the hit paths, one a line.")
    ] = False,
    null: Annotated[
        bool,
        typer.Option(
            "--null",
            "-0",
            help="NUL-separated paths on both sides, as xargs -0: '-' reads them from stdin "
            "(find -print0) and --paths-only writes them.",
        ),
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Fail on the first unreadable query image.")
    ] = False,
    grid: Annotated[
        Path | None,
        typer.Option(help="Also draw the first 32 queries and their hits (.png, .jpg or .webp)."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the --grid file if it exists.")
    ] = False,
    device: Device = "auto",
    faiss_device: SearchDevice = FaissDevice.auto,
    follow_links: FollowLinks = False,
    server: Annotated[
        str | None,
        typer.Option(help="Send the queries to a running `pactl serve` at this URL (same output)."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(envvar="PACTL_TOKEN", help="With --server: the service's token."),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Top-k most similar indexed images for each query image, on stdout.

    Unreadable query images are skipped with a line on stderr; when none can be read, the
    command fails (exit 1).

    Examples:

    \b
      pactl query img.png --k 4
      find queries -name '*.png' | pactl query - --k 4 --format jsonl
      find queries -name '*.png' -print0 | pactl query - -0 --paths-only
      pactl query img.png --paths-only -0 | xargs -0 ls -l
      pactl query queries/ --k 5 --grid hits.png
      pactl query img.png --server http://127.0.0.1:8000
    """
    from pactl import pipeline
    from pactl.output import HitWriter

    log = reporter(quiet)
    check_option("--device", device, TRAIN_RULES["device"])
    check_query_io(images, grid, overwrite)
    check_query_format(images, fmt, paths_only, null)
    if server is not None:
        local = {"--index": index_dir, "--checkpoint": checkpoint, "--grid": grid}
        given = [name for name, value in local.items() if value is not None]
        given += ["--device"] if device != "auto" else []
        given += ["--faiss-device"] if faiss_device is not FaissDevice.auto else []
        if given:
            shown = ", ".join(given)
            raise UsageError(f"--server queries the service's own bundle and network: drop {shown}")
        from pactl.serve.client import check_url, remote_chunks

        paths = query_paths(images, null, follow_links, log)
        chunks = remote_chunks(check_url(server), token, paths, k, exclude_self)
        chosen = fmt.value if fmt else ("table" if out.is_terminal else "jsonl")
        skipped = answer_queries(
            chunks, HitWriter(out, sys.stdout, chosen, paths_only, null), strict, None
        )
        if skipped:
            log.warn(f"{counted(skipped, 'unreadable query image')} skipped")
        return
    bundle = index_dir or pipeline.find_bundle(runs_dir())
    if index_dir is None:
        log.log(f"using index {bundle}")
    chosen = fmt.value if fmt else ("table" if out.is_terminal else "jsonl")
    writer = HitWriter(out, sys.stdout, chosen, paths_only, null)
    pictured: list[tuple[str, str | None, list[tuple[str, str, float]]]] = []
    chunks = pipeline.query_chunks(
        bundle,
        query_paths(images, null, follow_links, log),
        k,
        checkpoint,
        exclude_self,
        device,
        log,
        know_labels=grid is not None,
        faiss_device=faiss_device.value,
    )
    skipped = answer_queries(chunks, writer, strict, pictured if grid is not None else None)
    if grid is not None:
        from pactl.report import retrieval_grid

        with writing(grid):
            retrieval_grid(pictured, grid)
        log.log(f"wrote {grid}")
    if skipped:
        log.warn(f"{counted(skipped, 'unreadable query image')} skipped")


# Skipped queries held back while none has been answered: past this many they are shown.
HOLD_SKIPPED = 1000


def answer_queries(
    chunks: Iterator[QueryChunk],
    writer: HitWriter,
    strict: bool,
    pictured: list[tuple[str, str | None, list[tuple[str, str, float]]]] | None,
) -> int:
    """Write each chunk's hits as it comes and say which queries were skipped; returns how many
    were. A skip line waits until some query has been answered: when none can be read, the
    command fails with one line instead (`--strict`: at the first unreadable image)."""
    answered, skipped = 0, 0
    held: list[tuple[str, str]] = []
    for chunk in chunks:
        if strict and chunk.failed:
            raise PactlError("unreadable query image {}: {}".format(*chunk.failed[0]))
        skipped += len(chunk.failed)
        answered += len(chunk.names)
        held += chunk.failed
        if answered or len(held) > HOLD_SKIPPED:
            for name, reason in held:
                err.print(literal(f"skipped query {name}: {reason}"))
            held = []
        if chunk.hits:  # none: not even a CSV header before a failure
            with to_stdout():
                writer.write(chunk.hits)
        for name, label, hits in zip(chunk.names, chunk.labels, chunk.hits, strict=True):
            if pictured is not None and len(pictured) < 32:
                pictured.append((name, label, [(h.path, h.label, h.score) for h in hits]))
    with to_stdout():
        writer.close()
    if not answered:
        raise PactlError(no_answer(skipped, held))
    return skipped


def no_answer(skipped: int, held: list[tuple[str, str]]) -> str:
    """The one line for a query command that answered nothing."""
    if not skipped:
        return "no query images: the folders and standard input given named none"
    if skipped == 1 and held:
        return "cannot read query image {}: {}".format(*held[0])
    first = " (first: {}: {})".format(*held[0]) if held else ""
    return f"none of the {skipped} query images could be read{first}"


def check_query_format(images: list[str], fmt: Format | None, paths_only: bool, null: bool) -> None:
    """Options that would do nothing are refused rather than ignored: --format with
    --paths-only (bare paths have no format), -0 with neither '-' nor --paths-only."""
    if paths_only and fmt is not None:
        raise UsageError("--paths-only writes bare paths; leave out --format")
    if null and not paths_only and "-" not in images:
        raise UsageError(
            "-0 separates the paths read from '-' and those --paths-only writes; "
            "this command has neither"
        )


def check_query_io(images: list[str], grid: Path | None, overwrite: bool = False) -> None:
    """Before the bundle loads: a stdin to read for '-', a stdout for the hits, and a --grid
    that can be written in the format its name says, replacing a file only when asked."""
    if "-" in images and sys.stdin is None:
        raise UsageError("'-' reads image paths from standard input, which is closed")
    if sys.stdout is None:
        raise PactlError("standard output is closed: the hits would go nowhere")
    if grid is not None:
        from pactl.report import check_image_path

        check_output(grid, "--grid", folder=False)
        check_image_path(grid)
        check_new_file(grid, overwrite, "--grid")


def stdin_paths(null: bool = False) -> Iterator[Path]:
    """Paths on stdin (stdin_names)."""
    return map(Path, stdin_names(null))


def stdin_names(null: bool = False) -> Iterator[str]:
    """Names on stdin as written (`./123` stays `./123`), read as bytes: a name that is not
    UTF-8 keeps its bytes (os.fsdecode), as a name given on the command line does. One a line,
    or with `null` NUL-separated (from `find -print0`), where a name may hold a newline too."""
    stream = getattr(sys.stdin, "buffer", sys.stdin)  # tests give a text stream
    for record in nul_records(stream) if null else stream:
        name = os.fsdecode(record) if isinstance(record, bytes) else record
        if null:
            if name:
                yield name
        elif "\0" in name:
            raise UsageError("standard input holds NUL characters: give -0 for NUL-separated paths")
        elif name.strip():
            yield name.rstrip("\n")


def nul_records(stream: Any) -> Iterator[Any]:
    """The NUL-separated records of a binary (or text) stream, read 64 KiB at a time."""
    pending = stream.read(0)  # b"" or ""
    separator = b"\0" if isinstance(pending, bytes) else "\0"
    while chunk := stream.read(1 << 16):
        *done, pending = (pending + chunk).split(separator)
        yield from done
    if pending:
        yield pending


def query_paths(images: list[str], null: bool, follow_links: bool, reporter: Reporter) -> Any:
    """Expand '-' (paths on stdin) and folders (their images), lazily."""
    from pactl.datasets import list_images

    for item in images:
        if item == "-":
            yield from stdin_paths(null)
        elif Path(item).is_dir():
            yield from list_images(Path(item), follow_links=follow_links, reporter=reporter)
        else:
            yield Path(item)


@app.command("eval", short_help="Recall@K, MAP@R, R-precision and NMI of a network.")
def eval_(
    source: Annotated[
        str | None,
        typer.Argument(help="Dataset name, folder or CSV (default: the run's own dataset)."),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="Default: the latest run's best.pt."),
    ] = None,
    backbone: Backbone = None,
    weights: BackboneWeights = None,
    image_size: BackboneSize = None,
    resize_size: BackboneResize = None,
    ks: Annotated[str | None, typer.Option(help="Recall@K list, e.g. 1,2,4,8.")] = None,
    report: Annotated[
        Path | None,
        typer.Option(
            help="CSV to write the metrics to (default: eval.csv in the checkpoint's run "
            "folder, else in the current folder)."
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the report if it exists.")
    ] = False,
    workers: Workers = 0,
    device: Device = "auto",
    follow_links: FollowLinks = False,
    quiet: Quiet = False,
) -> None:
    """Recall@K, MAP@R, R-precision and NMI of a checkpoint (or of a backbone with no training)
    on a test split; the metrics go to stdout and to a CSV report.

    Examples:

    \b
      pactl eval                             # latest run, its dataset
      pactl eval cars196 --checkpoint runs/<run>/best.pt --report cars.csv
      pactl eval my_photos/ --backbone resnet50   # the ImageNet start
    """
    from pactl.pipeline import eval_checkpoint
    from pactl.train import latest_run, resumed_configs

    if source is not None:
        check_source(source)
    if backbone is None and (checkpoint is None or source is None):
        run = run_folder(checkpoint) if checkpoint else latest_run(runs_dir())
        if run is None:
            raise UsageError("give the dataset, folder or CSV to evaluate --checkpoint on")
        checkpoint = checkpoint or run / "best.pt"
        if source is None:
            source, _, run_cfg = resumed_configs(run)
            follow_links = follow_links or run_cfg.follow_links
    if source is None:
        raise UsageError("give the dataset, folder or CSV to evaluate on")
    check_option("--device", device, TRAIN_RULES["device"])
    report = report or default_report(checkpoint if backbone is None else None)
    check_output(report, "--report", folder=False)
    k_list = parse_ks(ks) if ks else PRESETS[source].train.eval_ks if source in PRESETS else None
    check_new_file(report, overwrite)  # after the usage errors: a wrong option is named first
    model_from = model_source(checkpoint, backbone, weights, image_size, resize_size)
    log = reporter(quiet)
    metrics = eval_checkpoint(
        source, model_from, k_list or (1, 2, 4, 8), device, workers, log, follow_links
    )
    with writing(report):
        write_report(report, source, model_from, metrics)
    with to_stdout():
        for key, value in metrics.items():
            out.print(f"{key:12s} {value:.4f}")
    log.log(f"wrote {report}")


def run_folder(checkpoint: Path | None) -> Path | None:
    """The run folder a checkpoint lies in (it holds config.json), if any."""
    if checkpoint is None or not (checkpoint.parent / "config.json").is_file():
        return None
    return checkpoint.parent


def default_report(checkpoint: Path | None) -> Path:
    """eval.csv beside the run's metrics.csv, or in the current folder for a checkpoint that
    is in no run folder (and for a backbone)."""
    run = run_folder(checkpoint)
    return run / "eval.csv" if run is not None else Path("eval.csv")


def check_new_file(path: Path, overwrite: bool, option: str = "--report") -> None:
    """An existing file is replaced only when asked: a report may be the only record of a run,
    and a --grid named like an image may be one of the user's."""
    if os.path.lexists(path) and not overwrite:
        raise PactlError(
            f"{path} exists; pass --overwrite to replace it, or {option} PATH for another file"
        )


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


@app.command("list", short_help="List backbones, presets, losses or datasets.")
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
    from pactl.pipeline import registry_rows

    chosen = fmt or (ListFormat.text if out.is_terminal else ListFormat.tsv)
    text = format_rows(*registry_rows(what.value), chosen.value)
    with to_stdout():
        sys.stdout.write(text)
        sys.stdout.flush()


@app.command(short_help="Answer queries over HTTP: a JSON API and a web page.")
def serve(
    bundle: Annotated[
        Path | None,
        typer.Argument(help="Bundle folder to serve (default: the latest run's index)."),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to bind; any but loopback needs --token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="PACTL_TOKEN",
            help="Secret every data request must carry (Authorization: Bearer TOKEN); the page "
            "and /openapi.json answer without it.",
        ),
    ] = None,
    allow_root: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="DIR", help="Folder whose images POST /query?path= may read (repeatable)."
        ),
    ] = None,
    upload_dir: Annotated[
        Path | None, typer.Option(help="Where POST /add keeps images (default: BUNDLE/uploads).")
    ] = None,
    max_upload_mb: Annotated[
        float, typer.Option(min=0.001, max=4096, help="Largest request body, in MiB.")
    ] = 20.0,
    max_batch: Annotated[
        int, typer.Option(min=1, max=1024, help="Images in one forward pass, at most.")
    ] = 32,
    batch_wait_ms: Annotated[
        float,
        typer.Option(min=0, max=1000, help="How long a pass waits for requests to join it."),
    ] = 4.0,
    device: Device = "auto",
    faiss_device: SearchDevice = FaissDevice.auto,
    quiet: Quiet = False,
) -> None:
    """Load the network and the bundle once and answer queries over HTTP: a JSON API
    (POST /query, GET /items/ID, POST /add, POST /delete, GET /health, OpenAPI at /docs) and a
    web page at /. Requests that arrive together share one forward pass; a new generation of
    the bundle (pactl index --add, a delete) is picked up as it lands.

    Examples:

    \b
      pactl serve                                     # the latest run's index
      pactl serve runs/demo/index                     # http://127.0.0.1:8000/
      pactl serve index --allow-root /data/photos
      PACTL_TOKEN=... pactl serve index --host 0.0.0.0
    """
    import importlib.util

    needed = {"fastapi": "fastapi", "uvicorn": "uvicorn", "python_multipart": "python-multipart"}
    missing = [pkg for module, pkg in needed.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise PactlError(f"pactl serve needs {', '.join(missing)}: pip install 'pactl[serve]'")
    from pactl.index import check_folder
    from pactl.pipeline import find_bundle
    from pactl.serve.config import ServeConfig
    from pactl.serve.server import serve as run_service

    check_option("--device", device, TRAIN_RULES["device"])
    log = reporter(quiet)
    if bundle is None:
        bundle = find_bundle(runs_dir(), "name the bundle folder: pactl serve BUNDLE")
        log.log(f"using index {bundle}")
    check_folder(bundle)
    config = ServeConfig(
        bundle=bundle,
        host=host,
        port=port,
        token=token,
        device=device,
        faiss_device=faiss_device.value,
        allow_roots=tuple(allow_root or ()),
        upload_dir=upload_dir,
        max_upload_bytes=int(max_upload_mb * 1024 * 1024),
        max_batch=max_batch,
        batch_wait_ms=batch_wait_ms,
    )
    run_service(config, log)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """A file that cannot be written after all (made read-only meanwhile, an I/O error) is one
    line; a full disk already is one (pactl.fsutil)."""
    try:
        yield
    except OSError as e:
        raise PactlError(f"cannot write {path} ({e.strerror or e})") from None


def with_preprocessing(config: ModelConfig) -> ModelConfig:
    """Resize size and filter left open filled from the backbone's weights (config.json and
    --print-config then say what is used)."""
    from pactl.backbones import constructor_for, preprocessing_of
    from pactl.model import fill_resize

    constructor_for(config.backbone)  # an unknown name fails here, before any work
    return fill_resize(config, *preprocessing_of(config.backbone))


def describe_backbone(config: ModelConfig) -> str:
    from pactl.config import weights_words

    return f"{config.backbone} ({weights_words(config.weights)}, no training)"


def parse_ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--ks takes integers separated by commas (got {quoted(text)})") from None
    if not ks or min(ks) < 1 or max(ks) > MAX_K:
        raise UsageError(f"--ks needs integers from 1 to {MAX_K:,} (got {quoted(text, 40)})")
    return ks


def model_source(
    checkpoint: Path | None,
    backbone: str | None,
    weights: str | None,
    image_size: int | None,
    resize_size: int | None,
) -> Path | ModelConfig:
    """--checkpoint, or --backbone (with its --weights and sizes) and no head: exactly one."""
    if checkpoint is not None and backbone is not None:
        raise UsageError("give --checkpoint or --backbone, not both")
    if backbone is None:
        if weights or image_size or resize_size:
            raise UsageError("--weights, --image-size and --resize-size go with --backbone")
        if checkpoint is None:
            raise UsageError("give --checkpoint (a run's best.pt) or --backbone NAME")
        return checkpoint
    config = ModelConfig(
        backbone=backbone,
        weights=weights or "imagenet",
        embedding_dim=0,  # no head: the pooled features
        image_size=image_size or ModelConfig.image_size,
        resize_size=resize_size,
    )
    from pactl.backbones import constructor_for
    from pactl.model import check_model_config

    constructor_for(backbone)  # an unknown name fails before any work
    check_model_config(config, trained=False, name=option_name, error=UsageError)
    return config


def write_report(
    path: Path, source: str, model_from: Path | ModelConfig, metrics: dict[str, float]
) -> None:
    import csv
    import io

    from pactl.fsutil import atomic_write_text

    what = str(model_from) if isinstance(model_from, Path) else describe_backbone(model_from)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["dataset", "checkpoint", *metrics])
    writer.writerow([source, what, *(f"{v:.6g}" for v in metrics.values())])
    atomic_write_text(path, buffer.getvalue())


def main() -> None:
    """Entry point: one-line errors instead of tracebacks, exit 1 (runtime) or 2 (usage)."""
    try:
        app()
    except UsageError as e:
        err.print(literal(f"error: {e}"))  # names, paths and reasons: shown, never markup
        sys.exit(2)
    except PactlError as e:
        err.print(literal(f"error: {e}"))
        sys.exit(1)
    except KeyError as e:  # registries list their choices in the message
        err.print(literal(f"error: {e.args[0] if e.args else e}"))
        sys.exit(2)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (`| head`): nothing more to say
        sys.exit(0)
