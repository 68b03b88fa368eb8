"""Backbone registry, BN-Inception's published layout and preprocessing, timm adapter."""

from __future__ import annotations

import functools
import hashlib
import http.server
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pactl.backbones import BACKBONES, bn_inception, build_backbone
from pactl.backbones.bn_inception import BLOCKS, BNInception
from pactl.backbones.timm import FeatureMap, build_timm
from pactl.errors import PactlError

# Output stride of each registered backbone; every other one reduces by 32.
STRIDE = {"small": 4}


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_feature_map_shape(name: str) -> None:
    torch.manual_seed(0)
    backbone = build_backbone(name, "none")
    module = backbone.module.eval()
    stride = STRIDE.get(name, 32)
    side = 2 * stride  # small enough to run on the CPU in a blink
    with torch.no_grad():
        out = module(torch.rand(2, 3, side, side))
    assert out.shape == (2, backbone.feat_dim, 2, 2)
    assert torch.isfinite(out).all()
    # 224 on the meta device: shapes without arithmetic.
    with torch.no_grad():
        out = module.to("meta")(torch.empty(1, 3, 224, 224, device="meta"))
    assert out.shape == (1, backbone.feat_dim, 224 // stride, 224 // stride)
    assert len(backbone.mean) == len(backbone.std) == 3


def test_unknown_backbone_lists_the_choices() -> None:
    with pytest.raises(KeyError) as info:
        build_backbone("resnet7", "none")
    message = str(info.value)
    for name in ("bn_inception", "small", "resnet50", "googlenet", "timm:<model>"):
        assert name in message


# --- BN-Inception: the layout of the published file ---------------------------------------
# Facts of bn_inception-52deb4733.pth (the pretrained-models BNInception definition it loads
# into with strict=True): 69 conv+BN units; convolutions have a bias; BatchNorm tensors are 1-d
# with no num_batches_tracked entry; the 1000-way classifier is last_linear; 11,295,240
# parameters in all.
PUBLISHED_SHAPES = {
    "conv1_7x7_s2.weight": (64, 3, 7, 7),
    "conv1_7x7_s2.bias": (64,),
    "conv1_7x7_s2_bn.running_var": (64,),
    "conv2_3x3_reduce.weight": (64, 64, 1, 1),
    "conv2_3x3.weight": (192, 64, 3, 3),
    "inception_3a_1x1.weight": (64, 192, 1, 1),
    "inception_3a_pool_proj.weight": (32, 192, 1, 1),
    "inception_3c_3x3.weight": (160, 128, 3, 3),
    "inception_3c_double_3x3_2_bn.weight": (96,),
    "inception_4a_1x1.weight": (224, 576, 1, 1),
    "inception_4d_double_3x3_reduce.weight": (160, 608, 1, 1),
    "inception_4e_double_3x3_2.weight": (256, 256, 3, 3),
    "inception_5a_1x1.weight": (352, 1056, 1, 1),
    "inception_5b_double_3x3_2.weight": (224, 224, 3, 3),
    "inception_5b_pool_proj.weight": (128, 1024, 1, 1),
    "inception_5b_pool_proj_bn.running_var": (128,),
}
PUBLISHED_PARAMETERS = 11_295_240
CLASSIFIER = {"last_linear.weight": (1000, 1024), "last_linear.bias": (1000,)}


def _published_layout(net: BNInception) -> dict[str, torch.Tensor]:
    """A state_dict laid out like the published file (random values)."""
    state = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    gen = torch.Generator().manual_seed(1)
    return state | {k: torch.randn(shape, generator=gen) for k, shape in CLASSIFIER.items()}


def test_bn_inception_matches_published_layout() -> None:
    net = BNInception()
    state = _published_layout(net)
    assert len(state) == 69 * (2 + 4) + 2
    assert list(state)[0] == "conv1_7x7_s2.weight"
    assert list(state)[-3] == "inception_5b_pool_proj_bn.running_var"
    for key, shape in PUBLISHED_SHAPES.items():
        assert tuple(state[key].shape) == shape, key
    # The grid-reduction modules have neither a 1x1 branch nor a pool projection.
    for block in ("3c", "4e"):
        assert not any(
            k.startswith((f"inception_{block}_1x1", f"inception_{block}_pool_proj")) for k in state
        )
    parameters = sum(p.numel() for p in net.parameters()) + 1024 * 1000 + 1000
    assert parameters == PUBLISHED_PARAMETERS
    assert all(p.requires_grad for p in net.parameters())


def test_bn_inception_layers_and_table() -> None:
    net = BNInception()
    conv1 = net.get_submodule("conv1_7x7_s2")
    assert (conv1.stride, conv1.padding) == ((2, 2), (3, 3))
    assert net.get_submodule("inception_3c_3x3").stride == (2, 2)
    assert net.get_submodule("inception_4e_double_3x3_2").stride == (2, 2)
    assert net.get_submodule("inception_4d_3x3").stride == (1, 1)
    bns = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 69
    assert all(bn.eps == 1e-5 and bn.affine and bn.momentum == 0.9 for bn in bns)
    channels = 192
    for block in BLOCKS:
        assert block.cin == channels, block.name
        channels = block.cout
    assert channels == bn_inception.FEAT_DIM == 1024


class _Seen(Exception):
    """Stops a forward pass once the first convolution's input is known."""


def _first_conv_input(module: nn.Module, images: torch.Tensor) -> torch.Tensor:
    seen: list[torch.Tensor] = []

    def stop(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        seen.append(args[0].detach().clone())
        raise _Seen

    handle = module.get_submodule("conv1_7x7_s2").register_forward_pre_hook(stop)
    with pytest.raises(_Seen):
        module(images)
    handle.remove()
    return seen[0]


def test_bn_inception_sees_bgr_0_255_minus_mean() -> None:
    from torchvision import transforms as T

    backbone = build_backbone("bn_inception", "none")
    rgb = np.random.default_rng(0).integers(0, 256, size=(38, 33, 3), dtype=np.uint8)
    # The Caffe convention, written out: BGR order, 0..255, minus [104, 117, 128].
    expected = torch.from_numpy(rgb[:, :, ::-1].astype(np.float64).copy()).permute(2, 0, 1)
    expected = expected - torch.tensor([104.0, 117.0, 128.0], dtype=torch.float64)[:, None, None]
    mean = torch.tensor(backbone.mean, dtype=torch.float64)[:, None, None]
    std = torch.tensor(backbone.std, dtype=torch.float64)[:, None, None]
    normalised = (torch.from_numpy(rgb).permute(2, 0, 1).double() / 255 - mean) / std
    seen = _first_conv_input(backbone.module.double(), normalised[None])
    torch.testing.assert_close(seen[0], expected, rtol=0, atol=1e-9)
    # The float32 image pipeline (ToTensor + Normalize) lands within a hundredth of a grey level.
    pipeline = T.Compose([T.ToTensor(), T.Normalize(backbone.mean, backbone.std)])
    seen = _first_conv_input(backbone.module.float(), pipeline(rgb)[None])
    torch.testing.assert_close(seen[0].double(), expected, rtol=0, atol=1e-2)


def test_bn_inception_size_check_matches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    net = BNInception().eval().to("meta")
    check = bn_inception.check_size
    monkeypatch.setattr(bn_inception, "check_size", lambda height, width: None)
    for side in (30, 31, 38, 39, 62, 63, 70, 71, 223, 227, 230, 231):
        try:  # the unchecked network is the oracle: its branches fail to concatenate
            net(torch.empty(1, 3, side, 224, device="meta"))
            fits = True
        except RuntimeError:
            fits = False
        try:
            check(side, 224)
            accepted = True
        except PactlError as e:
            assert "--image-size" in str(e)
            accepted = False
        assert accepted == fits, side
    with pytest.raises(PactlError, match="240x224"):
        check(240, 224)


# --- weights ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["small", "bn_inception"])
def test_weights_from_a_state_dict_file(name: str, tmp_path: Path) -> None:
    torch.manual_seed(1)
    source = build_backbone(name, "none").module
    path = tmp_path / "weights.pt"
    torch.save(source.state_dict(), path)
    torch.manual_seed(2)
    loaded = build_backbone(name, str(path)).module
    for (key, want), got in zip(
        source.state_dict().items(), loaded.state_dict().values(), strict=True
    ):
        assert torch.equal(want, got), key
    with pytest.raises(PactlError, match="not found"):
        build_backbone(name, str(tmp_path / "missing.pt"))


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty torch hub cache for this test."""
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    return tmp_path / "hub" / "checkpoints"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A static HTTP server on 127.0.0.1: (base URL, the folder it serves)."""
    root = tmp_path / "served"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()
    httpd.server_close()


def _publish(root: Path, state: dict[str, torch.Tensor]) -> tuple[str, str]:
    """Save `state` as bn_inception-<sha256 prefix>.pth under `root`: (file name, sha256)."""
    tmp = root / "upload.pth"
    # The published file predates torch's zip format.
    torch.save(state, tmp, _use_new_zipfile_serialization=False)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    name = f"bn_inception-{digest[:9]}.pth"
    tmp.rename(root / name)
    return name, digest


def _dead_url(name: str) -> str:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"


def test_imagenet_weights_come_from_the_first_address_that_serves_them(
    hub: Path, server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, root = server
    published = _published_layout(BNInception())
    name, digest = _publish(root, published)
    # The official address is down; the mirror behind it serves the file.
    monkeypatch.setattr(bn_inception, "WEIGHTS_URLS", (_dead_url(name), f"{base}/{name}"))
    monkeypatch.setattr(bn_inception, "WEIGHTS_SHA256", digest)
    backbone = build_backbone("bn_inception", "imagenet")
    assert [p.name for p in hub.iterdir()] == [name]  # no partial download left behind
    state = backbone.module.state_dict()
    for key, want in published.items():
        if not key.startswith("last_linear."):
            assert torch.equal(state[key], want), key
    (root / name).unlink()  # from now on only the cache can answer
    again = bn_inception.imagenet_state_dict((f"{base}/{name}",), digest)
    assert set(again) == set(published) - set(CLASSIFIER)


def test_an_address_of_ones_own_is_tried_first(
    hub: Path, server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, root = server
    name, digest = _publish(root, _published_layout(BNInception()))
    (root / name).rename(root / "internal-copy.pth")  # any name: the checksum decides
    monkeypatch.setattr(bn_inception, "WEIGHTS_URLS", (_dead_url(name),))
    monkeypatch.setattr(bn_inception, "WEIGHTS_SHA256", digest)
    monkeypatch.setenv("PACTL_BN_INCEPTION_URL", f"{base}/internal-copy.pth")
    build_backbone("bn_inception", "imagenet")
    assert [p.name for p in hub.iterdir()] == [name]


def test_imagenet_weights_with_a_wrong_checksum_are_refused(
    hub: Path, server: tuple[str, Path]
) -> None:
    base, root = server
    name, digest = _publish(root, _published_layout(BNInception()))
    other = digest[:-1] + ("0" if digest[-1] != "0" else "1")  # the prefix alone would pass
    with pytest.raises(PactlError, match="wrong checksum"):
        bn_inception.imagenet_state_dict((f"{base}/{name}",), other)
    assert not hub.exists() or not any(hub.iterdir())
    hub.mkdir(parents=True, exist_ok=True)
    (hub / name).write_bytes(b"not the published file")  # put there by hand
    with pytest.raises(PactlError, match="not the published BN-Inception file"):
        bn_inception.imagenet_state_dict((f"{base}/{name}",), digest)


def test_imagenet_weights_offline_say_what_to_do(hub: Path) -> None:
    url = _dead_url("bn_inception-52deb4733.pth")
    with pytest.raises(PactlError) as info:
        bn_inception.imagenet_state_dict((url,), bn_inception.WEIGHTS_SHA256)
    message = str(info.value)
    assert message.startswith("cannot download the BN-Inception weights (127.0.0.1")
    assert str(hub / "bn_inception-52deb4733.pth") in message
    assert "--weights none|PATH" in message
    assert "\n" not in message


def test_bn_inception_batchnorm_stored_as_1_by_c_loads(tmp_path: Path) -> None:
    """Some copies of the Caffe conversion keep BatchNorm tensors as (1, C); the official
    training code squeezes them."""
    published = _published_layout(BNInception())
    wide = {k: v.unsqueeze(0) if "_bn." in k and v.dim() == 1 else v for k, v in published.items()}
    assert wide["conv1_7x7_s2_bn.running_var"].shape == (1, 64)
    path = tmp_path / "wide.pth"
    torch.save(wide, path)
    state = build_backbone("bn_inception", str(path)).module.state_dict()
    assert torch.equal(
        state["conv1_7x7_s2_bn.running_var"], published["conv1_7x7_s2_bn.running_var"]
    )
    assert torch.equal(state["inception_5b_1x1.weight"], published["inception_5b_1x1.weight"])


def test_a_weights_file_must_fit_every_backbone_key(tmp_path: Path) -> None:
    torch.manual_seed(0)
    full = build_backbone("small", "none").module.state_dict()
    cases = {
        "lacks backbone weights: 3.weight": {k: v for k, v in full.items() if k != "3.weight"},
        "does not have: extra.weight": full | {"extra.weight": torch.zeros(1)},
        r"another shape: 0.weight \(16, 3, 5, 5\)": full | {"0.weight": torch.zeros(16, 3, 5, 5)},
        "shares": {},  # nothing in common: the first missing key is named
    }
    for match, state in cases.items():
        path = tmp_path / "w.pt"
        torch.save(state, path)
        with pytest.raises(PactlError, match=match if match != "shares" else "lacks"):
            build_backbone("small", str(path))
    # A classifier the embedding does not use may come along; DDP's prefix is taken off.
    path = tmp_path / "ok.pt"
    torch.save(
        {
            "state_dict": {f"module.{k}": v for k, v in full.items()}
            | {"module.fc.weight": torch.zeros(3, 128)}
        },
        path,
    )
    loaded = build_backbone("small", str(path)).module.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in full.items())


def test_torchvision_weights_file_loads_before_the_classifier_is_cut(tmp_path: Path) -> None:
    """A file saved from the whole torchvision classifier (fc included) fills the body."""
    import torchvision

    torch.manual_seed(3)
    net = torchvision.models.resnet18(weights=None)
    path = tmp_path / "resnet18.pth"
    torch.save(net.state_dict(), path)
    body = build_backbone("resnet18", str(path)).module
    assert torch.equal(body.state_dict()["0.weight"], net.conv1.weight)
    assert torch.equal(body.state_dict()["4.1.bn2.running_var"], net.layer1[1].bn2.running_var)


def test_a_failed_torchvision_download_is_one_line(
    hub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import urllib.error

    def offline(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    monkeypatch.setattr(torch.hub, "download_url_to_file", offline)
    with pytest.raises(PactlError) as info:
        build_backbone("resnet18", "imagenet")
    message = str(info.value)
    assert message.startswith("cannot download the resnet18 ImageNet weights (")
    assert "resnet18-" in message and str(hub) in message and "--weights none|PATH" in message
    assert "\n" not in message


# --- timm ---------------------------------------------------------------------------------


class _Fixed(nn.Module):
    def __init__(self, out: torch.Tensor, output_fmt: str | None = None) -> None:
        super().__init__()
        self.out = out
        if output_fmt:
            self.output_fmt = output_fmt

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.out


def test_feature_map_brings_every_layout_to_nchw() -> None:
    gen = torch.Generator().manual_seed(0)
    nchw = torch.randn(2, 5, 3, 4, generator=gen)
    images = torch.zeros(2, 3, 8, 8)
    assert torch.equal(FeatureMap(_Fixed(nchw))(images), nchw)
    nhwc = nchw.permute(0, 2, 3, 1).contiguous()
    assert torch.equal(FeatureMap(_Fixed(nhwc, "NHWC"))(images), nchw)
    tokens = torch.randn(2, 7, 5, generator=gen)  # (B, N, C)
    out = FeatureMap(_Fixed(tokens))(images)
    assert out.shape == (2, 5, 1, 7)
    # What the embedding head computes equals average + max over the tokens.
    pooled = out.mean(dim=(2, 3)) + out.amax(dim=(2, 3))
    torch.testing.assert_close(pooled, tokens.mean(1) + tokens.amax(1))
    vectors = torch.randn(2, 5, generator=gen)
    assert FeatureMap(_Fixed(vectors))(images).shape == (2, 5, 1, 1)


def test_timm_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # makes `import timm` fail
    with pytest.raises(PactlError, match=r"pip install 'pactl\[timm\]'"):
        build_backbone("timm:resnet18", "none")


@pytest.mark.parametrize("name", ["test_resnet", "test_vit"])
def test_timm_backbone(name: str) -> None:
    timm = pytest.importorskip("timm")
    if not timm.is_model(name):
        pytest.skip(f"this timm has no {name}")
    torch.manual_seed(0)
    backbone = build_timm(name, "none")
    module = backbone.module.eval()
    reference = timm.create_model(name, pretrained=False).eval()
    side = reference.pretrained_cfg["input_size"][-1]
    with torch.no_grad():
        out = module(torch.rand(2, 3, side, side))
    assert out.dim() == 4 and out.shape[:2] == (2, backbone.feat_dim)
    assert backbone.feat_dim == reference.num_features
    assert backbone.mean == tuple(reference.pretrained_cfg["mean"])
    assert backbone.std == tuple(reference.pretrained_cfg["std"])
    assert backbone.interpolation == reference.pretrained_cfg["interpolation"]
    assert backbone.crop_pct == reference.pretrained_cfg["crop_pct"]
    assert module.training is False


def test_timm_weights_file_loads_and_changes_the_output(tmp_path: Path) -> None:
    """--weights PATH for timm:<name>: a file of the whole classifier (as timm saves it)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(5)
    source = timm.create_model("test_resnet", pretrained=False).eval()
    for name, p in source.named_parameters():  # weights no random initialisation would give
        p.data.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    path = tmp_path / "weights.pth"
    torch.save(source.state_dict(), path)
    assert "fc.weight" in source.state_dict()  # the classifier travels in the file
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(6)
    loaded = build_backbone("timm:test_resnet", str(path)).module.eval()
    torch.manual_seed(6)
    fresh = build_backbone("timm:test_resnet", "none").module.eval()
    with torch.no_grad():
        want = source.forward_features(images)
        torch.testing.assert_close(loaded(images), want)
        assert not torch.allclose(fresh(images), want, atol=1e-3)
    torch.save({k: v for k, v in source.state_dict().items() if k != "conv1.0.weight"}, path)
    with pytest.raises(PactlError, match="lacks backbone weights: conv1.0.weight"):
        build_backbone("timm:test_resnet", str(path))


def test_timm_preprocessing_reaches_the_model_config() -> None:
    """resize = crop / crop fraction and the weights' filter, from timm's data config."""
    from pactl.config import ModelConfig
    from pactl.model import build_model

    config = ModelConfig(backbone="timm:efficientnet_lite0", weights="none", image_size=128)
    _, resolved = build_model(config)
    assert resolved.interpolation == "bicubic"
    assert resolved.resize_size == round(128 / 0.875)
    assert resolved.dimension == 512


def test_timm_unknown_model_suggests_names() -> None:
    pytest.importorskip("timm")
    with pytest.raises(PactlError, match="resnet18"):
        build_backbone("timm:resnet18x", "none")


def test_timm_imagenet_weights_offline_fail_at_once_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No route to the hub: one line naming where to get the file, no minute of retries, and
    a failed start leaves no empty run folder behind."""
    import time

    import huggingface_hub.constants as hub
    from conftest import TINY, make_class_folder, run_cli

    def no_dns(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    began = time.monotonic()
    with pytest.raises(PactlError) as info:
        build_backbone("timm:test_resnet", "imagenet")
    assert time.monotonic() - began < 20  # the hub client's retries would take about a minute
    message = str(info.value)
    assert "not cached, and the hub is unreachable" in message
    assert "https://huggingface.co/timm/test_resnet" in message and "--weights PATH" in message
    assert hub.HF_HUB_OFFLINE is False  # restored

    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    tiny = TINY.copy()
    tiny[tiny.index("small")], tiny[tiny.index("none")] = "timm:test_resnet", "imagenet"
    code, out, err = run_cli(
        ["train", str(tmp_path / "imgs"), *tiny, "--name", "r", "-q"], monkeypatch, capsys
    )
    assert code == 1 and out == ""
    assert err.startswith("error: cannot fetch the ImageNet weights of timm:test_resnet")
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs" / "r").exists()
