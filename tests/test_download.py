"""Downloads against a local HTTP server that cuts connections, and archive extraction safety."""

from __future__ import annotations

import contextlib
import hashlib
import io
import socket
import stat
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from conftest import fill

from pactl.console import QUIET, Advance, Reporter
from pactl.datasets.archives import DiskError, UnsafeArchive, extract
from pactl.datasets.download import (
    MIRROR_ENV,
    Archive,
    ChecksumError,
    FetchFailed,
    FetchOptions,
    failure_summary,
    fetch,
    mirror_urls,
    verify,
)
from pactl.errors import PactlError

FAST = FetchOptions(attempts=8, retry_wait=0.0, timeout=5.0)


@dataclass
class Plan:
    """What the server holds and how it misbehaves."""

    files: dict[str, bytes] = field(default_factory=dict)
    cuts: dict[str, list[int]] = field(default_factory=dict)  # absolute offsets, used in order
    ignore_range: set[str] = field(default_factory=set)
    ranges: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)


def _handler(plan: Plan) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return None

        def do_GET(self) -> None:
            name = self.path.lstrip("/")
            plan.ranges.append((name, self.headers.get("Range")))
            if name not in plan.files:
                self.send_error(404)
                return
            data = plan.files[name]
            start = 0
            header = self.headers.get("Range")
            if header and name not in plan.ignore_range:
                start = int(header.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            cuts = [c for c in plan.cuts.get(name, []) if c > start]
            end = cuts[0] if cuts else len(data)
            if cuts:
                plan.cuts[name].remove(end)
            self.wfile.write(data[start:end])
            if cuts:  # drop the connection mid-body, as a flaky network does
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, Plan]]:
    plan = Plan()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(plan))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", plan
    httpd.shutdown()
    httpd.server_close()


def _payload(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8).tobytes()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fetch_downloads_verifies_and_renames(server, tmp_path):
    url, plan = server
    data = _payload(300_000)
    plan.files["a.bin"] = data
    dest = tmp_path / "a.bin"
    found = fetch([f"{url}/a.bin"], dest, QUIET, size=len(data), sha256=_sha(data), options=FAST)
    assert dest.read_bytes() == data
    assert found.sha256 == _sha(data) and found.md5 == hashlib.md5(data).hexdigest()
    assert not (tmp_path / "a.bin.part").exists()


def test_cut_connection_resumes_with_range(server, tmp_path):
    url, plan = server
    data = _payload(250_000, seed=1)
    plan.files["a.bin"] = data
    plan.cuts["a.bin"] = [100_000]
    dest = tmp_path / "a.bin"
    fetch([f"{url}/a.bin"], dest, QUIET, size=len(data), sha256=_sha(data), options=FAST)
    assert dest.read_bytes() == data
    assert [r for _, r in plan.ranges] == [None, "bytes=100000-"]


def test_cuts_at_random_offsets_resume_and_verify(server, tmp_path):
    url, plan = server
    rng = np.random.default_rng(7)
    data = _payload(400_000, seed=2)
    plan.files["a.bin"] = data
    cuts = sorted(set(rng.integers(1, len(data), size=5).tolist()))
    plan.cuts["a.bin"] = list(cuts)
    dest = tmp_path / "a.bin"
    fetch([f"{url}/a.bin"], dest, QUIET, size=len(data), sha256=_sha(data), options=FAST)
    assert dest.read_bytes() == data
    # Every request after the first continues exactly where the previous one was cut.
    assert [r for _, r in plan.ranges] == [None] + [f"bytes={c}-" for c in cuts]


def test_part_left_by_a_killed_run_is_continued(server, tmp_path):
    url, plan = server
    rng = np.random.default_rng(11)
    data = _payload(200_000, seed=3)
    plan.files["a.bin"] = data
    for offset in rng.integers(1, len(data), size=3).tolist():
        dest = tmp_path / f"{offset}" / "a.bin"
        dest.parent.mkdir()
        (dest.parent / "a.bin.part").write_bytes(data[:offset])
        plan.ranges.clear()
        fetch([f"{url}/a.bin"], dest, QUIET, size=len(data), sha256=_sha(data), options=FAST)
        assert dest.read_bytes() == data
        assert plan.ranges == [("a.bin", f"bytes={offset}-")]


def test_server_ignoring_range_restarts_cleanly(server, tmp_path):
    url, plan = server
    data = _payload(120_000, seed=4)
    plan.files["a.bin"] = data
    plan.ignore_range.add("a.bin")
    dest = tmp_path / "a.bin"
    (tmp_path / "a.bin.part").write_bytes(data[:5_000])
    fetch([f"{url}/a.bin"], dest, QUIET, size=len(data), sha256=_sha(data), options=FAST)
    assert dest.read_bytes() == data


