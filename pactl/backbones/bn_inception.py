"""BN-Inception (Ioffe & Szegedy 2015), the backbone of the Proxy-Anchor paper.

The layers carry the names of the published ImageNet weights (Caffe names, flattened onto one
module: `inception_3a_1x1`, `inception_3a_1x1_bn`, ...), so the weight file loads with
`strict=True` once its classifier (`last_linear.*`) is dropped. The blocks are built from a
table instead of being written out one by one.

Those weights expect BGR images in 0..255 minus the per-channel mean [104, 117, 128]. This
module takes RGB like every other backbone and reverses the channels itself, so normalising
with MEAN/STD below (RGB order, [0, 1] units) hands its first convolution exactly
BGR*255 - [104, 117, 128].
"""

from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pactl.errors import PactlError

# The file the official Proxy-Anchor code loads (Cadene's pretrainedmodels), then mirrors that
# serve the identical bytes; every download is checked against the full sha256.
WEIGHTS_URLS = ("http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth",)
WEIGHTS_SHA256 = "52deb473314542a5c2f87e9e6f26f4ca42fe863d15f986414dbae8c2dfdd2353"
FEAT_DIM = 1024  # channels of inception_5b's output
# (x / 255 - 128/255) / (1/255) = x - 128 for R, likewise 117 for G and 104 for B.
MEAN = (128 / 255, 117 / 255, 104 / 255)  # RGB
STD = (1 / 255, 1 / 255, 1 / 255)
# The Proxy-Anchor training code builds its BatchNorm layers with momentum 0.9 (PyTorch's
# convention: the weight of the new batch) and trains SOP and In-Shop with them unfrozen.
BN_MOMENTUM = 0.9


@dataclass(frozen=True)
class Block:
    """One inception module; a width of 0 means the branch is absent."""

    name: str  # 3a ... 5b
    cin: int  # input channels
    c1x1: int  # 1x1 branch
    c3x3_reduce: int  # 1x1 -> 3x3 branch
    c3x3: int
    cdouble_reduce: int  # 1x1 -> 3x3 -> 3x3 branch
    cdouble: int
    pool: str  # avg (3x3, stride 1) | max (3x3, stride 1) | max_s2 (3x3, stride 2)
    cpool_proj: int  # 1x1 after the pool; 0 passes the pooled input through

    @property
    def stride(self) -> int:
        # The grid-reduction modules (3c, 4e) stride their last 3x3 convolutions and pool.
        return 2 if self.pool == "max_s2" else 1

    @property
    def cout(self) -> int:
        pooled = self.cpool_proj or self.cin
        return self.c1x1 + self.c3x3 + self.cdouble + pooled


BLOCKS = (
    Block("3a", 192, 64, 64, 64, 64, 96, "avg", 32),
    Block("3b", 256, 64, 64, 96, 64, 96, "avg", 64),
    Block("3c", 320, 0, 128, 160, 64, 96, "max_s2", 0),
    Block("4a", 576, 224, 64, 96, 96, 128, "avg", 128),
    Block("4b", 576, 192, 96, 128, 96, 128, "avg", 128),
    Block("4c", 576, 160, 128, 160, 128, 160, "avg", 128),
    Block("4d", 608, 96, 128, 192, 160, 192, "avg", 128),
    Block("4e", 608, 0, 128, 192, 192, 256, "max_s2", 0),
    Block("5a", 1056, 352, 192, 320, 160, 224, "avg", 128),
    Block("5b", 1024, 352, 192, 320, 192, 224, "max", 128),
)


class BNInception(nn.Module):
    """RGB images (B, 3, H, W) -> inception_5b features (B, 1024, H/32, W/32)."""

    def __init__(self, bn_momentum: float = BN_MOMENTUM) -> None:
        super().__init__()
        self.bn_momentum = bn_momentum
        self._conv_bn("conv1_7x7_s2", 3, 64, 7, stride=2)
        self._conv_bn("conv2_3x3_reduce", 64, 64, 1)
        self._conv_bn("conv2_3x3", 64, 192, 3)
        for block in BLOCKS:
            self._add_block(block)

    def _conv_bn(self, name: str, cin: int, cout: int, kernel: int, stride: int = 1) -> None:
        # Registered flat under the published names; the convolutions keep their bias.
        self.add_module(name, nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2))
        self.add_module(f"{name}_bn", nn.BatchNorm2d(cout, eps=1e-5, momentum=self.bn_momentum))

    def _add_block(self, b: Block) -> None:
        p = f"inception_{b.name}"
        if b.c1x1:
            self._conv_bn(f"{p}_1x1", b.cin, b.c1x1, 1)
        self._conv_bn(f"{p}_3x3_reduce", b.cin, b.c3x3_reduce, 1)
        self._conv_bn(f"{p}_3x3", b.c3x3_reduce, b.c3x3, 3, b.stride)
        self._conv_bn(f"{p}_double_3x3_reduce", b.cin, b.cdouble_reduce, 1)
        self._conv_bn(f"{p}_double_3x3_1", b.cdouble_reduce, b.cdouble, 3)
        self._conv_bn(f"{p}_double_3x3_2", b.cdouble, b.cdouble, 3, b.stride)
        if b.cpool_proj:
            self._conv_bn(f"{p}_pool_proj", b.cin, b.cpool_proj, 1)

    def _unit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        x = self.get_submodule(f"{name}_bn")(self.get_submodule(name)(x))
        return F.relu(x, inplace=True)  # BatchNorm's backward needs its input, not its output

    def _block(self, b: Block, x: torch.Tensor) -> torch.Tensor:
        p = f"inception_{b.name}"
        branches = [self._unit(f"{p}_1x1", x)] if b.c1x1 else []
        branches.append(self._unit(f"{p}_3x3", self._unit(f"{p}_3x3_reduce", x)))
        double = self._unit(f"{p}_double_3x3_1", self._unit(f"{p}_double_3x3_reduce", x))
        branches.append(self._unit(f"{p}_double_3x3_2", double))
        if b.pool == "avg":
            pooled = F.avg_pool2d(x, 3, 1, 1, ceil_mode=True, count_include_pad=True)
        elif b.pool == "max":
            pooled = F.max_pool2d(x, 3, 1, 1, ceil_mode=True)
        else:
            pooled = F.max_pool2d(x, 3, 2, ceil_mode=True)
        branches.append(self._unit(f"{p}_pool_proj", pooled) if b.cpool_proj else pooled)
        return torch.cat(branches, dim=1)  # (B, b.cout, h, w)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        check_size(images.shape[-2], images.shape[-1])
        x = images.flip(1)  # RGB -> BGR, the channel order the weights were trained on
        x = F.max_pool2d(self._unit("conv1_7x7_s2", x), 3, 2, ceil_mode=True)  # (B, 64, H/4)
        x = self._unit("conv2_3x3", self._unit("conv2_3x3_reduce", x))
        x = F.max_pool2d(x, 3, 2, ceil_mode=True)  # (B, 192, H/8, W/8)
        for block in BLOCKS:
            x = self._block(block, x)
        return x  # (B, 1024, H/32, W/32)


