"""The recipe: the presets, the one chosen for your data and device, what options imply, and
the recipe in words (--print-config, a run's first lines).

`settle` turns the settings given (by field name) into the ModelConfig and TrainConfig a run
trains with, and the reasons; `pactl train`, every `pactl sweep` point and `pactl.train()` call
it, so the same settings give the same run whichever way they are given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pactl.config import (
    ModelConfig,
    TrainConfig,
    check,
    declared,
    override,
    split_settings,
    weights_words,
)
from pactl.console import counted, duration_words, quoted
from pactl.errors import PactlError, UsageError
from pactl.rules import MIN_IMAGE_SIZE, shown

if TYPE_CHECKING:
    from pactl.datasets import Manifest


@dataclass(frozen=True)
class Preset:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    source: str = ""  # where the settings come from


_PAPER = "Kim et al., CVPR 2020 (arXiv 2003.13911), official code's README commands"


# The paper's protocol: 60 epochs, the test classes evaluated every epoch and the best reported
# (the official code keeps the best test Recall@1). Not for a user's own data: see USER_*.
_PAPER_PROTOCOL: dict[str, Any] = {"epochs": 60, "val_classes": 0.0, "selection": "test"}


PRESETS: dict[str, Preset] = {
    "digits": Preset(
        model=ModelConfig(
            backbone="small",
            weights="none",
            embedding_dim=64,
            image_size=24,
            resize_size=24,
        ),
        train=TrainConfig(
            epochs=5,
            batch_size=64,
            lr=2e-3,
            weight_decay=1e-4,
            warmup_epochs=0,
            lr_decay_step=3,
            lr_decay_gamma=0.5,
            freeze_bn=False,
            augment="light",
            workers=0,
            val_classes=0.0,  # 5 training digits: too few to hold any out
            selection="last",
        ),
        source="pactl's CPU demo on scikit-learn's digits",
    ),
    "cub200": Preset(
        train=TrainConfig(
            lr=1e-4, lr_decay_step=10, lr_decay_gamma=0.5, freeze_bn=True, **_PAPER_PROTOCOL
        ),
        source=_PAPER,
    ),
    "cars196": Preset(
        train=TrainConfig(
            lr=1e-4, lr_decay_step=20, lr_decay_gamma=0.5, freeze_bn=True, **_PAPER_PROTOCOL
        ),
        source=_PAPER,
    ),
    "sop": Preset(
        train=TrainConfig(
            lr=6e-4,
            lr_decay_step=20,
            lr_decay_gamma=0.25,
            freeze_bn=False,
            eval_ks=(1, 10, 100, 1000),
            **_PAPER_PROTOCOL,
        ),
        source=_PAPER,
    ),
    "inshop": Preset(
        train=TrainConfig(
            lr=6e-4,
            lr_decay_step=20,
            lr_decay_gamma=0.25,
            freeze_bn=False,
            eval_ks=(1, 10, 20, 30, 40, 50),
            **_PAPER_PROTOCOL,
        ),
        source=_PAPER,
    ),
}


# A user's own folder or CSV on a GPU: the paper's recipe (Cars-196 settings) on a torchvision
# ResNet-50, best.pt chosen on held-out validation classes.
USER_GPU = Preset(
    model=ModelConfig(backbone="resnet50"),
    train=TrainConfig(lr_decay_step=20),
    source="pactl default for your own data on a GPU: the paper's recipe on ResNet-50",
)


# ... and on a CPU: EfficientNet-Lite0 at 128 px, minutes rather than hours on a few thousand
# images, on whole images mirrored at random, which beat the paper's 8% crops in mean validation
# Recall@1 over both real sets of bench/, in batches of 32, which the validation classes preferred
# to 64 in 8 of 11 paired runs, by a few images (docs/training.md; docs/benchmarks.md, "The CPU
# recipe re-chosen on validation classes").
USER_CPU = Preset(
    model=ModelConfig(backbone="timm:efficientnet_lite0", image_size=128),
    train=TrainConfig(
        epochs=8,
        batch_size=32,
        lr=3e-4,
        lr_decay_step=4,
        crop_scale=1.0,
        workers=2,
    ),
    source="pactl default for your own data on a CPU: EfficientNet-Lite0 at 128 px, whole "
    "images, batch 32, 8 epochs",
)


# ... and on a CPU from random weights (--weights none): ResNet-18 at 64 px on whole images,
# mirrored at random, at a constant learning rate. The pretrained recipe's network and crops are
# for ImageNet features: from random weights EfficientNet-Lite0 learns little in minutes, and
# crops of 8% of a small image leave too little of it; of whole images as they are, mirrored,
# or lightly cropped, mirrored ones scored best on both real sets' validation classes
# (docs/benchmarks.md, "From random weights").
USER_CPU_SCRATCH = Preset(
    model=ModelConfig(backbone="resnet18", weights="none", image_size=64, resize_size=64),
    train=TrainConfig(
        epochs=12,
        batch_size=128,
        lr=1e-3,
        lr_decay_step=1000,  # constant: no step falls within a run (a time budget keeps it so)
        warmup_epochs=0,
        freeze_bn=False,
        augment="flip",
        workers=2,
    ),
    source="pactl default for your own data on a CPU from random weights: ResNet-18 at 64 px, "
    "whole images mirrored, constant lr 1e-3, 12 epochs",
)


# ... and from random weights on images this small (Fashion-MNIST's 28 px, CIFAR's 32): the
# four-block `small` CNN at the images' own side, for 36 epochs. ResNet-18's stem quarters its
# input before its first block, so a 28 px image upsampled to 64 px reaches it at 16 px and
# costs 5x the pixels; the small CNN keeps full resolution for two blocks and trains 36 epochs
# in less time than ResNet-18 at 64 px trains 12. On both 28 px sets of bench/ (Fashion-MNIST,
# glyphs drawn at 28 px) the validation classes chose it with every seed (one a tie in Recall@1
# that MAP@R broke); on 64 px glyphs they chose ResNet-18 (docs/benchmarks.md, "Small images").
SMALL_IMAGES = 32  # the largest typical side (px) that gets the small CNN from random weights
SMALL_IMAGES_EPOCHS = 36


def scratch_preset(side: int | None) -> Preset:
    """USER_CPU_SCRATCH, or for images of at most SMALL_IMAGES px (`side`: their typical short
    side; None when unknown) the small CNN at that side for SMALL_IMAGES_EPOCHS, the rest of the
    recipe the same."""
    if side is None or side > SMALL_IMAGES:
        return USER_CPU_SCRATCH
    size = max(side, MIN_IMAGE_SIZE)
    return Preset(
        model=dataclasses.replace(
            USER_CPU_SCRATCH.model, backbone="small", image_size=size, resize_size=size
        ),
        train=dataclasses.replace(USER_CPU_SCRATCH.train, epochs=SMALL_IMAGES_EPOCHS),
        source=f"pactl default for your own data on a CPU from random weights, for images of "
        f"{side} px: the small CNN at {size} px, whole images mirrored, constant lr 1e-3, "
        f"{SMALL_IMAGES_EPOCHS} epochs",
    )


def preset_for(
    source: str,
    preset: str | None,
    device_type: str,
    weights: str | None = None,
    side: Callable[[], int | None] = lambda: None,
) -> Preset:
    """The named preset, the dataset's own, or the user-data default for this kind of device
    (on a CPU, the from-scratch one for `weights` none, chosen by the images' typical short
    side, which `side` reads only then)."""
    if preset is not None:
        return PRESETS[preset]
    if source in PRESETS:
        return PRESETS[source]
    if device_type != "cpu":
        return USER_GPU
    return scratch_preset(side()) if weights == "none" else USER_CPU


def implied(
    model: ModelConfig, train: TrainConfig, given: Collection[str]
) -> tuple[TrainConfig, list[str]]:
    """The train settings that others imply, where not `given` (field names set explicitly), with
    the reasons: held-out validation classes are there to choose best.pt; random weights train
    their BatchNorm statistics and skip the warm-up, since a preset's freezing and warm-up are
    for its weights. `pactl train` and each `pactl sweep` point settle their settings here."""
    why = []
    held_out = "val_classes" in given and train.val_classes
    if held_out and "selection" not in given and train.selection != "val":
        train = override(train, selection="val")
        why.append("best.pt chosen by the validation classes --val-classes holds out")
    if model.weights == "none":
        if "freeze_bn" not in given and train.freeze_bn:
            train = override(train, freeze_bn=False)
        if "warmup_epochs" not in given and train.warmup_epochs:
            train = override(train, warmup_epochs=0)
            why.append("no warm-up epochs: a random backbone has no features to protect")
    return train, why


def with_preprocessing(config: ModelConfig) -> ModelConfig:
    """Resize size and filter left open filled from the backbone's weights (config.json and
    --print-config then say what is used)."""
    from pactl.backbones import constructor_for, preprocessing_of
    from pactl.model import fill_resize

    constructor_for(config.backbone)  # an unknown name fails here, before any work
    return fill_resize(config, *preprocessing_of(config.backbone))


@dataclass(frozen=True)
class Recipe:
    """A run's settings as settled, and why they are what they are (--print-config)."""

    model: ModelConfig
    train: TrainConfig
    why: list[str] = field(default_factory=list)


