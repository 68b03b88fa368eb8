"""`pactl serve` against a hostile network and hostile files, each case on a real `pactl serve`
process on 127.0.0.1: pages of other sites, DNS rebinding, a link swapped under --allow-root,
slow clients, bodies built to crash a parser, a full disk, a read-only bundle, a kill mid-add.
Bounded in count and time; nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import fill, run_cli
from test_serve import (
    START_DEADLINE_S,
    TOKEN,
    Service,
    build_bundle,
    free_port,
    shared_service,
    stop_service,
    upload,
)

httpx = pytest.importorskip("httpx")

EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Service:
    """The session's service with a token (test_serve.py's)."""
    return shared_service(tmp_path_factory, request.session)


@dataclass
class Disks:
    """The open service's folders: the bundle (and its images) on one file system, its
    scratch (TMPDIR) and upload folders on another, each a small tmpfs where mounting is
    allowed (so a test can fill one or make the other read-only), plain folders otherwise."""

    bundle_fs: Path
    scratch_fs: Path
    mounted: bool

    @property
    def uploads(self) -> Path:
        return self.scratch_fs / "uploads"


def mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir()
    mount = shutil.which("mount")
    if mount is None:
        return False
    done = subprocess.run([mount, "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)])
    return done.returncode == 0


def remount(folder: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(folder)], check=True)


def start_announced(root: Path, disks: Disks, env: dict[str, str], *extra: str) -> Service:
    """`pactl serve` as a subprocess, waiting for its "serving on" line; the first connection
    is made the moment the line is there, and must be answered."""
    port = free_port()
    log = root / f"serve-{port}.log"
    command = [sys.executable, "-m", "pactl", "serve", str(disks.bundle_fs / "bundle")]
    options = ["--port", str(port), "--upload-dir", str(disks.uploads), *extra]
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [*command, *options],
            stdout=sink,
            stderr=sink,
            cwd=root,
            env={**os.environ, "TMPDIR": str(disks.scratch_fs), **env},
        )
    service = Service(f"http://127.0.0.1:{port}", process, disks.bundle_fs, log)
    deadline = time.monotonic() + START_DEADLINE_S
    while "serving " not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_service(service)
            raise AssertionError(f"pactl serve did not start: {log.read_text()}")
        time.sleep(0.01)
    answer = raw(service, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 200, answer
    return service


@pytest.fixture(scope="module")
def disks(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("serve-disks")
    mounted = mount_tmpfs(root / "bundle-fs", "64m") and mount_tmpfs(root / "scratch-fs", "8m")
    made = Disks(root / "bundle-fs", root / "scratch-fs", mounted)
    build_bundle(made.bundle_fs)
    yield made
    for folder in (made.bundle_fs, made.scratch_fs):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture(scope="module")
def open_service(disks: Disks) -> Any:
    """A service without a token, as `pactl serve BUNDLE` starts by default, with a 1 s client
    timeout and a second Host name; it SIGKILLs itself at its first write of the bundle
    (PACTL_CRASH_AT=1), which only the last test of this file asks for."""
    service = start_announced(
        disks.bundle_fs.parent,
        disks,
        {"PACTL_CRASH_AT": "1"},
        *("--client-timeout", "1", "--allow-host", "pactl.test"),
    )
    yield service
    stop_service(service)


def raw(service: Service, data: bytes, timeout: float = 30.0) -> bytes:
    """Send `data` as it is on one connection; everything the service answers before closing."""
    port = int(service.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def page_secret(service: Service) -> str:
    with service.client() as client:
        found = re.search(r'name="pactl-page" content="([^"]+)"', client.get("/").text)
    assert found is not None
    return found.group(1)


def data_routes(service: Service) -> list[tuple[str, str]]:
    """(method, path) of every route the OpenAPI schema lists, a sample id filled in."""
    with service.client() as client:
        schema = client.get("/openapi.json").json()
    return [
        (method.upper(), path.replace("{item_id}", "0"))
        for path, methods in schema["paths"].items()
        for method in methods
    ]


# ------------------------------------------------------------------------- other sites


def test_writes_from_another_site_are_refused_on_every_route(
    open_service: Service, disks: Disks
) -> None:
    """A page of another site can send a `text/plain` or multipart POST without asking first:
    each is refused before its handler (403), reads too; nothing is deleted or added. Guards
    against comparing Origin without its port: a page served on another port of this host is
    another origin, and its Origin alone (no Sec-Fetch-Site, as older browsers send) is
    refused."""
    routes = data_routes(open_service)
    assert {("POST", "/add"), ("POST", "/delete"), ("POST", "/query"), ("GET", "/health")} <= set(
        routes
    )
    marks = [
        {"Origin": EVIL},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"},  # another port
        {"Origin": "http://127.0.0.1:1"},  # another port, and nothing else to tell
    ]
    with open_service.client(token=None) as client:
        count = client.get("/health").json()["items"]
        for method, path in routes:
            for headers in marks:
                answer = client.request(method, path, headers=headers)
                assert answer.status_code == 403, (method, path, headers, answer.text)
        form = {"files": [upload(open_service.images[0])]}
        for headers in marks:
            assert client.post("/add", headers=headers, **form).status_code == 403
            sneaky = client.post(
                "/delete",
                content=json.dumps({"ids": [0]}),
                headers={**headers, "Content-Type": "text/plain"},
            )
            assert sneaky.status_code == 403
        assert client.get("/health").json()["items"] == count
        assert client.get("/items/0").status_code == 200
    assert not disks.uploads.exists() or not any(disks.uploads.iterdir())


def test_an_origin_is_its_scheme_host_and_port() -> None:
    """Guards against comparing Origin without its port (or without its scheme): only http or
    https at the very host and port the request was sent to is this service's own origin."""
    from pactl.serve.guard import same_origin

    assert same_origin("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert same_origin("HTTPS://Pactl.Test:8443", "pactl.test:8443")  # a TLS proxy in front
    assert same_origin("http://[::1]:8000", "[::1]:8000")
    for origin, host in [
        ("http://127.0.0.1:8001", "127.0.0.1:8000"),  # another port of this host
        ("http://127.0.0.1", "127.0.0.1:8000"),  # the default port is another port
        ("http://127.0.0.1:8000", "127.0.0.1"),
        ("http://localhost:8000", "127.0.0.1:8000"),
        ("ftp://127.0.0.1:8000", "127.0.0.1:8000"),
        ("null", "127.0.0.1:8000"),
        ("http://127.0.0.1:8000", ""),
    ]:
        assert not same_origin(origin, host), (origin, host)


def test_a_page_on_another_port_cannot_write_even_with_the_token(served: Service) -> None:
    """Guards against comparing Origin without its port, on the service with a token: a write
    that carries the token but an Origin of another port of this host is refused (403) before
    its handler, where the same write with the service's own Origin reaches it (400)."""
    other = served.url.rsplit(":", 1)[0] + ":1"
    unknown = {"ids": [987654]}  # reaches the handler, deletes nothing
    with served.client() as client:
        answer = client.post("/delete", json=unknown, headers={"Origin": other})
        assert answer.status_code == 403 and other in answer.json()["detail"], answer.text
        answer = client.post("/delete", json=unknown, headers={"Origin": served.url})
        assert answer.status_code == 400, answer.text


def test_json_bodies_need_the_json_media_type(open_service: Service) -> None:
    """`text/plain` holding JSON is what a form of another site sends: 415 even from a script."""
    with open_service.client(token=None) as client:
        for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
            answer = client.post(
                "/delete", content=b'{"ids": [0]}', headers={"Content-Type": media}
            )
            assert answer.status_code == 415, (media, answer.text)
            assert "application/json" in answer.json()["detail"]
        assert client.get("/items/0").status_code == 200


def test_the_page_writes_through_its_secret_and_scripts_from_loopback(
    open_service: Service, served: Service, monkeypatch: Any, capsys: Any
) -> None:
    """The same-origin page carries its process's secret; a browser request of this origin
    without it is refused; a script without Origin (curl, pactl query --server) writes."""
    own = open_service.url
    secret = page_secret(open_service)
    assert len(secret) >= 32 and secret != page_secret(served)  # one per process
    unknown = {"ids": [987654]}  # reaches the handler, deletes nothing
    with open_service.client(token=None) as client:
        bare = client.post("/delete", json=unknown, headers={"Origin": own})
        assert bare.status_code == 403 and "page" in bare.json()["detail"]
        wrong = client.post("/delete", json=unknown, headers={"Origin": own, "X-Pactl-Page": "x"})
        assert wrong.status_code == 403
        for headers in (
            {"Origin": own, "Sec-Fetch-Site": "same-origin", "X-Pactl-Page": secret},
            {},  # a script on this machine
        ):
            answer = client.post("/delete", json=unknown, headers=headers)
            assert answer.status_code == 400 and "987654" in answer.json()["detail"], answer.text
        query = client.post(
            "/query", files=[upload(open_service.images[0])], headers={"X-Pactl-Page": secret}
        )
        assert query.status_code == 200
    image = str(open_service.images[0])
    code, out, err = run_cli(
        ["query", image, "--server", open_service.url, "--format", "jsonl"], monkeypatch, capsys
    )
    assert code == 0 and [json.loads(row)["query"] for row in out.splitlines()] == [image] * 4, err
    with served.client() as client:  # with --token, the token is what a browser cannot send
        answer = client.post("/delete", json=unknown, headers={"Origin": served.url})
        assert answer.status_code == 400 and "987654" in answer.json()["detail"]


def test_the_token_and_the_body_limit_hold_on_every_data_route(served: Service) -> None:
    """Every route the schema lists: 401 without the token, and 413 for a declared body over
    the limit (1 MiB here) with it, before anything is read; the page's own files need
    neither."""
    port = served.url.rsplit(":", 1)[1]
    with served.client(token=None) as client:
        for method, path in data_routes(served):
            assert client.request(method, path).status_code == 401, (method, path)
        assert client.get("/").status_code == 200 and client.get("/openapi.json").status_code == 200
    for method, path in data_routes(served):
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: {2**30}\r\n\r\n"
        )
        answer = raw(served, head.encode())
        assert status_of(answer) == 413 and b"upload limit of 1,048,576 bytes" in answer, path


