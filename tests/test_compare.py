"""pactl compare: runs read from written folders, seeds folded into hand-computed mean +- std."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from pactl.config import ModelConfig, TrainConfig, to_dict
from pactl.research import aggregate
from pactl.research import compare as cmp


def write_run(root: Path, name: str, rows: list[dict[str, Any]] | None, **train: Any) -> Path:
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
    if rows is not None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
        with open(run / "metrics.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    return run


def epochs(recalls: list[float], maps: list[float], seconds: float = 2.0) -> list[dict[str, Any]]:
    return [
        {"epoch": e, "loss": "" if e == 0 else 1.0 / (e + 1), "recall@1": r, "recall@2": r + 0.1,
         "map@r": m, "seconds": 1.0 if e == 0 else seconds}
        for e, (r, m) in enumerate(zip(recalls, maps, strict=True))
    ]  # fmt: skip


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    write_run(root, "a-s0", epochs([0.2, 0.5, 0.6], [0.1, 0.2, 0.3]), seed=0, epochs=2, lr=1e-3)
    write_run(root, "a-s1", epochs([0.3, 0.4, 0.8], [0.1, 0.3, 0.2]), seed=1, epochs=2, lr=1e-3)
    # Still training (1 of 5 epochs), other columns (validation ones), best.pt by validation.
    rows = [
        {"epoch": 0, "recall@1": 0.1, "val_recall@1": 0.3, "val_map@r": 0.1, "seconds": 1.0},
        {"epoch": 1, "recall@1": 0.4, "val_recall@1": 0.2, "val_map@r": 0.1, "seconds": 3.0},
    ]
    write_run(root, "b", rows, seed=0, epochs=5, lr=2e-3, selection="val")
    write_run(root, "c", None, seed=0, epochs=5, lr=4e-3)  # started, no epoch yet
    return root


def test_seeds_fold_into_hand_computed_mean_and_std(runs: Path) -> None:
    groups = aggregate.group_runs([cmp.read_run(p) for p in cmp.find_runs([runs])])
    assert [(g.name, len(g.runs)) for g in groups] == [("a", 2), ("b", 1), ("c", 1)]
    frame = aggregate.summary(groups).set_index("run")
    a, b, c = frame.loc["a"], frame.loc["b"], frame.loc["c"]
    # a: best.pt is the last epoch; Recall@1 0.6 and 0.8: mean 0.7, std sqrt(2 * 0.1^2 / 1).
    assert a["best recall@1 mean"] == pytest.approx(0.7)
    assert a["best recall@1 std"] == pytest.approx(math.sqrt(0.02))
    assert a["best map@r mean"] == pytest.approx(0.25)
    assert a["last recall@2 mean"] == pytest.approx(0.8)
    assert a["seconds mean"] == pytest.approx(1.0 + 2.0 + 2.0)
    assert a["seeds"] == "0,1" and a["status"] == "done" and a["lr"] == pytest.approx(1e-3)
    # b: validation Recall@1 is highest at epoch 0, so best.pt is epoch 0 (test Recall@1 0.1).
    assert b["best epoch mean"] == 0 and b["best recall@1 mean"] == pytest.approx(0.1)
    assert b["last recall@1 mean"] == pytest.approx(0.4) and math.isnan(b["best map@r mean"])
    assert b["status"] == "1/5 epochs" and math.isnan(b["best recall@1 std"])
    assert c["status"] == "no epoch yet" and c["lr"] == pytest.approx(4e-3)
    assert "seed" not in frame.columns and "epochs" in frame.columns  # epochs differ: a setting


def test_metrics_after_given_epochs(runs: Path) -> None:
    groups = aggregate.group_runs([cmp.read_run(p) for p in cmp.find_runs([runs])])
    frame = aggregate.summary(groups, at=(1, 2)).set_index("run")
    a, b = frame.loc["a"], frame.loc["b"]
    # a after epoch 1: Recall@1 0.5 and 0.4 (mean 0.45, std sqrt(2 * 0.05^2)), MAP@R 0.2, 0.3.
    assert a["recall@1 at 1 mean"] == pytest.approx(0.45)
    assert a["recall@1 at 1 std"] == pytest.approx(math.sqrt(0.005))
    assert a["map@r at 1 mean"] == pytest.approx(0.25)
    assert a["map@r at 2 mean"] == pytest.approx(0.25)  # 0.3 and 0.2
    # b reached epoch 1 only, without MAP@R
    assert b["recall@1 at 1 mean"] == pytest.approx(0.4) and math.isnan(b["recall@1 at 2 mean"])
    assert math.isnan(b["map@r at 1 mean"])


def test_at_epochs_option(
    runs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import run_cli

    code, out, err = run_cli(
        ["compare", str(runs), "--format", "csv", "--at-epochs", "0,2"], monkeypatch, capsys
    )
    assert code == 0, err
    row = next(csv.DictReader(out.splitlines()))
    assert float(row["recall@1 at 0 mean"]) == pytest.approx(0.25)
    assert float(row["recall@1 at 2 mean"]) == pytest.approx(0.7)
    for bad in ("1,x", "1,1", "-1"):
        code, _, err = run_cli(["compare", str(runs), "--at-epochs", bad], monkeypatch, capsys)
        assert code == 2 and "--at-epochs" in err


def test_formats_and_files(runs: Path, tmp_path: Path) -> None:
    result = cmp.compare([runs], "csv", out=tmp_path / "cmp")
    table = list(csv.DictReader(result.text.splitlines()))
    assert float(table[0]["best recall@1 mean"]) == pytest.approx(0.7)
    text = cmp.compare([runs], "table").text
    assert "0.7000 ± 0.1414" in text.splitlines()[1]
    markdown = cmp.compare([runs], "markdown").text.splitlines()
    assert markdown[0].startswith("| run |") and set(markdown[1].split()) <= {"|", "---"}
    records = json.loads(cmp.compare([runs], "json").text)
    assert records[0]["best recall@1 std"] == pytest.approx(math.sqrt(0.02))
    assert {p.name for p in result.written} == {"compare.csv", "compare.md", "compare.png"}
    assert all(p.stat().st_size > 0 for p in result.written)


def test_figure_draws_a_band_only_for_seeded_groups(runs: Path) -> None:
    groups = aggregate.group_runs([cmp.read_run(p) for p in cmp.find_runs([runs])])
    fig = cmp.figure(groups)
    by_epoch, by_time = fig.axes
    bands = [c for c in by_epoch.collections if c.get_gid() == "seed-band"]
    assert len(bands) == 1  # group a only; b has one run, c none
    lines = by_epoch.get_lines()
    assert len(lines) == 2
    assert list(lines[0].get_ydata()) == pytest.approx([0.25, 0.45, 0.7])  # means per epoch
    # Wall time: epoch 0 at 0 s, then each epoch's seconds added (2 s per epoch).
    assert list(by_time.get_lines()[0].get_xdata()) == pytest.approx([0.0, 2.0, 4.0])


def test_compare_command(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import run_cli

    code, out, err = run_cli(
        ["compare", str(runs), "--format", "csv", "--out", str(tmp_path / "o")], monkeypatch, capsys
    )
    assert code == 0, err
    rows = list(csv.DictReader(out.splitlines()))
    assert [r["run"] for r in rows] == ["a", "b", "c"]
    assert (tmp_path / "o" / "compare.png").stat().st_size > 0 and "compare.png" in err
    code, _, err = run_cli(["compare", str(tmp_path / "o")], monkeypatch, capsys)
    assert code == 2 and "not a run folder" in err


def test_compare_replaces_its_files_in_out_only_with_overwrite(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """compare.csv, .md and .png already in --out (a study's record, or a file of the user's
    named so) are the user's: kept, in one line before any work, unless --overwrite; a link,
    a FIFO or a run's own metrics.csv of that name is refused even then."""
    import os

    from conftest import one_error, run_cli

    out = tmp_path / "study"
    out.mkdir()
    (out / "compare.md").write_text("my notes\n")
    args = ["compare", str(runs), "--format", "csv", "--out", str(out)]
    code, stdout, err = run_cli(args, monkeypatch, capsys)
    assert code == 1 and stdout == "" and "compare.md exists; pass --overwrite" in one_error(err)
    assert (out / "compare.md").read_text() == "my notes\n" and not (out / "compare.csv").exists()
    code, _, err = run_cli([*args, "--overwrite"], monkeypatch, capsys)
    assert code == 0, err
    assert (out / "compare.md").read_text() != "my notes\n"
    (out / "compare.csv").unlink()
    (out / "compare.csv").symlink_to(tmp_path / "elsewhere.csv")
    code, _, err = run_cli([*args, "--overwrite"], monkeypatch, capsys)
    assert code == 1 and "compare.csv is a symbolic link" in one_error(err)
    assert (out / "compare.csv").is_symlink() and not (tmp_path / "elsewhere.csv").exists()
    (out / "compare.csv").unlink()
    os.mkfifo(out / "compare.csv")
    code, _, err = run_cli([*args, "--overwrite"], monkeypatch, capsys)
    assert code == 1 and "compare.csv is a FIFO" in one_error(err)
    (out / "compare.csv").unlink()
    os.link(runs / "a-s0" / "metrics.csv", out / "compare.csv")
    code, _, err = run_cli([*args, "--overwrite"], monkeypatch, capsys)
    assert code == 2 and "which this command reads" in one_error(err)