def settle(
    source: str,
    given: Mapping[str, Any],
    device_type: str,
    side: Callable[[], int | None] = lambda: None,
    preset: str | None = None,
    name: Callable[[str], str] = str,
    error: type[PactlError] = UsageError,
) -> Recipe:
    """The recipe for `source` with the settings `given` (by ModelConfig and TrainConfig field
    name; the preset's name checked first, then each setting's name and value): the preset
    (preset_for; `side()` read only where it depends on the images' size), the
    settings given over it, a new image size keeping the preset's resize ratio, what they imply
    (implied), the backbone's preprocessing filled in, every field checked. An error names a
    field as `name(field)` (--image-size for the CLI, `sweep setting image_size` for a sweep)."""
    from pactl.model import check_model_config

    if preset is not None and preset not in PRESETS:
        raise error(f"unknown preset {quoted(preset)}; choose one of {', '.join(PRESETS)}")
    unknown = sorted(k for k in given if not _is_setting(k))
    if unknown:
        raise error(f"{name(unknown[0])} is not a setting of pactl train{_near(unknown[0], name)}")
    for key, value in given.items():  # each checked before any is used: one line, no traceback
        rule = declared(key)["rule"]
        if not rule.ok(value):
            raise error(f"{name(key)} must be {rule.wants} (got {shown(value)})")
    chosen = preset_for(source, preset, device_type, given.get("weights"), side)
    model_given, train_given = split_settings(dict(given))
    model = model_settings(chosen.model, model_given)
    train = dataclasses.replace(chosen.train, **train_given)
    train, why = implied(model, train, given)
    why.insert(0, f"settings: {chosen.source}")
    model = with_preprocessing(model)
    check_model_config(model, name=name, error=error)
    check(train, name, error)
    return Recipe(model, train, why)