def check_size(height: int, width: int) -> None:
    """Refuse image sides at which the grid-reduction modules' branches disagree.

    Their max pool (ceil mode, no padding) and strided 3x3 convolutions (padding 1) give the
    same grid only for sides of 32k-1 to 32k+6 pixels; the published network has this limit.
    """
    for side in (height, width):
        if side < 31 or (side + 1) % 32 > 7:
            raise PactlError(
                f"BN-Inception cannot take {height}x{width} images: each side must be 32k-1 to "
                "32k+6 pixels (e.g. 224, 227, 256); choose another --image-size"
            )


def bn_inception(weights: str) -> BNInception:
    """BN-Inception with `weights` none | imagenet (the published file) | a state_dict PATH."""
    from pactl.backbones.base import load_weights_file

    net = BNInception()
    if weights == "imagenet":
        # An address of your own (a mirror inside your network) is tried first.
        own = os.environ.get("PACTL_BN_INCEPTION_URL")
        urls = (own, *WEIGHTS_URLS) if own else WEIGHTS_URLS
        net.load_state_dict(imagenet_state_dict(urls, WEIGHTS_SHA256), strict=True)
    else:
        load_weights_file(net, weights, adapt=squeeze_batchnorm)
    return net


def squeeze_batchnorm(state: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> None:
    """BatchNorm tensors saved as (1, C) (some conversions of the Caffe file) become (C,), as
    the official training code squeezes them."""
    for key, tensor in list(state.items()):
        want = own.get(key)
        if want is not None and tensor.dim() == 2 and tensor.shape[0] == 1 and want.dim() == 1:
            state[key] = tensor.squeeze(0)


def weights_path(url: str) -> Path:
    """Where the weights live: torch's hub cache, shared with other torch programs (the file
    name of `url`)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def imagenet_state_dict(urls: tuple[str, ...], sha256: str) -> dict[str, torch.Tensor]:
    """The published weights without the classifier: taken from the cache, else downloaded from
    the first of `urls` that answers, and checked against the file's full `sha256`."""
    # One cache name, whichever address served the file: the published one, whose digits are
    # the start of its sha256 (torch's convention).
    path = weights_path(f"bn_inception-{sha256[:9]}.pth")
    if not path.is_file():
        _download(urls, sha256, path)
    digest = _sha256(path)
    if digest != sha256:
        raise PactlError(
            f"{path} is not the published BN-Inception file (sha256 {digest[:12]}..., expected "
            f"{sha256[:12]}...); delete it and run again, or use --weights none|PATH"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError) as e:
        first_line = str(e).splitlines()[0]
        raise PactlError(f"{path} does not load as a state_dict: {first_line}") from None
    state = {k: v for k, v in state.items() if not k.startswith("last_linear.")}
    squeeze_batchnorm(state, BNInception().state_dict())
    return state


def _download(urls: tuple[str, ...], sha256: str, path: Path) -> None:
    """Fetch the file from the first address that serves it with the right checksum."""
    path.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for url in urls:
        try:
            # Downloads to a temporary file and renames it only once the checksum matches.
            torch.hub.download_url_to_file(url, str(path), hash_prefix=sha256, progress=False)
            return
        except OSError as e:  # unreachable, refused, HTTP errors
            reason = str(getattr(e, "reason", None) or e).splitlines()[0][:80]
            failures.append(f"{url.split('/')[2]}: {reason}")
        except RuntimeError:  # the checksum did not match: try the next address
            failures.append(f"{url.split('/')[2]}: wrong checksum")
    raise PactlError(
        f"cannot download the BN-Inception weights ({'; '.join(failures)}): put "
        f"{path.name} (sha256 {sha256[:12]}...) at {path} by hand, or use --weights none|PATH"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
