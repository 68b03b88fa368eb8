"""The CPU inference network: traced and frozen where that is exact, eager where it is not."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_class_folder, run_cli, train_tiny
from torch import nn

from pactl.config import ModelConfig
from pactl.console import QUIET
from pactl.embed import embed_files, inference_model
from pactl.model import build_model

CPU = torch.device("cpu")


@pytest.mark.parametrize("backbone", ["small", "resnet18"])
def test_frozen_network_gives_the_eager_outputs(backbone: str) -> None:
    config = ModelConfig(backbone=backbone, weights="none", image_size=32, resize_size=32)
    net, config = build_model(config, seed=1)
    net.train()
    before = copy.deepcopy(net.state_dict())
    frozen = inference_model(net, config, CPU)
    assert isinstance(frozen, torch.jit.ScriptModule)
    # Another batch size than the one traced, and values the tracer never saw.
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        got, want = frozen(x), net.eval()(x)
    assert got.shape == (5, config.embedding_dim)
    assert torch.allclose(got, want, atol=1e-5)
    # Folding BatchNorm into a frozen copy leaves the network's own weights alone.
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert inference_model(frozen, config, CPU) is frozen  # prepared once


class BatchDependent(nn.Module):
    """Branches on the batch size in Python: a trace records one branch as a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x).mean(dim=(2, 3))
        if x.shape[0] == 2:
            out = out + 1.0
        return F.normalize(out, dim=1)


class Untraceable(nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"vector": x.mean(dim=(2, 3))}  # a dict output: the tracer refuses it


@pytest.mark.parametrize("model", [BatchDependent(), Untraceable()], ids=type)
def test_networks_the_tracer_cannot_follow_run_eagerly(model: nn.Module) -> None:
    config = ModelConfig(backbone="small", weights="none", image_size=16, resize_size=16)
    assert inference_model(model, config, CPU) is model


def test_no_freezing_off_the_cpu_path_or_under_autocast() -> None:
    config = ModelConfig(backbone="small", weights="none", image_size=16, resize_size=16)
    net, config = build_model(config)
    assert inference_model(net, config, CPU, amp="bf16") is net


def test_embed_files_prepared_or_not_embeds_the_same(tmp_path: Path) -> None:
    folder = make_class_folder(tmp_path / "imgs", classes=3, per_class=4)
    files = sorted(folder.rglob("*.png"))
    config = ModelConfig(backbone="small", weights="none", image_size=16, resize_size=16)
    net, config = build_model(config, seed=3)
    eager = embed_files(net, files, config, CPU, QUIET, batch_size=5, prepare=False)
    frozen = embed_files(net, files, config, CPU, QUIET, batch_size=5, prepare=True)
    np.testing.assert_array_equal(eager.rows, frozen.rows)
    np.testing.assert_allclose(frozen.vectors, eager.vectors, atol=1e-5)
    assert not np.allclose(eager.vectors[0], eager.vectors[-1])  # the images differ


def test_query_prepares_the_network_once_for_many_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pactl.embed
    from pactl.verbs.query import query_chunks

    checkpoint = train_tiny(tmp_path, monkeypatch, capsys, classes=4) / "best.pt"
    folder = tmp_path / "imgs"
    code, _, err = run_cli(
        ["index", str(folder), "--checkpoint", str(checkpoint), "--out", "b", "--quiet"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    traced: list[str] = []
    real = pactl.embed.fastpath.inference_model

    def counting(model: nn.Module, *args: object, **kwargs: object) -> nn.Module:
        if not isinstance(model, torch.jit.ScriptModule):
            traced.append(type(model).__name__)
        return real(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pactl.embed.fastpath, "inference_model", counting)
    monkeypatch.setattr(pactl.embed.fastpath, "PREPARE_MIN_IMAGES", 4)
    images = sorted(folder.rglob("*.png"))
    chunks = list(query_chunks(Path("b"), images, 3, None, False, "cpu", QUIET, chunk=6))
    assert [len(c.names) for c in chunks] == [6, 6, 6, 2]
    assert traced == ["EmbeddingNet"]  # the first full chunk prepares it; the rest reuse it
    # And the answers are the eager network's: every image finds itself first.
    assert all(h[0].path == n for c in chunks for n, h in zip(c.names, c.hits, strict=True))
    assert json.loads((Path("b") / "meta.json").read_text())["count"] == len(images)