# ------------------------------------------------------------------------- DNS rebinding


def test_a_host_name_not_the_services_is_refused_before_any_handler(
    open_service: Service, served: Service
) -> None:
    """A page of evil.example whose name was rebound to 127.0.0.1 sends `Host: evil.example`:
    refused on every route, the page and reads included; loopback names, --host's and
    --allow-host's answer."""
    port = open_service.url.rsplit(":", 1)[1]
    with open_service.client(token=None) as client:
        for method, path in [*data_routes(open_service), ("GET", "/"), ("GET", "/docs")]:
            for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
                answer = client.request(method, path, headers={"Host": host})
                assert answer.status_code in (400, 421), (method, path, host, answer.text)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"pactl.test:{port}"):
            assert client.get("/health", headers={"Host": host}).status_code == 200, host
    with served.client() as client:  # no --allow-host: pactl.test is another name there
        assert client.get("/health", headers={"Host": "pactl.test"}).status_code in (400, 421)
    no_host = raw(open_service, b"GET /health HTTP/1.0\r\n\r\n")
    assert status_of(no_host) in (400, 421)


# ------------------------------------------------------------------------- path race


def swap_file(target: Path, inside: Path, leading_out: Path, stop: threading.Event) -> None:
    """`target` made, in turn, a hard link of `inside` and a link to `leading_out` (renamed
    over it: it always exists)."""
    spare = target.with_name(f".{target.name}.tmp")
    while not stop.is_set():
        spare.unlink(missing_ok=True)
        os.link(inside, spare)
        os.replace(spare, target)
        os.symlink(leading_out, spare)
        os.replace(spare, target)


