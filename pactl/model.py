"""EmbeddingNet: backbone -> global average + global max pooling -> Linear(dim) -> L2 norm."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from pactl.backbones import Backbone, build_backbone
from pactl.config import ModelConfig
from pactl.errors import PactlError


class EmbeddingNet(nn.Module):
    """embedding_dim 0: no head, the pooled backbone features themselves (the baseline a
    pretrained network gives before any training)."""

    def __init__(self, backbone: nn.Module, feat_dim: int, embedding_dim: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.embedding: nn.Module = nn.Identity()
        if embedding_dim:
            self.embedding = nn.Linear(feat_dim, embedding_dim)
            # The official head's initialisation.
            nn.init.kaiming_normal_(self.embedding.weight, mode="fan_out")
            nn.init.zeros_(self.embedding.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.backbone(images)  # (B, C, h, w)
        pooled = features.mean(dim=(2, 3)) + features.amax(dim=(2, 3))  # (B, C)
        return F.normalize(self.embedding(pooled).float(), dim=1)  # (B, dim), unit rows

    def head_parameters(self) -> list[nn.Parameter]:
        return list(self.embedding.parameters())


def build_model(config: ModelConfig, seed: int = 0) -> tuple[EmbeddingNet, ModelConfig]:
    """The network for `config`, and the config with the backbone's preprocessing filled in."""
    check_model_config(config, trained=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        backbone = build_backbone(config.backbone, config.weights)
        model = EmbeddingNet(backbone.module, backbone.feat_dim, config.embedding_dim)
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


def check_model_config(config: ModelConfig, trained: bool = True) -> None:
    """Refuse impossible settings; `trained`: a head to learn (0 dims is for baselines only)."""
    if config.embedding_dim < (1 if trained else 0):
        raise PactlError(f"--dim must be positive (got {config.embedding_dim})")
    resize = config.resize_size if config.resize_size is not None else config.image_size
    if config.image_size <= 0 or resize < config.image_size:
        raise PactlError(
            f"--image-size must be positive and at most --resize-size "
            f"(got {config.image_size} and {config.resize_size})"
        )


def freeze_batchnorm(model: nn.Module) -> None:
    """Keep BatchNorm running statistics fixed (as the official code does for CUB and Cars)."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()