def _near(key: str, name: Callable[[str], str]) -> str:
    """` (did you mean --batch-size?)` for a key close to a setting's name, else ''."""
    import difflib

    settings = [f.name for cls in (ModelConfig, TrainConfig) for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, settings, n=1)
    return f" (did you mean {name(close[0])}?)" if close else ""


def _is_setting(name: str) -> bool:
    try:
        declared(name)
    except KeyError:
        return False
    return True


def model_settings(preset: ModelConfig, given: Mapping[str, Any]) -> ModelConfig:
    """The preset's model with the settings given; a new image size keeps the preset's own
    resize-to-crop ratio (24/24 for digits) unless a resize size is given too; --bits N makes
    the embedding N-d (its signs are the codes) unless --dim is given too."""
    model = dataclasses.replace(preset, **given)
    if model.bits and "embedding_dim" not in given:
        model = override(model, embedding_dim=model.bits)
    size = given.get("image_size")
    if size and "resize_size" not in given and preset.resize_size:
        ratio = preset.resize_size / preset.image_size
        model = override(model, resize_size=round(size * ratio))
    return model


def resolve_train_config(
    model_cfg: ModelConfig, cfg: TrainConfig, distributed: bool
) -> TrainConfig:
    """Settings left to pactl (None) made concrete: BatchNorm frozen only for pretrained weights
    (random statistics never become right if they cannot move); SyncBatchNorm across GPUs when
    BatchNorm trains under torchrun."""
    from pactl.runtime import resolve_device

    freeze = cfg.freeze_bn if cfg.freeze_bn is not None else model_cfg.weights != "none"
    sync = cfg.sync_bn
    if sync is None:
        sync = distributed and not freeze and resolve_device(cfg.device).type == "cuda"
    return dataclasses.replace(cfg, freeze_bn=freeze, sync_bn=sync)