def swap_folder(target: Path, leading_out: Path, stop: threading.Event) -> None:
    """`target` in turn a real folder and a link to `leading_out` (a folder cannot be renamed
    over a link: for a moment it is missing)."""
    real = target.with_name(f".{target.name}.real")
    while not stop.is_set():
        os.rename(target, real)
        os.symlink(leading_out, target)
        os.unlink(target)
        os.rename(real, target)


def test_a_link_swapped_under_allow_root_is_never_followed(served: Service) -> None:
    """A file and a folder under --allow-root are swapped with links leading out, as fast as
    a thread goes, while 300 queries name them: each answer is the inside image's, a 403 (a
    link) or a 404 (the folder, mid-swap), never the outside image's and never a 500."""
    allowed, outside = served.root / "allowed", served.root / "outside"
    (allowed / "box").mkdir()
    shutil.copy(allowed / "q.png", allowed / "box" / "q.png")
    (outside / "box").mkdir()
    shutil.copy(outside / "secret.png", outside / "box" / "q.png")
    shutil.copy(allowed / "q.png", allowed / "swapped.png")
    with served.client() as client:
        tops = [
            client.post("/query", params={"k": 1}, files=[upload(image)]).json()
            for image in (allowed / "q.png", outside / "secret.png")
        ]
    inside_top, outside_top = (top["results"][0]["hits"][0]["id"] for top in tops)
    assert inside_top != outside_top
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=swap_file,
            args=(allowed / "swapped.png", allowed / "q.png", outside / "secret.png", stop),
        ),
        threading.Thread(target=swap_folder, args=(allowed / "box", outside / "box", stop)),
    ]
    for thread in threads:
        thread.start()
    statuses: list[int] = []
    leaked = 0
    try:
        with served.client() as client:
            for n in range(300):
                wanted = allowed / "swapped.png" if n % 2 else allowed / "box" / "q.png"
                answer = client.post("/query", params={"k": 1, "path": str(wanted)})
                statuses.append(answer.status_code)
                if answer.status_code == 200:
                    leaked += answer.json()["results"][0]["hits"][0]["id"] != inside_top
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert leaked == 0
    assert set(statuses) <= {200, 403, 404}, sorted(set(statuses))
    assert statuses.count(200) > 0 and statuses.count(403) > 0  # both sides of the race met


