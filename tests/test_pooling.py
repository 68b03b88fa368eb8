"""--pooling avg+max | avg | max | token, each against a hand computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pactl.config import ModelConfig
from pactl.errors import PactlError
from pactl.model import EmbeddingNet, build_model, check_model_config
from pactl.recipe import PRESETS

# Two channels of a 2 x 2 feature map.
FEATURES = torch.tensor([[[[1.0, 2.0], [3.0, -4.0]], [[0.0, 5.0], [-1.0, 2.0]]]])
BY_HAND = {
    "avg": [(1 + 2 + 3 - 4) / 4, (0 + 5 - 1 + 2) / 4],  # [0.5, 1.5]
    "max": [3.0, 5.0],
    "avg+max": [0.5 + 3.0, 1.5 + 5.0],
    "token": [1.0, 0.0],  # the first position: where a transformer's class token is
}


@pytest.mark.parametrize("pooling", list(BY_HAND))
def test_pooling_matches_the_hand_computation(pooling: str) -> None:
    net = EmbeddingNet(nn.Identity(), feat_dim=2, embedding_dim=0, pooling=pooling)
    expected = np.array(BY_HAND[pooling]) / np.linalg.norm(BY_HAND[pooling])
    np.testing.assert_allclose(net(FEATURES)[0].numpy(), expected, rtol=1e-6)


def test_token_pooling_is_the_vit_class_token() -> None:
    config = ModelConfig(
        backbone="timm:test_vit", weights="none", embedding_dim=0, image_size=160, pooling="token"
    )
    net, _ = build_model(config)
    net.eval()
    images = torch.randn(2, 3, 160, 160, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tokens = net.backbone.model.forward_features(images)  # (B, N, C), class token first
        expected = F.normalize(tokens[:, 0], dim=1)
        np.testing.assert_allclose(net(images).numpy(), expected.numpy(), atol=1e-5)
        averaged = build_model(
            ModelConfig(backbone="timm:test_vit", weights="none", embedding_dim=0, image_size=160)
        )[0].eval()(images)
    assert not torch.allclose(averaged, expected, atol=1e-3)  # the default pools every token


def test_token_pooling_is_refused_without_a_class_token() -> None:
    config = ModelConfig(backbone="small", weights="none", image_size=16, pooling="token")
    with pytest.raises(PactlError, match="class token"):
        check_model_config(config)


def test_presets_keep_the_official_head() -> None:
    assert {p.model.pooling for p in PRESETS.values()} == {"avg+max"}


def test_train_takes_pooling(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from conftest import run_cli

    code, out, err = run_cli(
        ["train", "digits", "--pooling", "max", "--print-config"], monkeypatch, capsys
    )
    assert code == 0, err
    assert json.loads(out)["model"]["pooling"] == "max"
    code, _, err = run_cli(
        ["train", "digits", "--pooling", "token", "--print-config"], monkeypatch, capsys
    )
    assert code == 2 and "class token" in err
