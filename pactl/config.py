"""Frozen configuration dataclasses and the paper's per-dataset presets.

Every artifact pactl writes carries the config that made it (config.json, checkpoint.pt,
meta.json), so each can be rebuilt from its own metadata.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
    pooling: str = "avg+max"  # global average + global max pooling, summed (official head)
    dimension: int | None = None  # the vectors' size, filled in when the network is built


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 60  # passes over the training split
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
    augment: str = "rrc_flip"  # train-time augmentation: rrc_flip | light | none
    sampler: str = "shuffle"  # shuffle | m_per_class
    m_per_class: int = 4  # images per class in a batch with the m_per_class sampler
    eval_ks: tuple[int, ...] = (1, 2, 4, 8)  # Recall@K reported each epoch
    eval_every: int = 1  # evaluate every this many epochs (and always after the last)
    val_classes: float = 0.15  # share of the train classes held out to choose best.pt (0: none)
    selection: str = "val"  # split whose Recall@1 chooses best.pt: val | test | last
    seed: int = 0  # seeds model init, sampling and augmentation
    workers: int = 4  # DataLoader worker processes
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "none"  # none | bf16 | fp16 autocast; the loss always runs in float32
    channels_last: bool = True  # NHWC memory layout for convolutions (much faster on CPUs too)
    compile: bool = False  # torch.compile the model


@dataclass(frozen=True)
class IndexConfig:
    factory: str | None = None  # a FAISS factory string; None chooses by collection size
    target_recall: float = 0.95  # Recall@10 against exact search the tuned index must reach
    memory_budget_gb: float = 8.0  # the default index must fit in this much memory
    on_disk: str = "auto"  # auto | yes | no: shards' IVF lists merged on disk (auto: over budget)


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
# images (docs/training.md and docs/benchmarks.md have the measured figures behind each value).
USER_CPU = Preset(
    model=ModelConfig(backbone="timm:efficientnet_lite0", image_size=128),
    train=TrainConfig(
        epochs=8,
        batch_size=64,
        lr=3e-4,
        lr_decay_step=4,
        workers=2,
    ),
    source="pactl default for your own data on a CPU: EfficientNet-Lite0 at 128 px, 8 epochs",
)


def preset_for(source: str, preset: str | None, device_type: str) -> Preset:
    """The named preset, the dataset's own, or the user-data default for this kind of device."""
    if preset is not None:
        return PRESETS[preset]
    if source in PRESETS:
        return PRESETS[source]
    return USER_CPU if device_type == "cpu" else USER_GPU


C = TypeVar("C", ModelConfig, TrainConfig, IndexConfig)


def override(config: C, **changes: Any) -> C:
    """A copy of `config` with the given fields changed; `None` values are ignored."""
    given = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(config, **given)


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def from_dict(cls: type[C], data: dict[str, Any]) -> C:
    """Rebuild a config from its dict, turning lists back into tuples, ignoring unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names
    }
    return cls(**values)
