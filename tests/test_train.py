"""Training end to end on the CPU: digits reach a real Recall@1; runs resume exactly."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from conftest import TINY, make_class_folder, run_cli

from pactl import checkpoint as ckpt


def read_metrics(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_digits_learns_unseen_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        ["train", "digits", "--epochs", "3", "--name", "d", "--quiet"], monkeypatch, capsys
    )
    assert code == 0, err
    run = tmp_path / "runs" / "d"
    for name in ("checkpoint.pt", "best.pt", "config.json", "metrics.csv", "curves.png"):
        assert (run / name).is_file(), name
    rows = read_metrics(run)
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3]  # 0: evaluated before any step
    assert rows[0]["loss"] == "" and rows[0]["recall@1"] != ""
    for column in (
        "loss",
        "lr",
        "recall@1",
        "recall@2",
        "recall@4",
        "recall@8",
        "map@r",
        "seconds",
    ):
        assert rows[-1][column] != ""
    # Retrieval of digits 5-9, never seen in training, against the same network untrained.
    before = untrained_digits_metrics()
    start = {k: float(v) for k, v in rows[0].items() if k in before}
    assert after_beats(rows[-1], start)  # epoch 0: the untrained network, BatchNorm calibrated
    after = {k: float(v) for k, v in rows[-1].items() if k in before}
    assert after["recall@1"] >= 0.90
    assert after["recall@1"] >= before["recall@1"] + 0.03, (before, after)
    assert after["map@r"] >= before["map@r"] + 0.10, (before, after)
    assert float(rows[-1]["loss"]) < float(rows[1]["loss"])
    best = ckpt.load(run / "best.pt")
    assert best["kind"] == "export" and "optimizer" not in best
    assert best["fingerprint"] == ckpt.fingerprint(best["model"])
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in best["model"])
    config = json.loads((run / "config.json").read_text())
    assert config["train_config"]["alpha"] == 32.0 and config["train_config"]["delta"] == 0.1
    assert "run: " in out


def after_beats(row: dict[str, str], start: dict[str, float]) -> bool:
    return (
        float(row["recall@1"]) >= start["recall@1"] + 0.03 and float(row["map@r"]) > start["map@r"]
    )


def untrained_digits_metrics() -> dict[str, float]:
    from pactl import metrics
    from pactl.console import QUIET
    from pactl.datasets import load_source
    from pactl.embed import embed_files
    from pactl.model import build_model
    from pactl.recipe import PRESETS

    test = load_source("digits", QUIET).select("test")
    net, config = build_model(PRESETS["digits"].model, seed=PRESETS["digits"].train.seed)
    done = embed_files(net, test.files(), config, torch.device("cpu"), QUIET)
    return metrics.score_vectors(done.vectors, test.labels[done.rows], (1, 2, 4, 8))


def tiny_train(tmp_path: Path, monkeypatch, capsys, *extra: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    args = ["train", str(tmp_path / "imgs"), *TINY, "--warmup-epochs", "1", "--quiet", *extra]
    return run_cli(args, monkeypatch, capsys)


def test_resume_gives_the_same_metrics_as_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=6)
    code, _, err = tiny_train(tmp_path, monkeypatch, capsys, "--epochs", "3", "--name", "whole")
    assert code == 0, err
    code, _, err = tiny_train(tmp_path, monkeypatch, capsys, "--epochs", "2", "--name", "part")
    assert code == 0, err
    code, _, err = run_cli(
        ["train", "--resume", str(tmp_path / "runs" / "part"), "--epochs", "3", "--quiet"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    whole = read_metrics(tmp_path / "runs" / "whole")
    part = read_metrics(tmp_path / "runs" / "part")
    drop = {"seconds"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in part] == [
        {k: v for k, v in r.items() if k not in drop} for r in whole
    ]
    a = ckpt.load(tmp_path / "runs" / "whole" / "checkpoint.pt")
    b = ckpt.load(tmp_path / "runs" / "part" / "checkpoint.pt")
    assert a["fingerprint"] == b["fingerprint"]
    assert torch.equal(a["proxies"]["proxies"], b["proxies"]["proxies"])


def test_used_run_folder_is_refused_without_overwrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    assert tiny_train(tmp_path, monkeypatch, capsys, "--epochs", "1", "--name", "r")[0] == 0
    code, _, err = tiny_train(tmp_path, monkeypatch, capsys, "--epochs", "1", "--name", "r")
    assert code == 1 and "not empty" in err
    code, _, err = tiny_train(
        tmp_path, monkeypatch, capsys, "--epochs", "1", "--name", "r", "--overwrite"
    )
    assert code == 0, err


def test_print_config_shows_the_paper_preset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["train", "cars196", "--print-config"], monkeypatch, capsys)
    assert code == 0
    shown = json.loads(out)
    assert shown["model"]["backbone"] == "bn_inception"
    assert shown["train"]["lr"] == 1e-4 and shown["train"]["lr_decay_step"] == 20
    assert shown["train"]["proxy_lr_mult"] == 100.0
    code, out, _ = run_cli(
        ["train", "cars196", "--image-size", "256", "--print-config"], monkeypatch, capsys
    )
    resized = json.loads(out)["model"]
    assert (resized["image_size"], resized["resize_size"]) == (256, round(256 * 256 / 224))


def test_batch_larger_than_dataset_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    code, _, err = run_cli(
        [
            "train",
            str(tmp_path / "imgs"),
            "--backbone",
            "small",
            "--weights",
            "none",
            "--batch-size",
            "64",
            "--quiet",
        ],
        monkeypatch,
        capsys,
    )
    assert code == 1 and "larger than the train split" in err


def test_benchmark_not_downloaded_gets_a_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["train", "cub200"], monkeypatch, capsys)
    assert code == 1 and out == ""
    assert "run `pactl download cub200`" in err


def test_bf16_autocast_step_matches_float32(tmp_path: Path) -> None:
    """Under bf16 autocast the network runs in bf16, the loss in float32, close to fp32."""
    from pactl.config import ModelConfig, TrainConfig
    from pactl.training.distributed import World
    from pactl.training.trainer import build_trainer, train_step

    model_cfg = ModelConfig(
        backbone="small", weights="none", embedding_dim=16, image_size=16, resize_size=16
    )
    images = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    losses = {}
    for amp in ("none", "bf16"):
        cfg = TrainConfig(device="cpu", amp=amp, channels_last=amp == "bf16", workers=0)
        t = build_trainer(model_cfg, cfg, 4, World())
        loss = train_step(t, images, labels)
        assert loss.dtype == torch.float32
        assert t.criterion.proxies.dtype == torch.float32
        assert all(p.dtype == torch.float32 for p in t.net.parameters())
        losses[amp] = float(loss)
    assert losses["bf16"] == pytest.approx(losses["none"], rel=2e-2)


def test_a_nan_loss_takes_no_step() -> None:
    """A batch whose loss is NaN changes no weight and no proxy: train_step returns the NaN for
    the epoch loop to stop on, before any backward or optimiser step."""
    from pactl.config import ModelConfig, TrainConfig
    from pactl.training.distributed import World
    from pactl.training.trainer import build_trainer, train_step

    model_cfg = ModelConfig(
        backbone="small", weights="none", embedding_dim=16, image_size=16, resize_size=16
    )
    t = build_trainer(model_cfg, TrainConfig(device="cpu", workers=0), 4, World())
    images = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    before = [p.detach().clone() for p in [*t.net.parameters(), *t.criterion.parameters()]]
    loss = train_step(t, images * float("nan"), labels)
    assert torch.isnan(loss)
    after = [*t.net.parameters(), *t.criterion.parameters()]
    assert all(torch.equal(b, a.detach()) for b, a in zip(before, after, strict=True))
    assert all(p.grad is None for p in after)  # no backward either
    finite = train_step(t, images, labels)  # a finite batch still steps
    assert torch.isfinite(finite)
    changed = [*t.net.parameters(), *t.criterion.parameters()]
    assert any(not torch.equal(b, a.detach()) for b, a in zip(before, changed, strict=True))


def test_baseline_loss_and_class_balanced_sampler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=6)
    code, _, err = tiny_train(
        tmp_path,
        monkeypatch,
        capsys,
        "--epochs",
        "1",
        "--name",
        "ms",
        "--loss",
        "multi_similarity",
        "--sampler",
        "m_per_class",
        "--m",
        "4",
    )
    assert code == 0, err
    run = tmp_path / "runs" / "ms"
    config = json.loads((run / "config.json").read_text())["train_config"]
    assert (config["loss"], config["sampler"], config["m_per_class"]) == (
        "multi_similarity",
        "m_per_class",
        4,
    )
    assert ckpt.load(run / "checkpoint.pt")["proxies"] == {}  # a proxy-free loss