def test_wrong_checksum_is_refused_and_nothing_kept(server, tmp_path):
    url, plan = server
    data = _payload(50_000, seed=5)
    plan.files["a.bin"] = data
    dest = tmp_path / "a.bin"
    wrong = _sha(data + b"x")
    with pytest.raises(PactlError, match="sha256"):
        fetch([f"{url}/a.bin"], dest, QUIET, size=len(data), sha256=wrong, options=FAST)
    assert not dest.exists() and not (tmp_path / "a.bin.part").exists()


def test_wrong_size_and_md5_are_refused(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"hello")
    with pytest.raises(ChecksumError, match="bytes"):
        verify(path, QUIET, size=6)
    with pytest.raises(ChecksumError, match="md5"):
        verify(path, QUIET, md5=hashlib.md5(b"hellO").hexdigest())
    assert verify(path, QUIET, md5=hashlib.md5(b"hello").hexdigest()).size == 5


def test_mirror_list_falls_through_to_a_working_address(server, tmp_path, monkeypatch):
    url, plan = server
    data = _payload(30_000, seed=6)
    plan.files["good/a.bin"] = data
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/a.bin"
    urls = [f"{url}/missing/a.bin", dead, f"{url}/good/a.bin"]
    dest = tmp_path / "a.bin"
    fetch(urls, dest, QUIET, size=len(data), sha256=_sha(data), options=FAST)
    assert dest.read_bytes() == data
    # Neither the 404 nor the refused connection is retried; the third address serves.
    assert [p for p, _ in plan.ranges] == ["missing/a.bin", "good/a.bin"]


def test_an_address_serving_another_file_is_skipped_at_once(server, tmp_path):
    url, plan = server
    data = _payload(40_000, seed=8)
    plan.files["page/a.bin"] = b"<html>please confirm</html>"  # a consent page, not the file
    plan.files["good/a.bin"] = data
    dest = tmp_path / "a.bin"
    urls = [f"{url}/page/a.bin", f"{url}/good/a.bin"]
    fetch(urls, dest, QUIET, size=len(data), sha256=_sha(data), options=FAST)
    assert dest.read_bytes() == data
    assert [p for p, _ in plan.ranges] == ["page/a.bin", "good/a.bin"]  # no retries of the page


def test_a_stale_part_that_does_not_verify_is_fetched_afresh(server, tmp_path):
    url, plan = server
    data = _payload(60_000, seed=9)
    plan.files["a.bin"] = data
    (tmp_path / "a.bin.part").write_bytes(data[:30_000] + bytes(30_000))  # full length, wrong
    dest = tmp_path / "a.bin"
    fetch([f"{url}/a.bin"], dest, QUIET, size=len(data), sha256=_sha(data), options=FAST)
    assert dest.read_bytes() == data
    assert plan.ranges == [("a.bin", None)]


def test_pactl_mirror_is_tried_first(monkeypatch):
    archive = Archive(name="x.tgz", urls=("https://example.org/x.tgz",))
    monkeypatch.setenv(MIRROR_ENV, "http://127.0.0.1:9/m1/, http://127.0.0.1:9/m2")
    assert mirror_urls(archive) == [
        "http://127.0.0.1:9/m1/x.tgz",
        "http://127.0.0.1:9/m2/x.tgz",
        "https://example.org/x.tgz",
    ]


def test_all_mirrors_failing_is_one_clear_error(server, tmp_path):
    url, _ = server
    with pytest.raises(PactlError, match="could not download a.bin.*404"):
        fetch([f"{url}/nope"], tmp_path / "a.bin", QUIET, options=FAST)


def test_full_disk_while_downloading_is_one_error_and_leaves_nothing(server, full_disk):
    url, plan = server
    data = _payload(1_000_000, seed=10)
    plan.files["a.bin"] = data
    (full_disk / "old.bin").write_bytes(b"previous output")
    fill(full_disk, leave=200_000)
    with pytest.raises(DiskError, match=r"^no space left on the device writing .*a\.bin\.part"):
        fetch(
            [f"{url}/a.bin", f"{url}/a.bin"], full_disk / "a.bin", QUIET, size=len(data),
            sha256=_sha(data), options=FAST,
        )  # fmt: skip
    assert sorted(p.name for p in full_disk.iterdir()) == [".filler", "old.bin"]
    assert (full_disk / "old.bin").read_bytes() == b"previous output"
    assert len(plan.ranges) == 1  # neither retried nor tried at the next mirror


