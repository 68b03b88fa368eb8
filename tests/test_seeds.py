"""train --seeds: sibling runs and the mean and std of their metrics, against their own files."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from conftest import make_class_folder

from pactl.config import ModelConfig, TrainConfig
from pactl.console import QUIET
from pactl.datasets import load_source
from pactl.errors import PactlError, UsageError
from pactl.research.seeds import parse_seeds, train_seeds

TINY_MODEL = ModelConfig(backbone="small", weights="none", embedding_dim=16, image_size=16)
TINY_TRAIN = TrainConfig(
    epochs=1, batch_size=8, lr=1e-3, warmup_epochs=0, workers=0, val_classes=0.0,
    selection="last", freeze_bn=False, augment="light",
)  # fmt: skip


def test_parse_seeds() -> None:
    assert parse_seeds("0,1,2") == (0, 1, 2)
    assert parse_seeds("3-5,9") == (3, 4, 5, 9)
    for bad in ("", "1,1", "a", "-1", "2-x"):
        with pytest.raises(UsageError):
            parse_seeds(bad)


def test_seeds_train_siblings_and_summarise_them(tmp_path: Path) -> None:

    make_class_folder(tmp_path / "imgs", classes=6, per_class=5)
    manifest = load_source(str(tmp_path / "imgs"), QUIET)
    model_cfg = ModelConfig(
        **{**TINY_MODEL.__dict__, "resize_size": 16, "interpolation": "bilinear"}
    )
    result = train_seeds(
        "imgs", manifest, model_cfg, TINY_TRAIN, tmp_path / "runs", "r", (0, 1), QUIET
    )
    assert [p.name for p in result.runs] == ["r-s0", "r-s1"]
    last_rows = []
    for run in result.runs:
        with open(run / "metrics.csv", newline="") as f:
            last_rows.append(list(csv.DictReader(f))[-1])
    values = [float(r["recall@1"]) for r in last_rows]
    last = {s.metric: s for s in result.last}
    assert last["recall@1"].mean == pytest.approx(statistics.mean(values), abs=1e-6)
    assert last["recall@1"].std == pytest.approx(statistics.stdev(values), abs=1e-6)
    with open(result.summary, newline="") as f:
        rows = {(r["of"], r["metric"]): r for r in csv.DictReader(f)}
    assert float(rows["last", "map@r"]["s1"]) == pytest.approx(
        float(last_rows[1]["map@r"]), abs=1e-5
    )
    assert float(rows["best", "best_epoch"]["mean"]) == 1.0  # selection last: the last epoch
    with pytest.raises(PactlError, match="not empty"):
        train_seeds("imgs", manifest, model_cfg, TINY_TRAIN, tmp_path / "runs", "r", (1, 2), QUIET)


def test_train_seeds_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import TINY, run_cli

    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", "t", "--quiet"]
    code, out, err = run_cli([*args, "--seeds", "0,1"], monkeypatch, capsys)
    assert code == 0, err
    assert (tmp_path / "runs" / "t-s0" / "best.pt").is_file()
    assert (tmp_path / "runs" / "t-s1" / "provenance.json").is_file()
    assert "recall@1" in out and "±" in out
    seeds = [
        json.loads((tmp_path / "runs" / f"t-s{s}" / "config.json").read_text()) for s in (0, 1)
    ]
    assert [c["train_config"]["seed"] for c in seeds] == [0, 1]
    code, _, err = run_cli([*args, "--seeds", "0,1", "--seed", "3"], monkeypatch, capsys)
    assert code == 2 and "--seed or --seeds" in err
