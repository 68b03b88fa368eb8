"""The first hour with real data: a download on a machine without a network, files placed by
hand, a CSV of absolute paths, and long work that must show progress in a log, not a terminal.

No test here reaches the network: host names are looked up by a stand-in that resolves
127.0.0.1 only, and servers listen on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import math
import re
import socket
import tarfile
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import TINY, make_class_folder, read_csv, run_cli
from PIL import Image
from rich.console import Console

from pactl import console
from pactl.console import Reporter
from pactl.datasets import catalog, read_manifest
from pactl.datasets.benchmarks import Layout, find_dir
from pactl.datasets.download import MIRROR_ENV, Archive, fetch

# Every catalog entry that pactl downloads by itself (not bundled, not click-through only).
DOWNLOADED = sorted(
    name for name, d in catalog.CATALOG.items() if d.archives and not d.manual and not d.offline
)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No name resolves but 127.0.0.1, no mirror is set, and PACTL_HOME is the test's own."""
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: object, **kwargs: object) -> object:
        if host == "127.0.0.1":
            return real(host, *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    monkeypatch.setenv("PACTL_HOME", str(tmp_path / "home"))


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening, closed: connections are refused
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _at(monkeypatch: pytest.MonkeyPatch, name: str, urls: tuple[str, ...]) -> None:
    """Catalog entry `name` with every archive's addresses replaced by `urls`."""
    dataset = catalog.CATALOG[name]
    archives = tuple(dataclasses.replace(a, urls=urls) for a in dataset.archives)
    monkeypatch.setitem(catalog.CATALOG, name, dataclasses.replace(dataset, archives=archives))


# ---- offline --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["unresolvable", "refused", "both"])
@pytest.mark.parametrize("name", DOWNLOADED)
def test_offline_download_is_one_quick_line_saying_what_to_do(
    name: str, where: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _closed_port()
    urls = {
        "unresolvable": ("http://pactl-test.invalid/x.tgz",),
        "refused": (f"http://127.0.0.1:{port}/x.tgz",),
        "both": ("http://pactl-test.invalid/x.tgz", f"http://127.0.0.1:{port}/x.tgz"),
    }[where]
    _at(monkeypatch, name, urls)
    start = time.monotonic()
    code, out, err = run_cli(["download", name], monkeypatch, capsys)
    assert time.monotonic() - start < 10  # a guard, not a benchmark: retries would wait 12 s
    assert code == 1 and out == "" and "Traceback" not in err and "retrying" not in err
    *logged, line = err.splitlines()
    assert logged == [f"downloading {catalog.CATALOG[name].archives[0].name} "
                      f"({catalog.CATALOG[name].archives[0].size:,} bytes)"]  # fmt: skip
    names = [a.name for a in catalog.CATALOG[name].archives]
    cache = catalog.downloads_folder(name)
    place = (  # every file still missing, so that one trip to another machine fetches them all
        f"put the file at {cache / names[0]}"
        if len(names) == 1
        else f"put {', '.join(names[:-1])} and {names[-1]} in {cache}"
    )
    hosts = {
        "unresolvable": "pactl-test.invalid: name not resolved",
        "refused": f"127.0.0.1:{port}: connection refused",
        "both": f"pactl-test.invalid: name not resolved; 127.0.0.1:{port}: connection refused",
    }[where]
    offline = " (offline?)" if where == "unresolvable" else ""  # refused: the network works
    assert line == (
        f"error: cannot download {names[0]} for {name}{offline}: {hosts}; {place}, or run "
        f"`pactl download {name} --from FOLDER`, or set {MIRROR_ENV} to a mirror URL"
    )
    assert len(line.replace(str(cache), "")) < 280  # short besides the path (it was 600+)
    assert not catalog.dataset_folder(name).exists()


def test_files_given_with_from_are_not_asked_for_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _at(monkeypatch, "cars196", ("http://pactl-test.invalid/x",))
    (tmp_path / "dl").mkdir()
    (tmp_path / "dl" / "cars_annos.mat").write_bytes(b"annotations")
    args = ["download", "cars196", "--from", str(tmp_path / "dl"), "--quiet"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 1
    cache = catalog.downloads_folder("cars196")
    assert f"; put the file at {cache / 'car_ims.tgz'}, or run" in err
    assert "cars_annos.mat" not in err


def test_a_file_put_where_the_error_says_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tgz = _tiny_archive(tmp_path / "by-hand")
    _tiny_dataset(monkeypatch, tgz, ("http://pactl-test.invalid/tiny.tgz",))
    code, _, err = run_cli(["download", "tiny", "--quiet"], monkeypatch, capsys)
    assert code == 1
    named = re.search(r"put the file at (\S+), or run `pactl download tiny --from FOLDER`", err)
    assert named is not None, err
    Path(named[1]).parent.mkdir(parents=True)
    Path(named[1]).write_bytes(tgz.read_bytes())
    code, _, err = run_cli(["download", "tiny", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    assert len(read_manifest(catalog.dataset_folder("tiny") / "manifest.csv")) == 4
    assert not Path(named[1]).exists()  # taken as pactl's own download: unpacked, then deleted


def test_from_folder_as_the_error_says_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tgz = _tiny_archive(tmp_path / "Downloads" / "nested")
    _tiny_dataset(monkeypatch, tgz, ("http://pactl-test.invalid/tiny.tgz",))
    assert run_cli(["download", "tiny", "--quiet"], monkeypatch, capsys)[0] == 1
    folder = str(tmp_path / "Downloads")
    code, _, err = run_cli(["download", "tiny", "--from", folder, "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    assert tgz.is_file()  # the user's own copy is never deleted


def _tiny_archive(folder: Path) -> Path:
    """`folder/tiny.tgz`: four 4x4 PNGs of two classes under `tiny/`."""
    folder.mkdir(parents=True)
    with tarfile.open(folder / "tiny.tgz", "w:gz") as tf:
        for i in range(4):
            buffer = io.BytesIO()
            Image.new("RGB", (4, 4), (i * 60, 0, 0)).save(buffer, "PNG")
            info = tarfile.TarInfo(f"tiny/{i % 2}/{i}.png")
            info.size = len(buffer.getvalue())
            tf.addfile(info, io.BytesIO(buffer.getvalue()))
    return folder / "tiny.tgz"


def _tiny_dataset(monkeypatch: pytest.MonkeyPatch, tgz: Path, urls: tuple[str, ...]) -> None:
    def rows(folder: Path, base: Path) -> list[tuple[str, int, str, str]]:
        images = sorted(base.rglob("*.png"))
        return [(p.relative_to(folder).as_posix(), int(p.parent.name), "train", "") for p in images]

    layout = Layout(
        locate=lambda f: find_dir(f, lambda d: (d / "tiny").is_dir()), rows=rows, expects="tiny/"
    )
    data = tgz.read_bytes()
    archive = Archive("tiny.tgz", urls, len(data), hashlib.sha256(data).hexdigest())
    spec = catalog.DatasetSpec(
        "tiny", "tiny", 2, 4, "tiny", "test data", archives=(archive,), layout=layout
    )
    monkeypatch.setitem(catalog.CATALOG, "tiny", spec)


# ---- a CSV of absolute paths ----------------------------------------------------------------


def test_train_reads_a_csv_of_absolute_paths_kept_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    images = make_class_folder(tmp_path / "photos", classes=4, per_class=4)
    rows = [f"{p},{p.parent.name}" for p in sorted(images.rglob("*.png"))]
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "train.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PACTL_RUNS", str(tmp_path / "runs"))
    args = ["train", str(lists / "train.csv"), *TINY, "--epochs", "1", "--name", "abs", "--quiet"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0 and "skipped" not in err, err  # every image was found and decoded
    epochs = read_csv(tmp_path / "runs" / "abs" / "metrics.csv")
    assert [e["epoch"] for e in epochs] == ["0", "1"] and math.isfinite(float(epochs[1]["loss"]))


# ---- progress where stderr is not a terminal --------------------------------------------------


class Clock:
    """A stand-in for time.monotonic in pactl.console: it moves when told, or by `step` at each
    look."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.step = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(console, "monotonic", fake)
    return fake


def _log_reporter(quiet: bool = False) -> tuple[Reporter, io.StringIO]:
    """A reporter writing to a file, as stderr is under `docker logs` or in CI."""
    buffer = io.StringIO()
    stderr = Console(file=buffer, width=80, force_terminal=False, color_system="truecolor")
    return Reporter(stderr, quiet=quiet), buffer


def test_long_work_writes_a_plain_progress_line_every_ten_seconds(clock: Clock) -> None:
    reporter, log = _log_reporter()
    assert not reporter.show_bars and reporter.every == console.PROGRESS_EVERY == 10
    with reporter.bar("embedding", total=10_000) as advance:
        for seconds, n in [(5, 100), (35, 1_134), (40, 1_000), (46, 766), (47, 1), (120, 6_999)]:
            clock.now = 1000.0 + seconds
            advance(n)
    assert log.getvalue().splitlines() == [
        "embedding: 1,234/10,000 (12%), 35 s elapsed, about 4.1 min left",
        "embedding: 3,000/10,000 (30%), 46 s elapsed, about 1.8 min left",
        "embedding: 10,000/10,000 (100%), 2 min elapsed",
    ]
    assert "\x1b" not in log.getvalue()


def test_short_work_and_quiet_runs_write_no_progress(clock: Clock) -> None:
    reporter, log = _log_reporter()
    with reporter.bar("embedding", total=100) as advance:
        for step in range(100):
            clock.now = 1000.0 + step * 0.09  # 9 s in all
            advance()
    quiet, quiet_log = _log_reporter(quiet=True)
    with quiet.bar("embedding", total=100) as advance:
        for step in range(100):
            clock.now = 2000.0 + step * 60
            advance()
    assert log.getvalue() == quiet_log.getvalue() == ""


def test_progress_without_a_total_and_with_a_name_that_is_not_text(clock: Clock) -> None:
    reporter, log = _log_reporter()
    with reporter.bar("extracting [b]x[/b]\x1b[2J.tar", total=None) as advance:
        clock.now += 3 * 3600 + 5 * 60
        advance(5_000)
    assert log.getvalue() == "extracting [b]x[/b]\\x1b[2J.tar: 5,000, 3.1 h elapsed\n"


@pytest.fixture
def www(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 for the files in `tmp_path/www`."""
    folder = tmp_path / "www"
    folder.mkdir()

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return None

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=folder))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", folder
    httpd.shutdown()
    httpd.server_close()


def test_a_download_in_a_log_shows_bytes_and_time_left(
    www: tuple[str, Path], tmp_path: Path, clock: Clock
) -> None:
    url, folder = www
    data = bytes(3_000_000)
    (folder / "a.bin").write_bytes(data)
    reporter, log = _log_reporter()
    clock.step = 20.0  # each look at the clock is 20 s after the last
    sha256 = hashlib.sha256(data).hexdigest()
    fetch([f"{url}/a.bin"], tmp_path / "a.bin", reporter, size=len(data), sha256=sha256)
    lines = log.getvalue().splitlines()
    assert lines[0] == "a.bin: 1.0 MB/3.0 MB (34%), 20 s elapsed, about 37 s left"
    assert "checking a.bin.part: 1.0 MB/3.0 MB (34%), 20 s elapsed, about 37 s left" in lines
    assert lines[-1] == f"a.bin: 3,000,000 bytes verified, from {url}/a.bin"