def explain(model_cfg: ModelConfig, cfg: TrainConfig) -> list[str]:
    """Why the resolved settings are what they are (for --print-config)."""
    pretrained = model_cfg.weights != "none"
    return [
        f"BatchNorm {'frozen' if cfg.freeze_bn else 'trains'}: "
        + (
            "pretrained weights keep their statistics (--no-freeze-bn to train them)"
            if cfg.freeze_bn and pretrained
            else "random weights need statistics that move"
            if not cfg.freeze_bn and not pretrained
            else "as asked (--freeze-bn/--no-freeze-bn)"
        ),
        f"best.pt chosen by {CHOSEN_BY[cfg.selection].recipe}"
        + (
            f"; {cfg.val_classes:.0%} of the train classes held out (the data is not read here:"
            " a manifest's own val split is used instead, and with too few train classes to hold"
            " out, best.pt is the last epoch; the run's first lines say which)"
            if cfg.val_classes
            else ""
        ),
        describe_test_resize(model_cfg),
        describe_augment(model_cfg, cfg),
        describe_optimiser(cfg),
        describe_schedule(cfg),
        *describe_budget(cfg),
        *describe_codes(model_cfg, cfg),
    ]


def describe_codes(model_cfg: ModelConfig, cfg: TrainConfig) -> list[str]:
    """What a --bits network learns and how its epochs are scored (pactl.codes.learned)."""
    bits = model_cfg.bits
    if not bits:
        return []
    proxies = {
        "learned": f"{cfg.loss} with its proxies learned",
        "hadamard": "fixed binary proxies (CSQ's hash centres: the rows of a "
        f"{bits} x {bits} Hadamard matrix and their negatives, while they suffice) learned "
        "towards with OrthoHash's cross-entropy over cosines (scale 8, margin 0.2)",
    }[cfg.code_proxies]
    return [
        f"{bits}-bit codes: the signs of the {bits}-d vectors; {proxies}, plus "
        f"{cfg.quantization:g} x the quantisation term 1 - cos(v, sign v); every epoch is "
        "scored by the codes' Hamming distance (ties broken by id), which chooses best.pt; "
        "pactl index of its vectors makes a binary index"
    ]


def describe_test_resize(model_cfg: ModelConfig) -> str:
    """How test images are sized, and why."""
    if model_cfg.resize_size == model_cfg.image_size:
        scratch = model_cfg.weights == "none"
        why = ": random weights come with no crop of their own" if scratch else ""
        whole = f"test images resized whole to {model_cfg.image_size} px"
        return f"{whole}, {model_cfg.interpolation}{why}"
    return (
        f"test resize {model_cfg.resize_size} px, {model_cfg.interpolation}, centre crop "
        f"{model_cfg.image_size}: what the backbone's weights were evaluated with"
    )


def describe_augment(model_cfg: ModelConfig, cfg: TrainConfig) -> str:
    """What training does to each image (pactl.transforms.AUGMENTS), in words."""
    side = model_cfg.image_size
    crops = (
        "whole images (cut to an aspect ratio of 3:4 to 4:3)"
        if cfg.crop_scale == 1
        else f"random crops of {cfg.crop_scale:.0%} to all of each image's area"
    )
    words = {
        "rrc_flip": f"{crops} resized to {side} px, mirrored half the time"
        + (" (the paper's)" if cfg.crop_scale == 0.08 else ""),
        "flip": "each image as the test transform gives it, mirrored half the time",
        "light": f"whole images resized to {side} px, shifted, turned and scaled a little "
        "(no mirror)",
        "none": "each image as the test transform gives it, with no random change",
    }
    return f"augmentation {cfg.augment}: {words.get(cfg.augment, cfg.augment)}"