# ------------------------------------------------------------------------- slow clients


def test_slow_sockets_cost_only_their_own(open_service: Service) -> None:
    """300 sockets trickling their headers (past the 256 connections that made every other
    request a 503) leave normal requests answered at once; each is closed by the client timeout
    (1 s here), as is a socket that sends nothing and a body that stalls (408)."""
    port = int(open_service.url.rsplit(":", 1)[1])
    slow = []
    for n in range(300):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " if n else b"")
        slow.append(sock)
    try:
        started = time.monotonic()
        with open_service.client(token=None) as client:
            answers = [client.get("/health").status_code for _ in range(5)]
        assert answers == [200] * 5 and time.monotonic() - started < 10
        for sock in slow[:20]:
            assert sock.recv(1) == b""  # closed by the service, within the 10 s socket timeout
        assert slow[0].recv(1) == b""  # the one that sent nothing
    finally:
        for sock in slow:
            sock.close()
    stalled = raw(
        open_service,
        b"POST /delete HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"ids": ',
        timeout=20,
    )
    assert status_of(stalled) == 408 and b"no part of the body came for 1 s" in stalled


# ------------------------------------------------------------------------- hostile bodies


def test_every_parsed_body_is_bounded(open_service: Service) -> None:
    """100,000 levels of nesting in a JSON body or in the multipart field `names`, a lone
    surrogate, a label over 255 bytes and a file name over multipart's header limit: each a
    400 naming the bound, never a 500."""
    deep = b"[" * 100_000 + b"]" * 100_000
    with open_service.client(token=None) as client:
        for body, levels in ((b'{"ids": ' + deep + b"}", "100,001"), (deep, "100,000")):
            answer = client.post(
                "/delete", content=body, headers={"Content-Type": "application/json"}
            )
            assert answer.status_code == 400 and f"{levels} levels deep: at most 32" in answer.text
        names = client.post(
            "/query", files=[upload(open_service.images[0])], data={"names": deep.decode()}
        )
        assert names.status_code == 400 and "names nests 100,000 levels" in names.text
        for escaped, words in ((rb'"\udce9"', "no item"), (rb'"\ud800"', "lone surrogate")):
            answer = client.post(  # \udce9: the byte 0xE9 of a name that is not UTF-8
                "/delete",
                content=b'{"paths": [' + escaped + b"]}",
                headers={"Content-Type": "application/json"},
            )
            assert answer.status_code == 400 and words in answer.json()["detail"], answer.text
        long_label = client.post(
            "/add", files=[upload(open_service.images[0])], data={"label": "é" * 150}
        )
        assert (
            long_label.status_code == 400 and "300 bytes in UTF-8: at most 255" in long_label.text
        )
        long_name = client.post(
            "/query", files=[("file", ("a" * 5000 + ".png", b"x", "image/png"))]
        )
        assert long_name.status_code == 400 and "4,224 bytes" in long_name.json()["detail"]
        assert client.get("/health").status_code == 200


# ------------------------------------------------------------------------- faults


