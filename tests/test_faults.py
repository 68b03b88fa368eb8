"""Crashes and faults: SIGKILL at random moments, a full disk, a second run in the same folder."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TINY, interrupted, make_class_folder, read_csv, run_cli

from pactl import checkpoint as ckpt
from pactl.rules import MAX_EPOCHS


def pactl(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pactl", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def kill_at_random(
    args: list[str], env: dict[str, str], rng: random.Random, low: float, high: float
) -> bool:
    """Start pactl, SIGKILL it after a random delay; True when it was killed before finishing."""
    process = pactl(args, env)
    time.sleep(rng.uniform(low, high))
    finished = process.poll() is not None
    if not finished:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    return not finished


def environment(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PACTL_HOME": str(tmp_path / "home"),
        "PACTL_RUNS": str(tmp_path / "runs"),
    }


def test_sigkill_during_training_then_resume(tmp_path: Path) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=8)
    env = environment(tmp_path)
    rng = random.Random(7)
    run = tmp_path / "runs" / "k"
    train = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "6", "--name", "k", "--quiet"]
    kill_at_random(train, env, rng, 4.0, 9.0)
    if (run / "checkpoint.pt").exists():
        done = ckpt.load(run / "checkpoint.pt")["epoch"]  # a complete, valid checkpoint
        args = ["train", "--resume", str(run)]
    else:
        done, args = 0, [*train, "--overwrite"]
    finish = pactl(args, env)
    _, err = finish.communicate(timeout=300)
    assert finish.returncode == 0, err.decode()
    if done:
        assert f"after epoch {done}".encode() in err  # resumed from the last finished epoch
    rows = read_csv(run / "metrics.csv")
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3, 4, 5, 6]
    assert ckpt.load(run / "checkpoint.pt")["epoch"] == 6
    assert ckpt.load(run / "best.pt")["kind"] == "export"


def test_sigkill_during_embed_and_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=40, size=32)
    code, _, err = run_cli(
        ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", "e", "--quiet"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    env = environment(tmp_path)
    best = str(tmp_path / "runs" / "e" / "best.pt")
    rng = random.Random(3)
    embed = ["embed", str(tmp_path / "imgs"), "--checkpoint", best, "--out", str(tmp_path / "v")]
    for _ in range(2):
        kill_at_random(embed, env, rng, 2.0, 5.0)
        # Whatever is there is complete: no half-written vectors file survives.
        if (tmp_path / "v" / "vectors.npy").exists():
            np.load(tmp_path / "v" / "vectors.npy")
    assert pactl(embed, env).wait(timeout=300) == 0
    vectors = np.load(tmp_path / "v" / "vectors.npy")
    assert vectors.shape == (240, 16)
    index = ["index", str(tmp_path / "v"), "--out", str(tmp_path / "b")]
    kill_at_random(index, env, rng, 1.0, 3.0)
    assert pactl(index, env).wait(timeout=300) == 0
    assert not [p for p in (tmp_path / "v").iterdir() if p.name.endswith(".tmp")]
    assert not [p for p in (tmp_path / "b").iterdir() if p.name.endswith(".tmp")]


def test_ctrl_c_in_the_middle_of_a_checkpoint_write_is_an_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch.save turns a write that stopped part-way into "RuntimeError: unexpected pos": with
    # Ctrl-C landing inside a write, that was a traceback and exit 1 instead of exit 130.
    import torch

    path = tmp_path / "checkpoint.pt"
    ckpt.save(path, {"w": torch.zeros(4)})
    before = path.read_bytes()

    class Interrupted:
        """The temporary file, with Ctrl-C arriving during its third write."""

        def __init__(self, file: Any) -> None:
            self.file, self.writes = file, 0

        def write(self, data: bytes) -> int:
            self.writes += 1
            if self.writes == 3:  # as Python's SIGINT handler raises inside a write
                raise KeyboardInterrupt
            return int(self.file.write(data))

        def flush(self) -> None:
            self.file.flush()

    real_init = ckpt._Sink.__init__
    monkeypatch.setattr(ckpt._Sink, "__init__", lambda s, f: real_init(s, Interrupted(f)))
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(path, {"w": torch.ones(1000)})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # no temporary


def test_full_disk_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    train = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", "f", "--quiet"]
    assert run_cli(train, monkeypatch, capsys)[0] == 0
    run = tmp_path / "runs" / "f"
    before = (run / "checkpoint.pt").read_bytes()

    import torch

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    code, out, err = run_cli(
        ["train", "--resume", str(run), "--epochs", "2", "--quiet"], monkeypatch, capsys
    )
    assert code == 1 and out == ""
    errors = [line for line in err.splitlines() if not line.startswith("warning:")]
    assert "no space left" in err and len(errors) == 1, err  # warnings are not errors
    assert (run / "checkpoint.pt").read_bytes() == before
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.usefixtures("interruptible")
def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tmp_path: Path) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=8)
    run = tmp_path / "runs" / "c"
    process = pactl(
        # epochs it cannot finish before the signal: a tiny epoch takes tens of milliseconds,
        # and a busy machine may leave this poll asleep for seconds
        ["train", str(tmp_path / "imgs"), *TINY, "--epochs", str(MAX_EPOCHS), "--name", "c"],
        environment(tmp_path),
    )
    deadline = time.monotonic() + 120
    while not (run / "checkpoint.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    err = interrupted(process)
    assert process.returncode == 130, err
    assert f"pactl train --resume {run}".encode() in err
    assert b"Traceback" not in err
    ckpt.load(run / "checkpoint.pt")  # still a complete checkpoint
