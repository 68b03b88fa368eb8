"""The CPU fast path without TorchScript: while torch has TorchScript freezing it is used; where
it is gone (simulated by taking its functions away) or raises, BatchNorm is folded through
torch.fx instead, and the vectors stay those of the eager network."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_class_folder
from torch import nn

import pactl.embed.fastpath
from pactl.config import ModelConfig
from pactl.console import QUIET
from pactl.embed import embed_files
from pactl.embed.fastpath import inference_model, is_prepared, torchscript_available
from pactl.model import build_model

CPU = torch.device("cpu")
TORCHSCRIPT = ("trace", "freeze", "optimize_for_inference")


def without_torchscript(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*TORCHSCRIPT, "ScriptModule"):
        monkeypatch.delattr(torch.jit, name, raising=False)


def network(backbone: str = "small", seed: int = 1) -> tuple[nn.Module, ModelConfig]:
    config = ModelConfig(backbone=backbone, weights="none", image_size=32, resize_size=32)
    return build_model(config, seed=seed)


def batch(n: int = 5, seed: int = 2) -> torch.Tensor:
    x = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return x.contiguous(memory_format=torch.channels_last)


def float64_reference(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The eager network in float64: the vectors every fast path must reproduce."""
    with torch.no_grad():
        return copy.deepcopy(net).double().eval()(x.double()).double()


def min_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=1).min())


def randomise_batchnorm(net: nn.Module, seed: int) -> None:
    """Running statistics and affine terms far from the identity, so folding them matters."""
    generator = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            for t in (m.running_mean, m.weight, m.bias):
                t.data = torch.randn(t.shape, generator=generator)
            m.running_var.data = torch.rand(m.running_var.shape, generator=generator) + 0.5


def test_torchscript_is_used_while_torch_has_it() -> None:
    assert torchscript_available()
    net, config = network()
    fast = inference_model(net, config, CPU)
    assert isinstance(fast, torch.jit.ScriptModule) and is_prepared(fast)


@pytest.mark.parametrize("backbone", ["small", "resnet18"])
def test_without_torchscript_batchnorm_is_folded_and_the_vectors_stay(
    monkeypatch: pytest.MonkeyPatch, backbone: str
) -> None:
    net, config = network(backbone)
    randomise_batchnorm(net, 3)
    before = copy.deepcopy(net.state_dict())
    x = batch()
    want = float64_reference(net, x)
    without_torchscript(monkeypatch)
    assert not torchscript_available()
    fast = inference_model(net, config, CPU)
    assert isinstance(fast, torch.fx.GraphModule) and is_prepared(fast)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fast.modules())  # folded
    with torch.inference_mode():
        got = fast(x)
    assert min_cosine(got, want) >= 0.9999
    assert torch.allclose(got.double(), want, atol=1e-4)
    after = net.state_dict()  # the caller's network is not changed by the folding
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert inference_model(fast, config, CPU) is fast  # prepared once


