"""A new user's first runs: interrupts that leave no dead end, resumes that say what they take
and keep config.json true, and 'latest' meaning a run that has finished an epoch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY, interrupted, make_class_folder, run_cli, train_tiny

from pactl.runs import latest_run


@pytest.mark.usefixtures("interruptible")
def test_ctrl_c_in_the_first_epoch_leaves_no_dead_end(tmp_path: Path) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=8)
    run = tmp_path / "runs" / "first"
    for _ in range(3):  # the first epoch lasts about a second: a busy machine may miss it
        process = subprocess.Popen(
            [sys.executable, "-m", "pactl", "train", str(tmp_path / "imgs"), *TINY]
            + ["--epochs", "50", "--name", "first"],
            env={**os.environ},
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 120
        while not (run / "config.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGSTOP)  # held still while the test looks
        if not (run / "checkpoint.pt").exists():
            break
        process.kill()
        process.communicate()
        shutil.rmtree(run)
    else:
        pytest.fail("the first epoch always finished before the test could stop it")
    err = interrupted(process)
    assert process.returncode == 130, err
    assert b"--resume" not in err and b"nothing was kept" in err and b"Traceback" not in err
    assert not run.exists()  # the same command can simply run again


def test_latest_is_a_run_that_finished_an_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    done = train_tiny(tmp_path, monkeypatch, capsys)
    started = tmp_path / "runs" / "started"
    started.mkdir()
    (started / "config.json").write_text((done / "config.json").read_text())
    assert latest_run(tmp_path / "runs") == done  # newer, but with no finished epoch
    code, _, err = run_cli(["train", "--resume", str(started)], monkeypatch, capsys)
    assert code == 1 and "nothing to resume" in err and "--overwrite" in err
    (done / "checkpoint.pt").unlink()
    code, _, err = run_cli(["eval"], monkeypatch, capsys)
    assert code == 1 and "has finished an epoch" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("extra", "named"),
    [(["--lr", "0.1"], "--lr"), (["--batch-size", "4", "--m", "2"], "--batch-size, --m")],
)
def test_resume_refuses_settings_it_would_ignore(
    extra: list[str],
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = train_tiny(tmp_path, monkeypatch, capsys)
    code, _, err = run_cli(["train", "--resume", str(run), *extra], monkeypatch, capsys)
    assert code == 2 and named in err and "takes --epochs, --device and --workers" in err


def test_resume_keeps_config_json_true(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = train_tiny(tmp_path, monkeypatch, capsys, epochs=1)
    code, _, err = run_cli(
        ["train", "--resume", str(run), "--epochs", "2", "--quiet"], monkeypatch, capsys
    )
    assert code == 0, err
    info: dict[str, Any] = json.loads((run / "config.json").read_text())
    assert info["train_config"]["epochs"] == 2
    assert (run / "metrics.csv").read_text().count("\n") == 1 + 3  # header, epochs 0, 1, 2


def test_follow_links_is_kept_for_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = make_class_folder(tmp_path / "outside", classes=1, per_class=6, seed=4)
    imgs = make_class_folder(tmp_path / "imgs", classes=5, per_class=6)
    (imgs / "linked").symlink_to(outside / "class_0")
    args = ["train", str(imgs), *TINY, "--epochs", "1", "--quiet"]
    code, _, err = run_cli([*args, "--name", "plain"], monkeypatch, capsys)
    assert code == 0 and "link" in err, err  # skipped, and said so
    code, _, err = run_cli([*args, "--name", "l", "--follow-links"], monkeypatch, capsys)
    assert code == 0 and "link" not in err, err
    info = json.loads((tmp_path / "runs" / "l" / "config.json").read_text())
    assert info["train_config"]["follow_links"] is True
    plain = json.loads((tmp_path / "runs" / "plain" / "config.json").read_text())
    assert plain["train_config"]["follow_links"] is False


@pytest.mark.parametrize(
    "extra",
    [
        ["--weights", "missing.pth"],  # a weights file that is not there
        ["--batch-size", "64"],  # more than the training split holds
    ],
)
def test_a_failed_start_leaves_no_run_folder(
    extra: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=4)
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", "f", "-q", *extra]
    first = run_cli(args, monkeypatch, capsys)
    assert first[0] in (1, 2) and first[2].count("\n") == 1, first
    assert not (tmp_path / "runs" / "f").exists()
    assert run_cli(args, monkeypatch, capsys)[2] == first[2]  # the same error, not a used folder


def test_the_run_line_shows_a_name_with_brackets_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=5, per_class=4)
    args = ["train", str(imgs), *TINY, "--epochs", "1", "--name", "a[bold]b", "-q"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert out.splitlines()[0] == f"run: {tmp_path / 'runs' / 'a[bold]b'}"  # not markup
    assert (tmp_path / "runs" / "a[bold]b" / "best.pt").is_file()


def test_a_missing_source_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["train", str(tmp_path / "nowhere")], monkeypatch, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "neither a known dataset" in err and not (tmp_path / "runs").exists()