def test_benchmark_runs_get_the_published_recall_beside_them(tmp_path: Path) -> None:
    run = tmp_path / "cub"
    run.mkdir()
    model = ModelConfig(backbone="bn_inception", embedding_dim=512, image_size=224)
    info = {
        "format": "pactl.run",
        "dataset": "cub200",
        "model_config": to_dict(model),
        "train_config": to_dict(TrainConfig(selection="test")),
    }
    (run / "config.json").write_text(json.dumps(info))
    (run / "metrics.csv").write_text("epoch,recall@1,seconds\n0,0.5,1\n1,0.6,2\n")
    records = json.loads(cmp.compare([run], "json").text)
    assert records[0]["published recall@1"] == "paper 0.684 README 0.691"
    assert records[0]["best recall@1 mean"] == pytest.approx(0.6)


def test_three_seeds_fold_into_their_mean_not_their_median(tmp_path: Path) -> None:
    """Guards against aggregating by the median (or any middle value) instead of the mean: a
    group of three seeds with uneven values, where median and mean differ, in the table and in
    the figure's line. Recall@1 of the last epoch 0.1, 0.2 and 0.9: mean 0.4, sample std
    sqrt(((-0.3)^2 + (-0.2)^2 + 0.5^2) / 2) = sqrt(0.19); the median would be 0.2."""
    root = tmp_path / "runs"
    for seed, (start, end) in enumerate([(0.0, 0.1), (0.3, 0.2), (0.0, 0.9)]):
        write_run(root, f"r-s{seed}", epochs([start, end], [end / 2, end]), seed=seed, epochs=1)
    groups = aggregate.group_runs([cmp.read_run(p) for p in cmp.find_runs([root])])
    assert [(g.name, len(g.runs)) for g in groups] == [("r", 3)]
    row = aggregate.summary(groups, at=(0,)).set_index("run").loc["r"]
    assert row["best recall@1 mean"] == pytest.approx(0.4)
    assert row["best recall@1 std"] == pytest.approx(math.sqrt(0.19))
    assert row["best map@r mean"] == pytest.approx(0.4)  # 0.1, 0.2, 0.9 again (selection last)
    assert row["recall@1 at 0 mean"] == pytest.approx(0.1)  # 0, 0.3, 0: median 0
    assert row["recall@1 at 0 std"] == pytest.approx(math.sqrt(0.03))  # (0.01+0.04+0.01)/2
    by_epoch, _ = cmp.figure(groups).axes
    (line,) = by_epoch.get_lines()
    assert list(line.get_ydata()) == pytest.approx([0.1, 0.4])