def test_a_full_disk_is_507_and_keeps_nothing(open_service: Service, disks: Disks) -> None:
    """Scratch (TMPDIR) and upload folder on a full tmpfs: a query's uploads and an /add are
    507 naming the folder; nothing of them is left; answers come back once there is room."""
    if not disks.mounted:
        pytest.skip("cannot mount a tmpfs here: the real full-disk case cannot be set up")
    image = open_service.images[0]
    with open_service.client(token=None) as client:
        # a first query while there is room: Python settles on TMPDIR at its first use
        assert client.post("/query", files=[upload(image)]).status_code == 200
        before = sorted(p for p in disks.scratch_fs.rglob("*") if p.is_file())
        fill(disks.scratch_fs)
        big = [("files", (f"{n}.png", os.urandom(200_000), "image/png")) for n in range(3)]
        try:
            for route in ("/query", "/add"):
                answer = client.post(route, files=big)
                assert answer.status_code == 507, (route, answer.text)
                assert "no space left on the device writing" in answer.json()["detail"]
                assert str(disks.scratch_fs) in answer.json()["detail"]
            after = [p for p in disks.scratch_fs.rglob("*") if p.is_file()]
            assert sorted(after) == [*before, disks.scratch_fs / ".filler"]
        finally:
            (disks.scratch_fs / ".filler").unlink()
        assert client.post("/query", files=[upload(image)]).status_code == 200


def test_a_read_only_bundle_answers_reads_and_refuses_writes(
    open_service: Service, disks: Disks
) -> None:
    """The bundle's file system made read-only under the running service: queries answer,
    /delete and /add are 403 saying it is read-only, and no lock file appears."""
    if not disks.mounted:
        pytest.skip("cannot mount a tmpfs here: a read-only file system cannot be set up")
    bundle = disks.bundle_fs / "bundle"
    locks = sorted(bundle.rglob(".pactl-lock"))
    remount(disks.bundle_fs, "ro")
    try:
        with open_service.client(token=None) as client:
            assert client.post("/query", files=[upload(open_service.images[1])]).status_code == 200
            assert client.post("/query", params={"id": 1}).status_code == 200
            gone = client.post("/delete", json={"ids": [1]})
            added = client.post("/add", files=[upload(open_service.images[1])])
            for answer in (gone, added):
                assert answer.status_code == 403, answer.text
                assert "read-only" in answer.json()["detail"]
            assert client.get("/items/1").status_code == 200
    finally:
        remount(disks.bundle_fs, "rw")
    assert sorted(bundle.rglob(".pactl-lock")) == locks
    assert not any(disks.uploads.rglob("*.png"))


def test_an_upload_dir_that_is_a_file_is_refused_at_start(served: Service) -> None:
    plain = served.root / "not-a-folder"
    plain.write_text("x")
    done = subprocess.run(
        [sys.executable, "-m", "pactl", "serve", str(served.bundle), "--upload-dir", str(plain)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{plain} is not a folder" in lines[0]


def test_uploads_of_a_sweep_are_removed_only_when_not_added(tmp_path: Path) -> None:
    """A pending folder whose images the bundle holds (the kill came after the add) is kept and
    unmarked; one it lacks is removed; one whose request still runs (marker locked) is left."""
    from pactl.serve.uploads import PENDING, Staged, sweep_uploads

    class Lookup:
        def ids(self, paths: list[str]) -> Any:
            import numpy as np

            return np.array([7 if "kept" in p else -1 for p in paths], dtype=np.int64)

    folders = {}
    for name in ("kept", "lost"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / PENDING).touch()
        (folders[name] / f"{name}.png").touch()
    running = Staged(tmp_path)
    (running.folder / "img.png").touch()
    assert sweep_uploads(tmp_path, Lookup()) == 1
    assert not folders["lost"].exists()
    assert (folders["kept"] / "kept.png").exists() and not (folders["kept"] / PENDING).exists()
    assert (running.folder / PENDING).exists()
    running.drop()
    assert not running.folder.exists()


def test_a_kill_during_add_leaves_nothing_the_next_start_keeps(
    open_service: Service, disks: Disks
) -> None:
    """The service is SIGKILLed inside POST /add (its first write of the bundle): its uploads
    were kept under a pending name, and the next start removes them and says so; the bundle
    answers as before. Last in this file: it ends the open service."""
    with open_service.client(token=None) as client:
        count = client.get("/health").json()["items"]
        with pytest.raises(httpx.TransportError):
            client.post("/add", files=[upload(open_service.images[2], "killed.png")])
    open_service.process.wait(timeout=60)
    assert open_service.process.returncode == -signal.SIGKILL
    assert list(disks.uploads.glob("*/.pactl-pending"))  # what the kill left
    again = start_announced(disks.bundle_fs.parent, disks, {})
    try:
        assert "removed 1 unfinished upload from" in again.log.read_text()
        assert not any(disks.uploads.rglob("*killed*"))
        with again.client(token=None) as client:
            assert client.get("/health").json()["items"] == count
    finally:
        stop_service(again)