# ---- hosts that cannot be reached -------------------------------------------------------------


@dataclass
class Resolver:
    """Host name lookups: only 127.0.0.1 resolves, as on a machine without a network, so no
    lookup leaves this one. A name with a script resolves to 127.0.0.1 (True) or fails (False)
    at each lookup in turn, and fails once the script is used up."""

    scripts: dict[str, list[bool]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)


@pytest.fixture
def no_dns(monkeypatch: pytest.MonkeyPatch) -> Resolver:
    resolver = Resolver()
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: object, **kwargs: object) -> object:
        resolver.asked.append(host)
        script = resolver.scripts.get(host, [])
        if host == "127.0.0.1" or (script and script.pop(0)):
            return real("127.0.0.1", *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return resolver


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening, closed: connections are refused
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SLOW_RETRIES = FetchOptions(attempts=4, retry_wait=5.0, timeout=5.0)  # any retry costs 5 s


def test_unreachable_hosts_are_not_retried(no_dns, tmp_path):
    port = _closed_port()
    urls = [
        "http://pactl-test.invalid/x.tgz",
        "http://pactl-test.invalid/other/x.tgz",  # the same host: not asked again
        f"http://127.0.0.1:{port}/x.tgz",
    ]
    reporter, log = _recording(quiet=False)
    start = time.monotonic()
    with pytest.raises(FetchFailed) as caught:
        fetch(urls, tmp_path / "x.tgz", reporter, size=10, options=SLOW_RETRIES)
    assert time.monotonic() - start < 10  # a guard, not a benchmark: one retry alone waits 5 s
    assert "retrying" not in log.getvalue()
    assert no_dns.asked == ["pactl-test.invalid", "127.0.0.1"]
    assert not caught.value.offline  # something listens on 127.0.0.1: the network works
    assert str(caught.value) == (
        "could not download x.tgz (pactl-test.invalid: name not resolved; "
        f"127.0.0.1:{port}: connection refused)"
    )
    assert not list(tmp_path.iterdir())


def test_a_name_that_stops_resolving_mid_transfer_is_retried(server, no_dns, tmp_path):
    url, plan = server
    data = _payload(200_000, seed=12)
    plan.files["a.bin"] = data
    plan.cuts["a.bin"] = [70_000]
    no_dns.scripts["mirror.test"] = [True, False, True]  # a blip after the first request
    port = url.rsplit(":", 1)[1]
    reporter, log = _recording(quiet=False)
    dest = tmp_path / "a.bin"
    fetch([f"http://mirror.test:{port}/a.bin"], dest, reporter, size=len(data),
          sha256=_sha(data), options=FAST)  # fmt: skip
    assert dest.read_bytes() == data
    assert log.getvalue().splitlines()[:2] == [
        "a.bin: connection closed at byte 70,000 of 200,000; retrying (1/7)",
        "a.bin: name not resolved; retrying (2/7)",
    ]
    assert [r for _, r in plan.ranges] == [None, "bytes=70000-"]


def test_failures_are_summed_up_by_host_and_reason():
    failures = [
        ("https://a.example/x?token=secret", "name not resolved"),
        ("https://user:pw@b.example:8443/x", "name not resolved"),
        ("https://c.example/x", "HTTP 404 Not Found"),
        ("https://a.example/y", "name not resolved"),
    ]
    assert failure_summary(failures) == (
        "a.example, b.example:8443: name not resolved; c.example: HTTP 404 Not Found"
    )
    assert not FetchFailed("x", failures).offline
    assert FetchFailed("x", failures[:2]).offline
    assert not FetchFailed("x", [("http://127.0.0.1:9/x", "connection refused")]).offline


# ---- extraction -------------------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _dir(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info, None


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def _only_target_exists(box: Path) -> bool:
    return sorted(p.name for p in box.iterdir()) == ["archive", "target"]


@pytest.fixture
def box(tmp_path: Path) -> Path:
    (tmp_path / "archive").mkdir()
    return tmp_path


def _recording(quiet: bool = True) -> tuple[Reporter, io.StringIO]:
    """A reporter whose warnings (and log lines, unless quiet) land in a buffer."""
    from rich.console import Console

    buffer = io.StringIO()
    return Reporter(Console(file=buffer, width=200), quiet=quiet), buffer


def _links_below(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_symlink()]


def test_tar_extracts_files_and_skips_links(box):
    archive = _tar(
        box / "archive" / "ok.tgz",
        [
            _file("top/a/one.txt", b"1"),
            _link("top/l", "a"),
            _file("top/l/two.txt", b"2"),  # the link was skipped: a folder of its own
            _link("top/copy.txt", "top/a/one.txt", tarfile.LNKTYPE),
        ],
    )
    target = box / "target"
    reporter, warnings = _recording()
    assert extract(archive, target, reporter)
    assert (target / "top/a/one.txt").read_bytes() == b"1"
    assert (target / "top/l/two.txt").read_bytes() == b"2"
    assert not (target / "top/l").is_symlink() and not (target / "top/copy.txt").exists()
    assert "ok.tgz: skipped 2 links (symbolic or hard)" in warnings.getvalue()
    assert not extract(archive, target, QUIET)  # finished once: nothing to redo
    assert _only_target_exists(box)


@pytest.mark.parametrize(
    "members",
    [
        [_file("../evil.txt", b"x")],
        [_file("top/../../evil.txt", b"x")],
    ],
    ids=["dotdot", "nested-dotdot"],
)
def test_tar_members_leaving_the_target_are_refused(box, members):
    archive = _tar(box / "archive" / "bad.tgz", [_file("fine.txt", b"ok"), *members])
    with pytest.raises(UnsafeArchive):
        extract(archive, box / "target", QUIET)
    assert _only_target_exists(box)
    assert not (box / "target" / ".bad.tgz.extracted").exists()


@pytest.mark.parametrize(
    "members",
    [
        # Each link points inside when it is made; together they resolve to the target's parent.
        [_link("a", "b/.."), _link("b", "."), _file("a/escaped.txt", b"x")],
        [_link("evil", "../outside")],
        [_link("evil", "/etc/passwd")],
        [_link("dir", ".."), _file("dir/evil.txt", b"x")],
        [_link("evil", "../outside.txt", tarfile.LNKTYPE)],
        [_link("evil", "/etc/passwd", tarfile.LNKTYPE)],
    ],
    ids=["link-chain", "symlink-out", "symlink-abs", "dir-link-out", "hardlink-out",
         "hardlink-abs"],
)  # fmt: skip
def test_tar_links_are_skipped_never_followed(box, members):
    archive = _tar(box / "archive" / "links.tgz", [_file("fine.txt", b"ok"), *members])
    target = box / "target"
    reporter, warnings = _recording()
    assert extract(archive, target, reporter)
    assert _only_target_exists(box)  # nothing written beside the target
    assert _links_below(target) == []
    assert (target / "fine.txt").read_bytes() == b"ok"
    links = sum(1 for info, _ in members if info.issym() or info.islnk())
    assert f"links.tgz: skipped {links} link" in warnings.getvalue()
    if any(info.name.endswith("/escaped.txt") for info, _ in members):
        assert (target / "a" / "escaped.txt").read_bytes() == b"x"  # a plain folder inside


@pytest.mark.parametrize(
    "members",
    [
        [_file("x", b"1"), _file("x/y", b"2")],
        [_file("x/y", b"2"), _file("x", b"1")],
        [_dir("x"), _file("x", b"1")],
        [_file("x", b"1"), _dir("x")],
        [_file("x", b"1"), _dir("x/y")],
    ],
    ids=["file-then-inner-file", "inner-file-then-file", "dir-then-file", "file-then-dir",
         "file-then-inner-dir"],
)  # fmt: skip
def test_tar_name_both_file_and_folder_is_refused(box, members):
    archive = _tar(box / "archive" / "both.tgz", [_file("fine/a.txt", b"ok"), *members])
    target = box / "target"
    with pytest.raises(UnsafeArchive, match="'x' is both a file and a folder"):
        extract(archive, target, QUIET)
    assert list(target.iterdir()) == []  # what was written is taken back, no marker
    assert _only_target_exists(box)


def test_tar_absolute_member_is_refused(box):
    absolute = str(box / "evil.txt")
    archive = _tar(box / "archive" / "abs.tgz", [_file(absolute, b"x")])
    with pytest.raises(UnsafeArchive):
        extract(archive, box / "target", QUIET)
    assert not Path(absolute).exists()


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_tar_device_files_are_refused(box, kind):
    info = tarfile.TarInfo("dev")
    info.type = kind
    archive = _tar(box / "archive" / "dev.tgz", [(info, None)])
    with pytest.raises(UnsafeArchive, match="device"):
        extract(archive, box / "target", QUIET)
    assert not (box / "target" / "dev").exists()


def _zip(path: Path, members: list[tuple[str, bytes, int]]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


REG = stat.S_IFREG | 0o644
LNK = stat.S_IFLNK | 0o777


@pytest.mark.parametrize(
    "member",
    [("../evil.txt", b"x", REG), ("/evil.txt", b"x", REG), ("C:/evil.txt", b"x", REG),
     ("a\\..\\..\\evil.txt", b"x", REG), ("dev", b"", stat.S_IFCHR | 0o644)],
    ids=["dotdot", "absolute", "drive", "backslash", "device"],
)  # fmt: skip
def test_zip_members_leaving_the_target_are_refused(box, member):
    archive = _zip(box / "archive" / "bad.zip", [("fine.txt", b"ok", REG), member])
    with pytest.raises(UnsafeArchive):
        extract(archive, box / "target", QUIET)
    assert _only_target_exists(box)
    assert not (box / "target" / ".bad.zip.extracted").exists()


def test_zip_links_are_skipped(box):
    archive = _zip(
        box / "archive" / "ok.zip",
        [("d/", b"", stat.S_IFDIR | 0o755), ("d/a.txt", b"A", REG), ("d/l", b"a.txt", LNK),
         ("d/out", b"../../outside", LNK)],
    )  # fmt: skip
    target = box / "target"
    reporter, warnings = _recording()
    extract(archive, target, reporter)
    assert (target / "d/a.txt").read_bytes() == b"A"
    assert _links_below(target) == [] and _only_target_exists(box)
    assert "ok.zip: skipped 2 links" in warnings.getvalue()


@pytest.mark.parametrize(
    "members",
    [[("x", b"1", REG), ("x/y", b"2", REG)], [("x/", b"", stat.S_IFDIR | 0o755),
     ("x", b"1", REG)]],
    ids=["file-then-inner-file", "dir-then-file"],
)  # fmt: skip
def test_zip_name_both_file_and_folder_is_refused(box, members):
    archive = _zip(box / "archive" / "both.zip", [("fine/a.txt", b"ok", REG), *members])
    target = box / "target"
    with pytest.raises(UnsafeArchive, match="'x' is both a file and a folder"):
        extract(archive, target, QUIET)
    assert list(target.iterdir()) == []


class _KilledAfter(Reporter):
    """A reporter whose progress callback dies after n members, like a killed process."""

    def __init__(self, n: int) -> None:
        super().__init__(quiet=True)
        self.n = n

    @contextlib.contextmanager
    def bar(self, description: str, total: int | None) -> Iterator[Advance]:
        count = 0

        def advance(k: int = 1) -> None:
            nonlocal count
            count += 1
            if count >= self.n:
                raise KeyboardInterrupt

        yield advance


@pytest.mark.parametrize("suffix", [".tgz", ".zip"])
def test_interrupted_extraction_is_redone_not_trusted(box, suffix):
    files = {f"top/{i}.bin": _payload(1_000 + i, seed=i) for i in range(6)}
    path = box / "archive" / f"data{suffix}"
    if suffix == ".zip":
        _zip(path, [(name, data, REG) for name, data in files.items()])
    else:
        _tar(path, [_file(name, data) for name, data in files.items()])
    target = box / "target"
    with pytest.raises(KeyboardInterrupt):
        extract(path, target, _KilledAfter(3))
    marker = target / f".data{suffix}.extracted"
    assert not marker.exists()
    # The kill may land mid-write: leave one extracted file torn.
    (target / "top/0.bin").write_bytes(files["top/0.bin"][:10])
    assert extract(path, target, QUIET)
    assert {n: (target / n).read_bytes() for n in files} == files
    assert marker.exists()


def test_full_disk_while_extracting_takes_back_what_it_wrote(box, full_disk):
    files = {f"top/{i}.bin": bytes(400_000) for i in range(4)}  # compresses to almost nothing
    archive = _tar(box / "archive" / "big.tgz", [_file(n, d) for n, d in files.items()])
    target = full_disk / "target"
    target.mkdir()
    (target / "kept.txt").write_bytes(b"previous output")
    fill(full_disk, leave=600_000)
    with pytest.raises(DiskError, match=r"^no space left on the device writing .*top/1\.bin"):
        extract(archive, target, QUIET)
    assert [p.name for p in target.iterdir()] == ["kept.txt"]  # no torn member, no marker
    assert (target / "kept.txt").read_bytes() == b"previous output"
    (full_disk / ".filler").unlink()
    assert extract(archive, target, QUIET)
    assert {n: (target / n).read_bytes() for n in files} == files
