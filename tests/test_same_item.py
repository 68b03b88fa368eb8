"""Same-item search end to end: the calibration a run stores, and what reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import train_tiny
from test_calibrate import _brute_force

from pactl import checkpoint as ckpt
from pactl.calibrate import read_calibration
from pactl.errors import PactlError


def test_training_stores_the_threshold_of_the_held_out_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pactl.config import TrainConfig
    from pactl.console import QUIET
    from pactl.datasets import load_source
    from pactl.embed import embed_files
    from pactl.train import check_splits

    run = train_tiny(tmp_path, monkeypatch, capsys, classes=8, per_class=5)
    payload = ckpt.load(run / "best.pt")
    cal = read_calibration(payload["calibration"], "best.pt")
    assert (run / "calibration.png").is_file()
    # The validation classes, embedded here with best.pt, give the same threshold by brute force.
    splits = check_splits(load_source(str(tmp_path / "imgs"), QUIET), TrainConfig(batch_size=8))
    model, config, _ = ckpt.load_model(run / "best.pt")
    done = embed_files(model, splits.val.files(), config, torch.device("cpu"), QUIET)
    assert cal.split == "val" and cal.images == len(splits.val) == len(done.rows)
    threshold, recall = _brute_force(done.vectors, splits.val.labels[done.rows], cal.precision)
    assert cal.threshold == pytest.approx(threshold, abs=1e-4)
    assert cal.recall == pytest.approx(recall)


def test_damaged_calibration_is_refused_and_old_checkpoints_load(tmp_path: Path) -> None:
    from pactl.config import ModelConfig

    state = {"w": torch.zeros(2)}
    payload = ckpt.export_payload(state, ModelConfig(backbone="small", weights="none"), [], 1, {})
    ckpt.save(tmp_path / "old.pt", payload)
    assert "calibration" not in ckpt.load(tmp_path / "old.pt")
    ckpt.save(tmp_path / "bad.pt", {**payload, "calibration": {"format": "pactl.calibration"}})
    with pytest.raises(PactlError, match="bad.pt: calibration"):
        ckpt.load(tmp_path / "bad.pt")
