"""train --seeds: sibling runs and the mean and std of their metrics, against their own files."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from conftest import make_class_folder
from PIL import Image

from pactl.config import ModelConfig, TrainConfig
from pactl.console import QUIET
from pactl.datasets import load_source
from pactl.errors import PactlError, UsageError
from pactl.research.seeds import parse_seeds, stats, train_seeds

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


def noise_folder(root: Path, classes: int = 6, per_class: int = 5) -> Path:
    """`root/<class>/<n>.png` of seeded random pixels: the labels carry no signal, so Recall@1
    and MAP@R stay far from 1 and differ from one training seed to the next."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True)
        for n in range(per_class):
            pixels = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class_{c}" / f"{n}.png")
    return root


def test_stats_by_hand() -> None:
    """Guards against the population std (ddof=0) and against a middle value for the mean:
    three uneven values 0.2, 0.4, 0.9 have mean 0.5 (median 0.4) and sample std sqrt(0.26 / 2)
    (the population std is sqrt(0.26 / 3)); one run has no std."""
    found = stats([{"epoch": 3, "recall@1": 0.2}, {"epoch": 3, "recall@1": 0.4},
                   {"epoch": 4, "recall@1": 0.9, "map@r": 0.5}])  # fmt: skip
    assert [s.metric for s in found] == ["recall@1"]  # in every run; never the epoch
    (recall,) = found
    assert recall.mean == pytest.approx(0.5) and recall.values == (0.2, 0.4, 0.9)
    assert recall.std == pytest.approx(math.sqrt(0.13))
    (alone,) = stats([{"map@r": 0.25}])
    assert alone.mean == 0.25 and math.isnan(alone.std)


def test_seeds_train_siblings_and_summarise_them(tmp_path: Path) -> None:
    """Guards against the population std: two seeds on pictures of noise, where no metric
    saturates, so the sample std (n - 1) of Recall@1 and MAP@R differs from the population's;
    each is checked against the runs' own metrics.csv."""
    noise_folder(tmp_path / "imgs")
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
    last = {s.metric: s for s in result.last}
    for metric in ("recall@1", "map@r"):
        values = [float(r[metric]) for r in last_rows]
        assert max(values) < 1.0 and statistics.pstdev(values) > 0.01  # not saturated
        assert last[metric].mean == pytest.approx(statistics.mean(values), abs=1e-6)
        assert last[metric].std == pytest.approx(statistics.stdev(values), abs=1e-6)
    with open(result.summary, newline="") as f:
        rows = {(r["of"], r["metric"]): r for r in csv.DictReader(f)}
    assert float(rows["last", "map@r"]["s1"]) == pytest.approx(
        float(last_rows[1]["map@r"]), abs=1e-5
    )
    assert float(rows["last", "recall@1"]["std"]) == pytest.approx(last["recall@1"].std, rel=1e-5)
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
