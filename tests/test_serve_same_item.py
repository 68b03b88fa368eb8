"""The service's same_item=true: hits at or above the bundle's calibrated threshold only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import make_class_folder, run_cli

pytest.importorskip("fastapi")


def test_same_item_keeps_hits_at_or_above_the_calibrated_threshold(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    import torch
    from fastapi.testclient import TestClient

    from pactl import checkpoint
    from pactl.calibrate import Calibration
    from pactl.config import ModelConfig
    from pactl.model import build_model
    from pactl.serve.app import create_app
    from pactl.serve.config import ServeConfig
    from pactl.serve.engine import Engine

    make_class_folder(tmp_path / "imgs", classes=3, per_class=3)
    torch.manual_seed(0)
    net, filled = build_model(
        ModelConfig(backbone="small", weights="none", embedding_dim=16, image_size=16)
    )
    payload = checkpoint.export_payload(checkpoint.clean_state_dict(net), filled, [], 1, {})
    checkpoint.save(tmp_path / "best.pt", payload)
    args = ["index", "imgs", "--checkpoint", "best.pt", "--out", "bundle", "-q"]
    assert run_cli(args, monkeypatch, capsys)[0] == 0
    config = ServeConfig(bundle=tmp_path / "bundle", device="cpu", faiss_device="cpu")
    image = tmp_path / "imgs" / "class_0" / "0.png"
    files = [("files", ("q.png", image.read_bytes(), "image/png"))]
    with TestClient(create_app(config, Engine(config), "test-secret")) as client:
        every = client.post("/query", params={"k": 9}, files=files).json()["results"][0]["hits"]
        refused = client.post("/query", params={"k": 9, "same_item": "true"}, files=files)
    assert refused.status_code == 400 and "no same-item calibration" in refused.json()["detail"]
    scores = sorted({h["score"] for h in every})
    t = (scores[-3] + scores[-4]) / 2  # between the third and fourth best
    # Calibrated after the bundle was built: the service reads the checkpoint's.
    cal = Calibration(0.99, t, 0.5, 1.0, "val", 9, 3, 36, True, ((t, 1.0, 0.5),))
    checkpoint.store_calibration(tmp_path / "best.pt", cal.to_dict())
    with TestClient(create_app(config, Engine(config), "test-secret")) as client:
        reply = client.post("/query", params={"k": 9, "same_item": "true"}, files=files)
    assert reply.status_code == 200, reply.text
    hits = reply.json()["results"][0]["hits"]
    assert [h["score"] for h in hits] == [h["score"] for h in every if h["score"] >= t]
    assert len(hits) == 3
