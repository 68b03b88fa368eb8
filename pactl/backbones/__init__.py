"""BACKBONES: name -> constructor returning the feature extractor and its preprocessing.

A backbone maps images (B, 3, H, W) to a feature map (B, C, h, w); the embedding head
(pactl.model) pools it. Preprocessing (mean/std, interpolation, crop fraction) travels with the
model in ModelConfig. What `--weights` means, and how a weights file is read, is in
pactl.backbones.base, which every backbone module imports instead of this registry.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from pactl.backbones import bn_inception
from pactl.backbones.base import Backbone, Constructor, fetching, load_weights_file
from pactl.config import IMAGENET_MEAN, IMAGENET_STD
from pactl.errors import PactlError


def _small(weights: str) -> Backbone:
    """A four-block CNN for the CPU and the tests; it has no ImageNet weights."""
    if weights == "imagenet":
        raise PactlError("backbone 'small' has no ImageNet weights; use --weights none|PATH")

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
    load_weights_file(module, weights)
    return Backbone(module, 128, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def _torchvision(name: str, weights_enum: str, feat_dim: int) -> Constructor:
    """A torchvision classifier with its pooling and classifier removed."""

    def build(weights: str) -> Backbone:
        import torchvision

        published = getattr(torchvision.models, weights_enum).DEFAULT
        kwargs = {"aux_logits": False, "init_weights": False} if name == "googlenet" else {}
        with fetching(f"{name} ImageNet weights", published.url):
            net = getattr(torchvision.models, name)(
                weights=published if weights == "imagenet" else None, **kwargs
            )
        load_weights_file(net, weights)
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
    "bn_inception": lambda weights: Backbone(
        bn_inception.bn_inception(weights),
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
    """The registry entry for `name` (timm:<model> included); a KeyError lists the choices."""
    if name.startswith("timm:"):
        from pactl.backbones.timm import build_timm

        return lambda weights: build_timm(name.removeprefix("timm:"), weights)
    try:
        return BACKBONES[name]
    except KeyError:
        raise KeyError(
            f"unknown backbone {name!r}; choose one of {', '.join(sorted(BACKBONES))} "
            "or timm:<model>"
        ) from None


def preprocessing_of(name: str) -> tuple[str, float]:
    """(interpolation, crop fraction) the backbone's published weights were evaluated with,
    without building it: timm's pretrained config for timm:<model>, torchvision's 224/256."""
    if name.startswith("timm:"):
        import timm

        cfg = timm.models.get_pretrained_cfg(name.removeprefix("timm:"))
        if cfg is not None:
            return str(cfg.interpolation or "bilinear"), float(cfg.crop_pct or 0.875)
    return Backbone.interpolation, Backbone.crop_pct


def build_backbone(name: str, weights: str) -> Backbone:
    """Build backbone `name` with `weights` none | imagenet | path to a state_dict file."""
    if weights not in ("none", "imagenet") and not Path(weights).is_file():
        raise PactlError(f"weights file {weights} not found (use --weights none|imagenet|PATH)")
    return constructor_for(name)(weights)