def test_summary_identity_columns_and_settings_by_hand(tmp_path: Path) -> None:
    """Guards against the summary's identity columns misnamed or read from the wrong setting,
    the statuses of a group joined wrongly, settings shown although every group has the same
    value, a seed's config.json with its keys in another order splitting its group, a run
    without a seconds column failing, and the epochs done left out."""
    root = tmp_path / "runs"
    write_run(root, "a-s0", epochs([0.2, 0.5, 0.6], [0.1, 0.2, 0.3]), seed=0, epochs=2)
    late = write_run(root, "a-s1", epochs([0.3, 0.4], [0.1, 0.3]), seed=1, epochs=2)
    info = json.loads((late / "config.json").read_text())
    info["train_config"] = dict(reversed(list(info["train_config"].items())))
    (late / "config.json").write_text(json.dumps(info))
    rows = [{k: v for k, v in r.items() if k != "seconds"} for r in epochs([0.1], [0.1])]
    write_run(root, "b", rows, seed=0, epochs=3, lr=5e-3)
    groups = aggregate.group_runs([cmp.read_run(p) for p in cmp.find_runs([root])])
    assert [(g.name, len(g.runs)) for g in groups] == [("a", 2), ("b", 1)]
    frame = aggregate.summary(groups)
    identity = ["run", "runs", "seeds", "status", "dataset", "loss", "backbone", "chosen by"]
    assert list(frame.columns[:10]) == [*identity, "epochs", "lr"]  # the settings that differ
    a = frame.set_index("run").loc["a"]
    default = TrainConfig()
    assert (a["runs"], a["dataset"], a["loss"], a["backbone"], a["chosen by"]) == (
        2,
        "digits",
        default.loss,
        "small",
        "last",
    )
    assert a["status"] == "1/2 epochs, done" and a["epochs done mean"] == pytest.approx(1.5)
    b = frame.set_index("run").loc["b"]
    assert math.isnan(b["seconds mean"]) and b["epochs done mean"] == 0


def test_a_run_with_no_scored_epoch_has_no_best_numbers(tmp_path: Path) -> None:
    """Guards against a run without a best epoch (no epoch scored yet: only losses written)
    read as if it had one: its best numbers and best epoch are NaN, its epochs and seconds
    counted."""
    import pandas as pd

    frame = pd.DataFrame([{"epoch": 1, "loss": 3.0, "seconds": 2.5}])
    run = aggregate.Run(tmp_path, "digits", {"train.epochs": 4}, frame, "val", 1, None)
    numbers = aggregate.run_numbers(run, [1])
    assert numbers["epochs done"] == 1.0 and numbers["seconds"] == 2.5
    for name in ("best recall@1", "best map@r", "last recall@1", "best epoch"):
        assert math.isnan(numbers[name]), name