def test_torchscript_that_raises_falls_back_to_folding(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("freezing is not supported any more")

    monkeypatch.setattr(torch.jit, "freeze", broken)
    net, config = network()
    randomise_batchnorm(net, 4)
    fast = inference_model(net, config, CPU)
    assert isinstance(fast, torch.fx.GraphModule)
    with torch.inference_mode():
        assert min_cosine(fast(batch()), float64_reference(net, batch())) >= 0.9999


class BatchDependent(nn.Module):
    """Branches on the batch size in Python: neither a trace nor torch.fx can record it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn(self.conv(x)).mean(dim=(2, 3))
        if x.shape[0] == 2:
            out = out + 1.0
        return torch.nn.functional.normalize(out, dim=1)


def test_a_network_no_fast_path_can_follow_runs_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = ModelConfig(backbone="small", weights="none", image_size=16, resize_size=16)
    model = BatchDependent()
    assert inference_model(model, config, CPU) is model
    without_torchscript(monkeypatch)
    assert inference_model(model, config, CPU) is model


def test_embed_files_without_torchscript_gives_the_torchscript_vectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_class_folder(tmp_path / "imgs", classes=3, per_class=3, size=24)
    files = sorted(folder.rglob("*.png"))
    net, config = network(seed=5)
    randomise_batchnorm(net, 6)
    net.train()  # embed_files puts it in eval mode for the run, and back
    eager = embed_files(net, files, config, CPU, QUIET, batch_size=4, prepare=False)
    scripted = embed_files(net, files, config, CPU, QUIET, batch_size=4, prepare=True)
    without_torchscript(monkeypatch)
    prepared: list[nn.Module] = []
    real = pactl.embed.fastpath.inference_model

    def spy(*args: object, **kwargs: object) -> nn.Module:
        prepared.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return prepared[-1]

    monkeypatch.setattr(pactl.embed.fastpath, "inference_model", spy)
    fused = embed_files(net, files, config, CPU, QUIET, batch_size=4, prepare=True)
    assert isinstance(prepared[0], torch.fx.GraphModule)
    assert net.training  # the caller's mode is given back
    # A random network maps every picture near one direction: centred on the eager vectors'
    # mean, the cosines tell files apart (below) and so say whether the paths agree.
    centre = eager.vectors.astype(np.float64).mean(axis=0)
    for other in (scripted, fused):
        np.testing.assert_array_equal(other.rows, eager.rows)
        np.testing.assert_allclose(other.vectors, eager.vectors, atol=1e-4)
        assert centred_cosines(other.vectors, eager.vectors, centre).min() >= 0.9999
    apart = centred_cosines(eager.vectors[:1], eager.vectors[-1:], centre)
    assert apart.max() < 0.99  # different images are far further apart than the paths


def centred_cosines(a: np.ndarray, b: np.ndarray, centre: np.ndarray) -> np.ndarray:
    x, y = a.astype(np.float64) - centre, b.astype(np.float64) - centre
    return np.sum(x * y, axis=1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))


# ---------------------------------------------------------------------------- torch.compile


class FakeCompile:
    """torch.compile that compiles nothing: the network itself, each call's shape recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.shapes: list[tuple[int, ...]] = []
        monkeypatch.setattr(torch, "compile", self)

    def __call__(self, model: nn.Module, dynamic: bool | None = None) -> object:
        assert dynamic is False  # one shape, compiled once

        def run(x: torch.Tensor) -> torch.Tensor:
            self.shapes.append(tuple(x.shape))
            assert x.is_contiguous(memory_format=torch.channels_last)
            return model(x)

        return run


def test_compile_is_never_picked_without_a_cpp_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCompile(monkeypatch)
    monkeypatch.setattr(pactl.embed.fastpath.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    assert pactl.embed.fastpath.cpp_compiler() is None
    net, config = network()
    fast = inference_model(net, config, CPU, compile=True)
    assert isinstance(fast, torch.jit.ScriptModule) and fake.shapes == []  # TorchScript instead


def test_compiled_network_runs_fixed_chunks_and_gives_the_vectors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeCompile(monkeypatch)
    monkeypatch.setattr(pactl.embed.fastpath.shutil, "which", lambda name: f"/usr/bin/{name}")
    net, config = network()
    randomise_batchnorm(net, 8)
    fast = inference_model(net, config, CPU, compile=True)
    assert isinstance(fast, pactl.embed.fastpath.Compiled) and is_prepared(fast)
    x = batch(70, seed=9)  # two full chunks of 32 and one of 6, padded
    with torch.inference_mode():
        got = fast(x)
    assert got.shape == (70, config.embedding_dim)
    assert set(fake.shapes) == {(32, 3, 32, 32)}  # every call the one compiled shape
    assert torch.allclose(got.double(), float64_reference(net, x), atol=1e-4)


def test_compile_is_asked_for_from_compile_min_images_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_class_folder(tmp_path / "imgs", classes=2, per_class=3, size=24)
    files = sorted(folder.rglob("*.png"))
    asked: list[bool] = []
    real = pactl.embed.fastpath.inference_model

    def spy(*args: object, **kwargs: object) -> nn.Module:
        asked.append(bool(args[6] if len(args) > 6 else kwargs.get("compile", False)))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pactl.embed.fastpath, "inference_model", spy)
    monkeypatch.setattr(pactl.embed.fastpath, "PREPARE_MIN_IMAGES", 2)
    monkeypatch.setattr(pactl.embed.fastpath, "COMPILE_MIN_IMAGES", 6)
    FakeCompile(monkeypatch)
    net, config = network()
    embed_files(net, files[:5], config, CPU, QUIET, batch_size=4)
    embed_files(net, files, config, CPU, QUIET, batch_size=4)
    embed_files(net, files, config, CPU, QUIET, batch_size=4, prepare=True)  # a caller's chunk
    assert asked == [False, True, False]


@pytest.mark.slow
def test_real_compile_compiles_once_and_gives_the_eager_vectors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if pactl.embed.fastpath.cpp_compiler() is None:
        pytest.skip("no C++ compiler")
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    net, config = network()
    randomise_batchnorm(net, 10)
    with torch.inference_mode(False):
        fast = inference_model(net, config, CPU, compile=True)
    assert isinstance(fast, pactl.embed.fastpath.Compiled)
    x = batch(70, seed=11)
    with torch.inference_mode():  # as embed_files runs it: no recompilation for this mode
        got = fast(x)
    assert torch.allclose(got.double(), float64_reference(net, x), atol=1e-4)
