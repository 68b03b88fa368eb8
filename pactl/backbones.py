"""BACKBONES: name -> constructor returning the feature extractor and its preprocessing.

A backbone maps images (B, 3, H, W) to a feature map (B, C, h, w); the embedding head
(pactl.model) pools it. Preprocessing (mean/std) travels with the model in ModelConfig.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pactl import bn_inception
from pactl.config import IMAGENET_MEAN, IMAGENET_STD
from pactl.errors import PactlError


@dataclass(frozen=True)
class Backbone:
    module: nn.Module  # images (B, 3, H, W) -> features (B, feat_dim, h, w)
    feat_dim: int
    mean: tuple[float, ...]  # the normalisation its weights expect, in [0, 1] units
    std: tuple[float, ...]


# constructor(pretrained) -> Backbone
Constructor = Callable[[bool], Backbone]


def _small(pretrained: bool) -> Backbone:
    """A four-block CNN for the CPU and the tests; it has no pretrained weights."""
    if pretrained:
        raise PactlError("backbone 'small' has no pretrained weights; use --weights none")

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    module = nn.Sequential(
        *block(3, 16),
        *block(16, 32),
        nn.MaxPool2d(2),
        *block(32, 64),
        nn.MaxPool2d(2),
        *block(64, 128),
    )
    return Backbone(module, 128, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def _torchvision(name: str, weights_enum: str, feat_dim: int) -> Constructor:
    """A torchvision classifier with its pooling and classifier removed."""

    def build(pretrained: bool) -> Backbone:
        import torchvision

        weights = getattr(torchvision.models, weights_enum).DEFAULT if pretrained else None
        kwargs = {"aux_logits": False, "init_weights": False} if name == "googlenet" else {}
        net = getattr(torchvision.models, name)(weights=weights, **kwargs)
        children = dict(net.named_children())
        stop = next(i for i, key in enumerate(children) if key in ("avgpool", "fc"))
        body = nn.Sequential(*[m for key, m in list(children.items())[:stop] if key != "aux1"])
        if getattr(net, "transform_input", False):
            # torchvision's GoogLeNet weights expect inputs in (x - 0.5) / 0.5, a step its
            # forward() does and the bare body skips: ask for that normalisation instead.
            return Backbone(body, feat_dim, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        return Backbone(body, feat_dim, IMAGENET_MEAN, IMAGENET_STD)

    return build


BACKBONES: dict[str, Constructor] = {
    "small": _small,
    "bn_inception": lambda pretrained: Backbone(
        bn_inception.bn_inception(pretrained),
        bn_inception.FEAT_DIM,
        bn_inception.MEAN,
        bn_inception.STD,
    ),
    "resnet18": _torchvision("resnet18", "ResNet18_Weights", 512),
    "resnet50": _torchvision("resnet50", "ResNet50_Weights", 2048),
    "resnet101": _torchvision("resnet101", "ResNet101_Weights", 2048),
    "googlenet": _torchvision("googlenet", "GoogLeNet_Weights", 1024),
}


def constructor_for(name: str) -> Constructor:
    """The registry entry for `name`; a KeyError lists the choices."""
    try:
        return BACKBONES[name]
    except KeyError:
        raise KeyError(
            f"unknown backbone {name!r}; choose one of {', '.join(sorted(BACKBONES))} "
            "or timm:<model>"
        ) from None


def build_backbone(name: str, weights: str) -> Backbone:
    """Build backbone `name` with `weights` none | imagenet | path to a state_dict file."""
    if name.startswith("timm:"):
        from pactl.timm_backbone import build_timm

        return build_timm(name.removeprefix("timm:"), weights == "imagenet")
    backbone = constructor_for(name)(weights == "imagenet")
    if weights not in ("none", "imagenet"):
        _load_weights(backbone.module, Path(weights))
    return backbone


def _load_weights(module: nn.Module, path: Path) -> None:
    if not path.is_file():
        raise PactlError(f"weights file {path} not found (use --weights none|imagenet|PATH)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for bad files; all mean the same here
        raise PactlError(f"{path} is not a loadable state_dict: {str(e).splitlines()[0]}") from None
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict) or not set(state) & set(module.state_dict()):
        raise PactlError(f"{path} shares no weight names with this backbone")
    try:
        module.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches
        raise PactlError(f"{path} does not fit this backbone: {str(e).splitlines()[-1]}") from None