def describe_budget(cfg: TrainConfig) -> list[str]:
    if not cfg.time_budget:
        return []
    budget = duration_words(cfg.time_budget)
    return [
        f"time budget {budget}: after epoch 0, the epochs are fitted to it "
        "from the measured step and evaluation times, the decay step and warm-up scaled from the "
        "schedule above (its shape, not its length); fitted again after the first epoch that "
        "trains everything, from its measured time; the run stops early if an epoch would "
        "end past it"
    ]


def describe_optimiser(cfg: TrainConfig) -> str:
    """The optimiser as build_trainer makes it (param_groups); a loss without proxies (triplet,
    contrastive, multi-similarity) has no group of its own."""
    from pactl.losses import build_loss

    proxies = any(True for _ in build_loss(cfg.loss, 2, 2, cfg.alpha, cfg.delta).parameters())
    return (
        f"optimiser AdamW: lr {cfg.lr:g} for the backbone and the head"
        + (
            f", {cfg.lr * cfg.proxy_lr_mult:g} for the proxies (x{cfg.proxy_lr_mult:g})"
            if proxies
            else f" ({cfg.loss} has no proxies)"
        )
        + f", weight decay {cfg.weight_decay:g}"
        + (f", gradients clipped at {cfg.grad_clip:g}" if cfg.grad_clip > 0 else "")
    )


def describe_schedule(cfg: TrainConfig, shown: int = 4) -> str:
    """The learning-rate schedule as build_trainer makes it (StepLR, stepped once an epoch),
    with the epochs after which the rate falls within this run."""
    steps = list(range(cfg.lr_decay_step, cfg.epochs, cfg.lr_decay_step))
    warm = (
        f"; the first {counted(cfg.warmup_epochs, 'epoch')} train only the head and the proxies"
        if cfg.warmup_epochs
        else ""
    )
    if not steps:
        return (
            f"schedule: constant lr {cfg.lr:g} for {counted(cfg.epochs, 'epoch')} (step decay "
            f"every {cfg.lr_decay_step} epochs never falls within the run){warm}"
        )
    listed = ", ".join(str(s) for s in steps[:shown]) + (", ..." if len(steps) > shown else "")
    final = cfg.lr * cfg.lr_decay_gamma ** len(steps)
    return (
        f"schedule: step decay, lr x{cfg.lr_decay_gamma:g} every {cfg.lr_decay_step} epochs "
        f"(after epochs {listed}; {cfg.lr:g} -> {final:.3g} by epoch {cfg.epochs}){warm}"
    )


def describe_recipe(
    model_cfg: ModelConfig, cfg: TrainConfig, train: Manifest, val: Manifest, test: Manifest
) -> str:
    """The resolved recipe in one line."""
    bn = "frozen" if cfg.freeze_bn else "synced" if cfg.sync_bn else "training"
    amp = "" if cfg.amp == "none" else f", amp {cfg.amp}"
    size = f"{model_cfg.image_size} px"
    parts = [
        f"recipe: {model_cfg.backbone} ({weights_words(model_cfg.weights)}) at {size}",
        f"dim {model_cfg.embedding_dim}"
        + (f" ({model_cfg.bits}-bit codes, scored by Hamming)" if model_cfg.bits else "")
        + f", {counted(cfg.epochs, 'epoch')} of batch {cfg.batch_size}",
        f"lr {cfg.lr:g} (x{cfg.proxy_lr_mult:g} proxies), BatchNorm {bn}{amp}",
        f"{_count(train)} train, {_count(val)} val, {_count(test)} test",
        f"best.pt chosen by {CHOSEN_BY[cfg.selection].recipe}",
    ]
    return "; ".join(parts)


@dataclass(frozen=True)
class Chooser:
    """What chooses best.pt (TrainConfig.selection), in words: as the recipe says it, and as a
    run's last line says what chose its best epoch."""

    recipe: str
    result: str


CHOSEN_BY = {
    "val": Chooser("validation Recall@1 (then MAP@R)", "validation Recall@1, then MAP@R"),
    "test": Chooser(
        "test Recall@1 (then MAP@R; the paper's protocol)", "test Recall@1, then MAP@R"
    ),
    "last": Chooser("the last epoch", "last epoch"),
}


def _count(part: Manifest) -> str:
    import numpy as np

    return f"{len(part)} images / {len(np.unique(part.labels))} classes"
