"""Frozen configuration dataclasses and the paper's per-dataset presets.

Every artifact pactl writes carries the config that made it (config.json, checkpoint.pt,
meta.json), so each can be rebuilt from its own metadata.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pactl.errors import PactlError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ModelConfig:
    backbone: str = "bn_inception"  # a name in pactl.backbones.BACKBONES (or timm:<name>)
    weights: str = "imagenet"  # none | imagenet | path to a state_dict file
    embedding_dim: int = 512  # size of the L2-normalised embedding; 0: the pooled features
    image_size: int = 224  # side of the square crop the network sees
    resize_size: int | None = None  # test-time resize before the centre crop; None: image_size
    # divided by the crop fraction the backbone's weights were evaluated with (224/256 mostly)
    mean: tuple[float, ...] | None = None  # per-channel normalisation in [0, 1] units;
    std: tuple[float, ...] | None = None  # None: what the backbone's weights expect
    interpolation: str | None = None  # resize filter (bilinear | bicubic); None: the backbone's
    pooling: str = "avg+max"  # global average + global max pooling, summed (official head);
    # avg | max alone; token: a transformer's class token (timm ViT, DeiT, EVA...)
    dimension: int | None = None  # the vectors' size, filled in when the network is built


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 60  # passes over the training split
    time_budget: float = 0.0  # seconds the run may take, epochs fitted to it (pactl.budget); 0: off
    batch_size: int = 180  # images per optimiser step (global, across all processes)
    lr: float = 1e-4  # AdamW learning rate of the network
    weight_decay: float = 1e-4  # AdamW weight decay
    proxy_lr_mult: float = 100.0  # proxies learn this much faster than the network
    alpha: float = 32.0  # Proxy-Anchor scaling
    delta: float = 0.1  # Proxy-Anchor margin
    loss: str = "proxy_anchor"  # a name in pactl.losses.LOSSES
    warmup_epochs: int = 1  # epochs that train only the head and the proxies
    lr_decay_step: int = 10  # step decay period in epochs
    lr_decay_gamma: float = 0.5  # step decay factor
    freeze_bn: bool | None = None  # keep BatchNorm statistics fixed; None: when pretrained
    sync_bn: bool | None = None  # SyncBatchNorm under torchrun; None: when BatchNorm trains
    grad_clip: float = 10.0  # clip gradient values (as the official loop does); 0 disables
    augment: str = "rrc_flip"  # train-time augmentation: rrc_flip | flip | light | none
    crop_scale: float = 0.08  # rrc_flip's smallest crop, as a share of the image's area
    sampler: str = "shuffle"  # shuffle | m_per_class
    m_per_class: int = 4  # images per class in a batch with the m_per_class sampler
    eval_ks: tuple[int, ...] = (1, 2, 4, 8)  # Recall@K reported each epoch
    eval_every: int = 1  # evaluate every this many epochs (and always after the last)
    val_classes: float = 0.15  # share of the train classes held out to choose best.pt (0: none)
    selection: str = "val"  # split whose Recall@1 chooses best.pt: val | test | last
    seed: int = 0  # seeds model init, sampling and augmentation
    precision: float = 0.99  # same-item precision the calibrated cosine threshold reaches
    workers: int = 4  # DataLoader worker processes
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "none"  # none | bf16 | fp16 autocast; the loss always runs in float32
    channels_last: bool = True  # NHWC memory layout for convolutions (much faster on CPUs too)
    compile: bool = False  # torch.compile the model
    follow_links: bool = False  # read images through links that lead out of the source folder
    tensorboard: bool = False  # log loss, lr and metrics per epoch to <run>/tensorboard


@dataclass(frozen=True)
class IndexConfig:
    factory: str | None = None  # a FAISS factory string; None chooses by collection size
    target_recall: float = 0.95  # Recall@10 against exact search the tuned index must reach
    memory_budget_gb: float = 8.0  # the default index must fit in this much memory
    on_disk: str = "auto"  # auto | yes | no: shards' IVF lists merged on disk (auto: over budget)
    faiss_device: str = "auto"  # auto | cpu | gpu: where FAISS trains, adds and searches exactly


# ONNX export: torch's default opset for its exporters (torch.onnx's ONNX_DEFAULT_OPSET, 2.5 to
# 2.14); 17 brings LayerNormalization (timm's transformers), onnxruntime 1.18 runs up to 21
ONNX_OPSET, ONNX_MIN_OPSET, ONNX_MAX_OPSET = 20, 17, 21


@dataclass(frozen=True)
class OnnxConfig:
    opset: int = ONNX_OPSET  # ONNX operator set the graph is written in
    check_images: int = 3  # random images run by torch and onnxruntime before the file is kept
    tolerance: float = 1e-4  # their vectors' least cosine must be 1 - tolerance or more


@dataclass(frozen=True)
class ParquetConfig:
    rows_per_shard: int = 1_000_000  # vectors per .npy shard (2 GB of 512-d float32)


@dataclass(frozen=True)
class QdrantConfig:
    collection: str = "pactl"  # the collection's name
    batch_size: int = 256  # points per upsert (and per lookup of the ids already there)


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


C = TypeVar("C", ModelConfig, TrainConfig, IndexConfig)


def override(config: C, **changes: Any) -> C:
    """A copy of `config` with the given fields changed; `None` values are ignored."""
    given = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(config, **given)


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


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Rebuild a config from its dict, turning lists back into tuples, ignoring unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names
    }
    return cls(**values)


# ---------------------------------------------------------------------------- checking values
#
# Every config is checked field by field before it is used, whether it comes from the command
# line, a run's config.json or a checkpoint: a value out of range fails late (a seed of -1 in
# the sampler, a NaN learning rate after an epoch) or costs a lot before it fails (an image side
# of 20000 asks for gigabytes per batch).

MIN_IMAGE_SIZE = 8  # the smallest crop side; a backbone may need more (pactl.model checks it)
MAX_IMAGE_SIZE = 4096  # a batch of 4096 px crops already takes gigabytes
MAX_RESIZE_SIZE = 2 * MAX_IMAGE_SIZE
MAX_EMBEDDING_DIM = 8192
MAX_DIMENSION = 65536  # pooled features of any backbone
MAX_EPOCHS = 100_000
MAX_BATCH_SIZE = 65_536
COMMIT_EVERY = 4096  # images between progress commits of an embed (a kill loses at most these)
MAX_COMMIT_EVERY = 10_000_000
MAX_WORKERS = 256
MAX_SEED = 2**32 - 1  # seeds are mixed with epochs and ranks and must stay within 64 bits
MAX_K = 1_000_000  # Recall@K: K neighbours per query
INTERPOLATIONS = ("nearest", "nearest-exact", "bilinear", "bicubic", "box", "hamming", "lanczos")
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d{1,4})?")


@dataclass(frozen=True)
class Rule:
    """What a field must hold, in words for the message, and the test."""

    wants: str
    ok: Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def integer(low: int, high: int) -> Rule:
    return Rule(f"an integer from {low:,} to {high:,}", lambda v: _is_int(v) and low <= v <= high)


def number(low: float, high: float, above: bool = False) -> Rule:
    """A finite number in [low, high], or in (low, high] when `above`."""
    wants = f"a number {'above' if above else 'from'} {low:g} {'and at most' if above else 'to'}"
    return Rule(
        f"{wants} {high:g}",
        lambda v: _is_number(v) and (low < v if above else low <= v) and v <= high,
    )


def choice(*names: str) -> Rule:
    return Rule(f"one of {', '.join(names)}", lambda v: isinstance(v, str) and v in names)


def text() -> Rule:
    return Rule("a non-empty string", lambda v: isinstance(v, str) and v != "" and "\0" not in v)


def flag() -> Rule:
    return Rule("true or false", lambda v: isinstance(v, bool))


def optional(rule: Rule) -> Rule:
    return Rule(f"{rule.wants}, or null", lambda v: v is None or rule.ok(v))


def numbers(count: int, item: Rule) -> Rule:
    return Rule(
        f"{count} numbers, each {item.wants}",
        lambda v: isinstance(v, tuple) and len(v) == count and all(item.ok(x) for x in v),
    )


def device() -> Rule:
    return Rule(
        "auto, cpu, mps, cuda or cuda:N",
        lambda v: isinstance(v, str) and DEVICE_PATTERN.fullmatch(v) is not None,
    )


MODEL_RULES: dict[str, Rule] = {
    "backbone": text(),
    "weights": text(),
    "embedding_dim": integer(0, MAX_EMBEDDING_DIM),
    "image_size": integer(MIN_IMAGE_SIZE, MAX_IMAGE_SIZE),
    "resize_size": optional(integer(MIN_IMAGE_SIZE, MAX_RESIZE_SIZE)),
    "mean": optional(numbers(3, number(0, 1))),
    "std": optional(numbers(3, number(0, 1, above=True))),
    "interpolation": optional(choice(*INTERPOLATIONS)),
    "pooling": choice("avg+max", "avg", "max", "token"),
    "dimension": optional(integer(1, MAX_DIMENSION)),
}

TRAIN_RULES: dict[str, Rule] = {
    "epochs": integer(1, MAX_EPOCHS),
    "time_budget": number(0, 365 * 86400),
    "batch_size": integer(2, MAX_BATCH_SIZE),  # a step needs two images to compare
    "lr": number(0, 10, above=True),
    "weight_decay": number(0, 10),
    "proxy_lr_mult": number(0, 1e6, above=True),
    "alpha": number(0, 1e4, above=True),
    "delta": number(0, 1),
    "loss": text(),  # a registry name: pactl.losses checks it
    "warmup_epochs": integer(0, MAX_EPOCHS),
    "lr_decay_step": integer(1, MAX_EPOCHS),
    "lr_decay_gamma": number(0, 1, above=True),
    "freeze_bn": optional(flag()),
    "sync_bn": optional(flag()),
    "grad_clip": number(0, 1e6),
    "augment": choice("rrc_flip", "flip", "light", "none"),
    "crop_scale": number(0, 1, above=True),
    "sampler": choice("shuffle", "m_per_class"),
    "m_per_class": integer(1, MAX_BATCH_SIZE),
    "eval_ks": Rule(
        f"1 to 32 integers from 1 to {MAX_K:,}",
        lambda v: (
            isinstance(v, tuple) and 0 < len(v) <= 32 and all(integer(1, MAX_K).ok(k) for k in v)
        ),
    ),
    "eval_every": integer(1, MAX_EPOCHS),
    "val_classes": number(0, 0.9),
    "selection": choice("val", "test", "last"),
    "seed": integer(0, MAX_SEED),
    "precision": number(0, 1, above=True),
    "workers": integer(0, MAX_WORKERS),
    "device": device(),
    "amp": choice("none", "bf16", "fp16"),
    "channels_last": flag(),
    "compile": flag(),
    "follow_links": flag(),
    "tensorboard": flag(),
}


INDEX_RULES: dict[str, Rule] = {
    "factory": optional(text()),
    "target_recall": number(0, 1),
    "memory_budget_gb": number(0, 1e6, above=True),
    "on_disk": choice("auto", "yes", "no"),
    "faiss_device": choice("auto", "cpu", "gpu"),
}


def problems(config: ModelConfig | TrainConfig | IndexConfig) -> list[tuple[str, str]]:
    """(field, what is wrong) for each field of `config` that breaks its rule, then for settings
    that do not go together."""
    rules = {ModelConfig: MODEL_RULES, TrainConfig: TRAIN_RULES, IndexConfig: INDEX_RULES}
    found = []
    for name, rule in rules[type(config)].items():
        value = getattr(config, name)
        if not rule.ok(value):
            found.append((name, f"must be {rule.wants} (got {_shown(value)})"))
    if found:
        return found
    if isinstance(config, ModelConfig):
        if config.resize_size is not None and config.resize_size < config.image_size:
            found.append(("resize_size", f"must be at least the image size {config.image_size}"))
        if config.embedding_dim and config.dimension not in (None, config.embedding_dim):
            found.append(("dimension", f"must equal the embedding size {config.embedding_dim}"))
    elif (
        isinstance(config, TrainConfig)
        and config.sampler == "m_per_class"
        and config.batch_size % config.m_per_class
    ):
        found.append(
            ("m_per_class", f"{config.m_per_class} must divide the batch size {config.batch_size}")
        )
    return found


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def check(config: C, name: Callable[[str], str], error: type[PactlError] = PactlError) -> C:
    """`config` when every field keeps its rule, else `error` naming the first bad field as
    `name(field)` (an option, or a file and key)."""
    found = problems(config)
    if found:
        field_name, wrong = found[0]
        raise error(f"{name(field_name)} {wrong}")
    return config


def read_config(cls: type[C], data: Any, where: str) -> C:
    """A config rebuilt from a file's dict and checked; `where` names the dict ("FILE:
    model_config") in the one-line error."""
    if not isinstance(data, dict):
        raise PactlError(f"{where} should be a mapping of settings, not {type(data).__name__}")
    return check(from_dict(cls, data), lambda name: f"{where}.{name}")


def weights_words(weights: str) -> str:
    """How a line names `--weights`: ImageNet weights, random weights, or the file."""
    return {"imagenet": "ImageNet weights", "none": "random weights"}.get(
        weights, f"weights {weights}"
    )
