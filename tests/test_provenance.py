"""provenance.json in every run folder, seeds that repeat, and --print-config's recipe lines."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path

import pytest
import torch
from conftest import TINY, make_class_folder, read_csv, run_cli

from pactl import checkpoint as ckpt
from pactl.config import ModelConfig
from pactl.model import build_model


def train(tmp_path: Path, monkeypatch, capsys, name: str, *extra: str) -> Path:  # type: ignore[no-untyped-def]
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", name, "--quiet"]
    code, _, err = run_cli([*args, *extra], monkeypatch, capsys)
    assert code == 0, err
    return tmp_path / "runs" / name


def test_provenance_records_versions_command_seed_and_fingerprints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    run = train(tmp_path, monkeypatch, capsys, "p", "--seed", "7")
    info = json.loads((run / "provenance.json").read_text())
    assert info["format"] == "pactl.training.provenance" and info["version"] == 1
    assert info["packages"]["torch"] == importlib.metadata.version("torch")
    assert info["packages"]["faiss-cpu"] == importlib.metadata.version("faiss-cpu")
    assert info["cuda"] == torch.version.cuda
    assert info["command"][1:3] == ["train", str(tmp_path / "imgs")]
    assert info["seed"] == 7 and info["config"]["train_config"]["seed"] == 7
    assert info["devices"]["training"] == "cpu"
    # The start fingerprint is the network built again from the run's own model config and seed.
    net, _ = build_model(
        ModelConfig(backbone="small", weights="none", embedding_dim=16, image_size=16), seed=7
    )
    assert info["weights"]["start_fingerprint"] == ckpt.fingerprint(ckpt.clean_state_dict(net))
    # The data fingerprint is the images' paths, labels, splits and sizes; one byte more changes it.
    before = info["data"]["fingerprint"]
    assert info["data"]["images"] == 16
    with open(next((tmp_path / "imgs").rglob("*.png")), "ab") as f:
        f.write(b"\0")
    again = json.loads((train(tmp_path, monkeypatch, capsys, "q") / "provenance.json").read_text())
    assert again["data"]["fingerprint"] != before


def test_weights_file_is_fingerprinted_by_its_bytes(tmp_path: Path) -> None:
    from pactl.training.provenance import weights_source

    path = tmp_path / "w.pth"
    path.write_bytes(b"weights")
    assert weights_source(str(path))["file_sha256"] == hashlib.sha256(b"weights").hexdigest()
    assert weights_source("imagenet") == {"weights": "imagenet"}


def test_the_same_seed_gives_the_same_first_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=5)
    runs = [
        train(tmp_path, monkeypatch, capsys, n, "--seed", s) for n, s in [("a3", "3"), ("b3", "3")]
    ]
    other = train(tmp_path, monkeypatch, capsys, "c4", "--seed", "4")

    def rows(run: Path) -> list[dict[str, str]]:
        return [
            {k: v for k, v in r.items() if k != "seconds"} for r in read_csv(run / "metrics.csv")
        ]

    assert rows(runs[0]) == rows(runs[1])
    assert rows(runs[0])[1]["loss"] != rows(other)[1]["loss"]  # the seed is used, not ignored


def test_print_config_names_the_optimiser_and_the_schedule(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["train", "cars196", "--print-config"], monkeypatch, capsys)
    assert code == 0
    why = json.loads(out)["why"]
    optimiser = next(w for w in why if w.startswith("optimiser"))
    assert "AdamW" in optimiser and "0.01 for the proxies (x100)" in optimiser
    schedule = next(w for w in why if w.startswith("schedule"))
    # Cars-196: lr 1e-4 halved every 20 of 60 epochs: after 20 and 40, 1e-4 / 4 at the end.
    assert "x0.5 every 20 epochs (after epochs 20, 40; 0.0001 -> 2.5e-05 by epoch 60)" in schedule


def test_tensorboard_logs_what_metrics_csv_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    run = train(tmp_path, monkeypatch, capsys, "tb", "--tensorboard")
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    rows = read_csv(run / "metrics.csv")

    def logged(tag: str) -> tuple[list[int], list[float]]:
        found = events.Scalars(tag)
        return [e.step for e in found], [e.value for e in found]

    for tag, column in (("test/recall@1", "recall@1"), ("test/map@r", "map@r")):
        steps, values = logged(tag)
        assert steps == [int(r["epoch"]) for r in rows]
        assert values == pytest.approx([float(r[column]) for r in rows], abs=1e-5)
    # metrics.csv keeps 6 significant digits: a loss above 10 is 4 decimals
    assert logged("train/loss") == ([1], [pytest.approx(float(rows[1]["loss"]), rel=1e-5)])
    assert logged("train/lr") == ([1], [pytest.approx(1e-3)])


def test_runs_record_the_classes_by_the_names_the_data_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A CSV whose labels run the other way from its class names: config.json and best.pt must
    # name the classes trained on as the CSV does, not by pactl's own 0..C-1 numbering, which a
    # reader would take for the CSV's labels (the old record here, 2-5, holds two test classes'
    # labels, 4 and 5, and two labels no row has).
    make_class_folder(tmp_path / "imgs", classes=6, per_class=4)
    names = ["trouser", "pullover", "dress", "coat", "bag", "ankle boot"]
    rows = ["path,label,split,class_name"]
    for c, name in enumerate(names):
        split = "train" if c < 4 else "test"
        rows += [f"imgs/class_{c}/{n}.png,{9 - c},{split},{name}" for n in range(4)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    args = ["train", str(tmp_path / "data.csv"), *TINY, "--epochs", "1", "--name", "n"]
    code, _, err = run_cli([*args, "--val-classes", "0", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    run = tmp_path / "runs" / "n"
    trained = json.loads((run / "config.json").read_text())["classes"]
    assert sorted(trained) == ["coat", "dress", "pullover", "trouser"]
    assert ckpt.load(run / "best.pt")["classes"] == trained
    assert ckpt.load(run / "checkpoint.pt")["classes"] == trained
