"""Shared fixtures: an isolated PACTL_HOME and runs folder, tiny image folders, a CLI runner."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# ImageNet's mean and std, as the transforms take them
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def normalised(rgb: tuple[int, int, int]) -> np.ndarray:
    """A colour as the transforms normalise it with MEAN and STD, in float64."""
    return (np.array(rgb, dtype=np.float64) / 255.0 - np.array(MEAN)) / np.array(STD)


# A small network on small images: a training epoch takes about a second on the CPU.
TINY = [
    "--backbone", "small", "--weights", "none", "--dim", "16", "--image-size", "16",
    "--batch-size", "8", "--lr", "1e-3", "--warmup-epochs", "0", "--workers", "0",
]  # fmt: skip


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real, small tmpfs mounted at `tmp_path/disk` (4 MiB), unmounted afterwards: writes to it
    fail with a genuine ENOSPC once it fills. Skipped where mounting is not allowed."""
    import shutil
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no mount command: the real full-disk case cannot be set up here")
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()[:80]})")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(disk: Path, leave: int = 0) -> None:
    """Fill the filesystem at `disk` until fewer than `leave` bytes are free."""
    import errno
    import os

    with open(disk / ".filler", "wb") as f:
        chunk = b"\0" * 65536
        while True:
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            if free <= leave:
                break
            try:
                f.write(chunk[: max(1, min(len(chunk), free - leave))])
                f.flush()
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own PACTL_HOME, runs folder and working directory."""
    monkeypatch.setenv("PACTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PACTL_RUNS", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)
    yield tmp_path


@pytest.fixture
def interruptible() -> Iterator[None]:
    """Processes started in the test get Ctrl-C's default action. A test run started with SIGINT
    ignored (a background job of a shell without job control, as CI may start it) passes the
    ignore on to every program it starts, and Python then leaves it ignored, as `cmd &` in a
    script expects: such a child never sees a Ctrl-C the test sends."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def interrupted(process: subprocess.Popen[bytes], timeout: float = 120) -> bytes:
    """Ctrl-C to `process` (stopped with SIGSTOP or running: it goes on with the Ctrl-C pending);
    its stderr once it has exited (killed, and the test failed, if not within `timeout` s)."""
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGCONT)
    try:
        return process.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"still running {timeout:.0f} s after Ctrl-C")


def make_class_folder(
    root: Path, classes: int = 6, per_class: int = 6, size: int = 16, seed: int = 0
) -> Path:
    """`root/<class>/<n>.png`: each class a distinct colour pattern plus seeded noise."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        base = rng.integers(0, 256, size=(1, 1, 3))
        for n in range(per_class):
            noise = rng.integers(-20, 21, size=(size, size, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            (root / f"class_{c}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(root / f"class_{c}" / f"{n}.png")
    return root


def run_cli(
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stdin: str | None = None,
) -> tuple[int, str, str]:
    """Run `pactl ARGS` in-process through the real entry point; returns (code, stdout, stderr)."""
    import io

    from pactl.cli import main

    monkeypatch.setattr(sys, "argv", ["pactl", *args])
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# The start of a script that imports pactl (and torch) once and forks a child per `pactl` run:
# a fresh interpreter per run would spend seconds importing torch. `run_pactl(job)` runs in the
# forked child and never returns: job["args"] are the arguments, stderr goes to job["log"] and
# stdout too with job["stdout"] == "log" (else nowhere); job["env"] and job["cwd"] if given.
# The tests that fork add their own loop. Fork happens before any thread pool.
FORKING_PACTL = r"""
import json, os, sys, time
import pactl.cli, pactl.embed, pactl.index, pactl.verbs.index, pactl.backbones, pactl.model
import pactl.checkpoint, pactl.backbones.timm, timm, torchvision

def run_pactl(job):
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    out = log if job.get("stdout") == "log" else os.open(os.devnull, os.O_WRONLY)
    os.dup2(out, 1); os.dup2(log, 2)
    os.environ.update(job.get("env", {})); os.chdir(job.get("cwd", "."))
    sys.argv = ["pactl", *job["args"]]
    code = 0
    try:
        pactl.cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(code)

def exit_code(status):
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
"""


def one_error(err: str) -> str:
    """The single line of stderr, which must be an error line and no traceback (warnings, shown
    even with --quiet, say something of the result and are not errors)."""
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def read_csv(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def train_tiny(
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    epochs: int = 1,
    classes: int = 6,
    per_class: int = 5,
) -> Path:
    """`pactl train` of the TINY network on a fresh class folder `root/imgs`: the run folder."""
    make_class_folder(root / "imgs", classes=classes, per_class=per_class)
    code, _, err = run_cli(
        ["train", str(root / "imgs"), "--epochs", str(epochs), "--name", "t", *TINY, "--quiet"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    return root / "runs" / "t"


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def clustered(
    rng: np.random.Generator, n: int, centres: np.ndarray, spread: float = 1.0
) -> np.ndarray:
    """Unit vectors scattered around random cluster centres (embeddings of classes)."""
    picks = centres[rng.integers(0, len(centres), n)]
    noise = rng.standard_normal((n, centres.shape[1])) * spread / math.sqrt(centres.shape[1])
    return unit(picks + noise).astype(np.float32)


@pytest.fixture(scope="module")
def faiss_one_thread() -> Iterator[None]:
    """One FAISS thread: k-means and HNSW construction give the same result on every run, and
    no thread spin-waits on a busy CI machine."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@contextmanager
def read_only_mount(mount_args: list[str], where: Path, what: str) -> Iterator[Path]:
    """`mount MOUNT_ARGS WHERE` for the block (read-only mounts: EROFS stops root too, where
    chmod does not), skipping the test where this machine cannot mount (`what` says which)."""
    done = subprocess.run(["mount", *mount_args, str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot {what} here ({done.stderr.decode().strip()[:80]})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
