"""`pactl compare` on a terminal: the columns that differ and the key metrics within its width
(COLUMNS), every column with --wide and in csv, json and markdown."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from pactl.config import ModelConfig, TrainConfig, to_dict


def write_run(root: Path, name: str, recalls: list[float], maps: list[float], **train: Any) -> Path:
    """A run folder as pactl train leaves it: config.json and a metrics.csv row an epoch."""
    run = root / name
    run.mkdir(parents=True)
    info = {
        "format": "pactl.run",
        "version": 1,
        "dataset": "digits",
        "model_config": to_dict(ModelConfig(backbone="small", embedding_dim=16)),
        "train_config": to_dict(TrainConfig(**{"selection": "last", **train})),
    }
    (run / "config.json").write_text(json.dumps(info))
    with open(run / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", "recall@1", "recall@2", "map@r", "seconds"])
        for epoch, (r, m) in enumerate(zip(recalls, maps, strict=True)):
            writer.writerow([epoch, r, min(r + 0.1, 1.0), m, 2.0])
    return run


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Three recipes that differ in lr and batch size (not in dataset, loss or backbone), the
    first over two seeds: best Recall@1 0.6 and 0.8 (mean 0.7, std 0.1414), MAP@R 0.3, 0.2."""
    root = tmp_path / "runs"
    same = {"epochs": 2, "weight_decay": 5e-4, "alpha": 16.0}
    write_run(root, "a-s0", [0.2, 0.5, 0.6], [0.1, 0.2, 0.3], seed=0, lr=1e-3, **same)
    write_run(root, "a-s1", [0.3, 0.4, 0.8], [0.1, 0.3, 0.2], seed=1, lr=1e-3, **same)
    write_run(root, "b", [0.1, 0.2, 0.3], [0.0, 0.1, 0.1], lr=2e-3, batch_size=64, **same)
    write_run(root, "c", [0.1, 0.4, 0.9], [0.0, 0.2, 0.5], lr=4e-3, batch_size=32, **same)
    return root


def compare(
    args: list[str], columns: int, monkeypatch: pytest.MonkeyPatch, capsys
) -> tuple[str, str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, err = run_cli(["compare", *args], monkeypatch, capsys)
    assert code == 0, err
    return out, err


def header(table: str) -> list[str]:
    """The column names of an aligned table (two spaces or more between them)."""
    return [name.strip() for name in table.splitlines()[0].split("  ") if name.strip()]


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_a_terminal_gets_what_differs_and_the_key_metrics_within_its_width(
    runs: Path, columns: int, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    out, err = compare([str(runs)], columns, monkeypatch, capsys)
    lines = out.splitlines()
    assert len(lines) == 4  # the header and the three recipes
    assert max(len(line) for line in lines) <= columns
    names = header(out)
    assert names[:3] == ["run", "batch_size", "lr"]  # the settings that differ, in table order
    assert {"best recall@1", "best map@r"} <= set(names)
    assert not {"dataset", "loss", "backbone", "epochs", "alpha"} & set(names)  # all alike
    assert lines[1].split()[0] == "a" and "0.7000 ± 0.1414" in lines[1]
    assert "0.2500 ± 0.0707" in lines[1]  # MAP@R 0.3 and 0.2
    assert "more columns" in err and "dataset" in err and "--wide" in err


def test_wide_and_the_file_formats_give_every_column(
    runs: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    narrow, _ = compare([str(runs)], 60, monkeypatch, capsys)
    wide, err = compare([str(runs), "--wide"], 60, monkeypatch, capsys)
    assert "more columns" not in err
    every = header(wide)
    assert set(header(narrow)) < set(every)
    assert {"dataset", "loss", "backbone", "seeds", "epochs done", "last map@r"} <= set(every)
    assert max(len(line) for line in wide.splitlines()) > 60
    text, _ = compare([str(runs), "--format", "csv"], 60, monkeypatch, capsys)
    csv_columns = next(csv.reader(text.splitlines()))
    assert {f"{name} mean" for name in every[every.index("epochs done") :]} <= set(csv_columns)
    assert set(every[: every.index("epochs done")]) <= set(csv_columns)
    text, _ = compare([str(runs), "--format", "markdown"], 60, monkeypatch, capsys)
    assert [c.strip() for c in text.splitlines()[0].strip("|").split("|")] == every
    text, _ = compare([str(runs), "--format", "json"], 60, monkeypatch, capsys)
    assert set(json.loads(text)[0]) == set(csv_columns)


def test_a_pipe_without_columns_gets_every_column(
    runs: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, err = run_cli(["compare", str(runs)], monkeypatch, capsys)
    assert code == 0, err
    wide, _ = compare([str(runs), "--wide"], 60, monkeypatch, capsys)
    assert out == wide


def test_a_terminal_too_narrow_for_a_metric_still_shows_the_run(
    runs: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    out, err = compare([str(runs)], 6, monkeypatch, capsys)
    assert header(out) == ["run"]
    assert [line.strip() for line in out.splitlines()[1:]] == ["a", "b", "c"]
    assert "best recall@1" in err
    out, _ = compare([str(runs)], 12, monkeypatch, capsys)  # no room for a metric, for lr yes
    assert header(out) == ["run", "lr"] and max(len(line) for line in out.splitlines()) <= 12
