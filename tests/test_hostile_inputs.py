"""Hostile input through the command line: a full disk while a dataset downloads or unpacks, a
PACTL_HOME that cannot be written, and FIFOs named like images. Each ends as one line on stderr
(or a reported skip), never a traceback or a hang."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, fill, make_class_folder, run_cli, train_tiny
from PIL import Image

from pactl.datasets import catalog
from pactl.datasets.benchmarks import Layout, find_dir
from pactl.datasets.download import Archive

DEADLINE = 180  # seconds; a run that hangs on a FIFO fails here instead of stalling the suite


# ---- a dataset served from 127.0.0.1 ---------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """An HTTP server on 127.0.0.1 for the files in `tmp_path/www`; the paths it was asked for."""
    www = tmp_path / "www"
    www.mkdir()
    asked: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            asked.append(self.path)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=www))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", www, asked
    httpd.shutdown()
    httpd.server_close()


def _tiny_rows(folder: Path, base: Path) -> list[tuple[str, int, str, str]]:
    images = sorted(base.rglob("*.png"))
    return [
        (p.relative_to(folder).as_posix(), int(p.parent.name), "train" if i % 2 else "test", "")
        for i, p in enumerate(images)
    ]


TINY_LAYOUT = Layout(
    locate=lambda folder: find_dir(folder, lambda d: (d / "tiny").is_dir()),
    rows=_tiny_rows,
    expects="tiny/ folder",
)


def _serve_dataset(
    monkeypatch: pytest.MonkeyPatch, url: str, www: Path, padding: bytes
) -> catalog.DatasetSpec:
    """`tiny.tgz` (four PNGs and `padding`) on the server, and a catalog entry for it."""
    with tarfile.open(www / "tiny.tgz", "w:gz") as tf:
        for name, data in [*_pngs(), ("tiny/padding.bin", padding)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    data = (www / "tiny.tgz").read_bytes()
    archive = Archive("tiny.tgz", (f"{url}/tiny.tgz",), len(data), hashlib.sha256(data).hexdigest())
    spec = catalog.DatasetSpec(
        "tiny", "tiny", 2, 4, "tiny", "test data", archives=(archive,), layout=TINY_LAYOUT
    )
    monkeypatch.setitem(catalog.CATALOG, "tiny", spec)
    return spec


def _pngs() -> list[tuple[str, bytes]]:
    out = []
    for i in range(4):
        buffer = io.BytesIO()
        Image.new("RGB", (4, 4), (i * 60, 0, 0)).save(buffer, "PNG")
        out.append((f"tiny/{i % 2}/{i}.png", buffer.getvalue()))
    return out


def _home_on(disk: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[Path, bytes]]:
    """PACTL_HOME on the small disk, holding a dataset prepared earlier: its files by path."""
    home = disk / "home"
    old = home / "datasets" / "old"
    old.mkdir(parents=True)
    (old / "manifest.csv").write_text("path,label,split\na.png,1,train\n")
    (old / "a.png").write_bytes(_pngs()[0][1])
    monkeypatch.setenv("PACTL_HOME", str(home))
    return home, {p: p.read_bytes() for p in old.iterdir()}


def _leftovers(home: Path) -> list[str]:
    """Temporary files and half-made folders below `home`."""
    return [
        str(p.relative_to(home))
        for p in home.rglob("*")
        if p.name.endswith((".part", ".tmp", ".partial")) or (p.is_dir() and not any(p.iterdir()))
    ]


def _one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_full_disk_while_downloading(
    served, full_disk, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, www, asked = served
    padding = np.random.default_rng(0).integers(0, 256, 1_000_000, dtype=np.uint8).tobytes()
    _serve_dataset(monkeypatch, url, www, padding)  # incompressible: the download is ~1 MB
    home, before = _home_on(full_disk, monkeypatch)
    fill(full_disk, leave=300_000)
    code, out, err = run_cli(["download", "tiny", "--quiet"], monkeypatch, capsys)
    line = _one_error(err)
    assert code == 1 and out == ""
    assert line.startswith("error: no space left on the device writing ") and "tiny.tgz" in line
    assert _leftovers(home) == []
    assert {p: p.read_bytes() for p in before} == before
    assert asked == ["/tiny.tgz"]  # a full disk is not retried


def test_full_disk_while_extracting(
    served, full_disk, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, www, asked = served
    _serve_dataset(monkeypatch, url, www, bytes(2_500_000))  # a few kB, 2.5 MB unpacked
    home, before = _home_on(full_disk, monkeypatch)
    fill(full_disk, leave=1_000_000)
    code, out, err = run_cli(["download", "tiny", "--quiet"], monkeypatch, capsys)
    line = _one_error(err)
    assert code == 1 and out == ""
    assert line.startswith("error: no space left on the device writing ")
    assert "tiny/padding.bin" in line
    assert _leftovers(home) == []
    assert {p: p.read_bytes() for p in before} == before
    # The verified download is kept: once there is space, the rerun does not fetch it again.
    (full_disk / ".filler").unlink()
    code, _, err = run_cli(["download", "tiny", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    assert asked == ["/tiny.tgz"]
    assert (home / "datasets" / "tiny" / "manifest.csv").is_file()


def test_full_disk_while_writing_the_bundled_digits(
    full_disk, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home, before = _home_on(full_disk, monkeypatch)
    fill(full_disk, leave=500_000)  # 1,797 small PNGs do not fit
    code, out, err = run_cli(["download", "digits", "--quiet"], monkeypatch, capsys)
    line = _one_error(err)
    assert code == 1 and out == ""
    assert line.startswith("error: no space left on the device writing ") and ".png" in line
    assert _leftovers(home) == [] and not (home / "datasets" / "digits").exists()
    assert {p: p.read_bytes() for p in before} == before


# ---- PACTL_HOME -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["a file", "below a file"])
def test_pactl_home_that_is_no_folder(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_text("not a folder")
    home = tmp_path / "f" if case == "a file" else tmp_path / "f" / "home"
    monkeypatch.setenv("PACTL_HOME", str(home))
    code, out, err = run_cli(["download", "digits", "--quiet"], monkeypatch, capsys)
    line = _one_error(err)
    assert code == 1 and out == ""
    assert line.startswith(f"error: PACTL_HOME={home}: ")
    assert "is a file, not a folder" in line if case == "a file" else "cannot create" in line
    assert (tmp_path / "f").read_text() == "not a folder"


@pytest.mark.parametrize("below", [False, True], ids=["read-only", "below-read-only"])
def test_pactl_home_on_a_read_only_disk(
    below: bool,
    full_disk: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    remount = subprocess.run(["mount", "-o", "remount,ro", str(full_disk)], capture_output=True)
    if remount.returncode != 0:
        pytest.skip(f"cannot remount read-only ({remount.stderr.decode().strip()[:80]})")
    home = full_disk / "home" if below else full_disk
    monkeypatch.setenv("PACTL_HOME", str(home))
    code, out, err = run_cli(["download", "digits", "--quiet"], monkeypatch, capsys)
    line = _one_error(err)
    assert code == 1 and out == ""
    assert line.startswith(f"error: PACTL_HOME={home}: ")
    assert ("cannot create" in line and "Read-only" in line) if below else "read-only" in line


# ---- FIFOs named like images ------------------------------------------------------------------


def _pactl(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`pactl ARGS` in a child process, killed at the deadline (a hang fails the test)."""
    env = {**os.environ, "PACTL_HOME": str(tmp_path / "home"), "PACTL_RUNS": str(tmp_path / "runs")}
    try:
        return subprocess.run(
            [sys.executable, "-m", "pactl", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"pactl {' '.join(args)} hung for {DEADLINE} s")


def test_query_of_a_fifo_is_skipped_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    train_tiny(tmp_path, monkeypatch, capsys)
    assert run_cli(["index", "--quiet"], monkeypatch, capsys)[0] == 0
    os.mkfifo(tmp_path / "x.jpg")
    done = _pactl(["query", "x.jpg", "--k", "2", "--quiet"], tmp_path)
    assert done.returncode == 1 and done.stdout == "", done.stderr  # no query could be read
    assert done.stderr == "error: cannot read query image x.jpg: not a regular file (a FIFO)\n"
    assert "Traceback" not in done.stderr


def test_training_beside_a_fifo_is_not_a_hang(tmp_path: Path) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    os.mkfifo(tmp_path / "imgs" / "class_0" / "x.jpg")
    train = ["train", "imgs", *TINY, "--epochs", "1", "--name", "f", "--quiet"]
    done = _pactl(train, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "skipped 1 entry named like an image but not a regular file" in done.stderr
    assert "x.jpg, a FIFO" in done.stderr and "Traceback" not in done.stderr
