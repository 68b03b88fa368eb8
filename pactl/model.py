"""EmbeddingNet: backbone -> pooling (global average + global max by default) -> Linear(dim) -> L2
norm."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pactl.backbones import Backbone, build_backbone, constructor_for
from pactl.config import ModelConfig, check
from pactl.errors import PactlError

# A crop side that fails is looked up to this size for the smallest one that works.
PROBE_UP_TO = 64
VANISHES = "too small for the backbone: its feature map vanishes"


def _class_token(features: torch.Tensor) -> torch.Tensor:
    return features[:, :, 0, 0]  # tokens arrive as (B, C, 1, N), the class token first


# (B, C, h, w) feature map -> (B, C); a transformer's N tokens arrive as (B, C, 1, N).
POOLINGS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "avg+max": lambda f: f.mean(dim=(2, 3)) + f.amax(dim=(2, 3)),  # the official head
    "avg": lambda f: f.mean(dim=(2, 3)),
    "max": lambda f: f.amax(dim=(2, 3)),
    "token": _class_token,
}


class TrainingMean(nn.Module):
    """At test, each output less the running mean of the outputs training saw; training passes
    them through unchanged and keeps that mean up to date (momentum 0.1, as BatchNorm's)."""

    def __init__(self, size: int, momentum: float = 0.1) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, D) -> (B, D)
        running = self.running_mean
        assert isinstance(running, torch.Tensor)
        if not self.training:
            return x - running.to(x.dtype)
        with torch.no_grad():
            running.lerp_(x.detach().mean(dim=0).to(running.dtype), self.momentum)
        return x


class EmbeddingNet(nn.Module):
    """embedding_dim 0: no head, the pooled backbone features themselves (the baseline a
    pretrained network gives before any training). `bits`: a code network's head
    (pactl.codes.learned), its outputs centred at test on the mean of those training saw
    (TrainingMean)."""

    def __init__(
        self,
        backbone: nn.Module,
        feat_dim: int,
        embedding_dim: int,
        pooling: str = "avg+max",
        bits: int = 0,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.pool = POOLINGS[pooling]
        self.embedding: nn.Module = nn.Identity()
        if embedding_dim:
            linear = nn.Linear(feat_dim, embedding_dim)
            # The official head's initialisation.
            nn.init.kaiming_normal_(linear.weight, mode="fan_out")
            nn.init.zeros_(linear.bias)
            self.embedding = linear
        if embedding_dim and bits:
            # Signs of outputs that share a common direction leave most bits nearly constant;
            # centred on the training mean, each bit splits the images about evenly. Centring
            # only at test leaves the loss what it sees without (centring each training batch,
            # or BatchNorm, slowed Proxy-Anchor down: docs/benchmarks.md, "Learned binary codes").
            self.embedding = nn.Sequential(linear, TrainingMean(bits))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.backbone(images)  # (B, C, h, w)
        pooled = self.pool(features)  # (B, C)
        return F.normalize(self.embedding(pooled).float(), dim=1)  # (B, dim), unit rows

    def head_parameters(self) -> list[nn.Parameter]:
        return list(self.embedding.parameters())


def build_model(config: ModelConfig, seed: int = 0) -> tuple[EmbeddingNet, ModelConfig]:
    """The network for `config`, and the config with the backbone's preprocessing filled in."""
    check_model_config(config, trained=False, name=lambda field: f"model_config.{field}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        backbone = build_backbone(config.backbone, config.weights)
        model = EmbeddingNet(
            backbone.module, backbone.feat_dim, config.embedding_dim, config.pooling, config.bits
        )
    return model, resolve_preprocessing(config, backbone)


def resolve_preprocessing(config: ModelConfig, backbone: Backbone) -> ModelConfig:
    """Fill what the config leaves to the backbone: normalisation, resize filter, crop fraction."""
    filled = dataclasses.replace(
        config,
        dimension=config.embedding_dim or backbone.feat_dim,
        mean=config.mean if config.mean is not None else backbone.mean,
        std=config.std if config.std is not None else backbone.std,
    )
    return fill_resize(filled, backbone.interpolation, backbone.crop_pct)


def fill_resize(config: ModelConfig, interpolation: str, crop_pct: float) -> ModelConfig:
    """The test-time resize (crop / crop fraction) and filter, where the config leaves them."""
    return dataclasses.replace(
        config,
        resize_size=config.resize_size or round(config.image_size / crop_pct),
        interpolation=config.interpolation or interpolation,
    )


def check_model_config(
    config: ModelConfig,
    trained: bool = True,
    name: Callable[[str], str] = lambda field: f"model_config.{field}",
    error: type[PactlError] = PactlError,
) -> None:
    """Refuse impossible settings before any work: each field in its range (pactl.config), a
    known backbone that takes crops of this size, and, when `trained`, a head to learn (0
    dimensions is for baselines only). `name` says where a field came from (an option, or a
    file and key) for the one-line `error`."""
    check(config, name, error)
    if trained and config.embedding_dim < 1:
        raise error(f"{name('embedding_dim')} must be positive (got {config.embedding_dim})")
    try:
        constructor_for(config.backbone)
    except KeyError as e:
        raise error(f"{name('backbone')}: {e.args[0]}") from None
    problem = input_problem(config)
    if problem is not None:
        raise error(f"{name('image_size')} {config.image_size}: {problem}")
    if config.pooling == "token" and not has_class_token(config.backbone):
        raise error(
            f"{name('pooling')} token takes a transformer's class token, and {config.backbone} "
            "has none; use a timm ViT (timm:vit_small_patch16_224, ...) or avg+max, avg, max"
        )


@functools.lru_cache(maxsize=64)
def has_class_token(backbone: str) -> bool:
    """Whether the backbone's features are tokens led by a class token (meta device: no
    weights; remembered per backbone, as the architecture does not change)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        module = build_backbone(backbone, "none").module
    return bool(getattr(module, "class_token", False))


def input_problem(config: ModelConfig) -> str | None:
    """Why the backbone cannot take crops of config.image_size px, or None when it can."""
    return size_problem(config.backbone, config.image_size)


@functools.lru_cache(maxsize=256)
def size_problem(backbone: str, side: int) -> str | None:
    """input_problem for a backbone name and crop side. Tried on the bare architecture on the
    meta device: shapes only, no weights, no memory; still half a second for a timm network,
    so remembered (a sweep checks every point's config, and every checkpoint it loads)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        module = build_backbone(backbone, "none").module.eval()
    problem = _fails(module, side)
    if problem != VANISHES:
        return problem  # None, or the backbone's own words on which sizes it takes
    works = [s for s in range(side + 1, PROBE_UP_TO + 1) if not _fails(module, s)]
    return problem + (f"; use at least {works[0]}" if works else "")


def _fails(module: nn.Module, side: int) -> str | None:
    try:
        with torch.no_grad():
            features = module(torch.zeros(1, 3, side, side, device="meta"))  # (1, C, h, w)
    except PactlError as e:
        return str(e)
    except NotImplementedError:
        return None  # an operation without shape rules on the meta device: cannot tell
    except (RuntimeError, ValueError):
        return VANISHES
    except Exception as e:  # timm's fixed-size transformers assert their input size
        return f"the backbone refuses it ({str(e)[:120]})"
    return VANISHES if features.dim() != 4 or min(features.shape) == 0 else None


def freeze_batchnorm(model: nn.Module) -> None:
    """Keep BatchNorm running statistics fixed (as the official code does for CUB and Cars)."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()
