"""`pactl serve`, tested as users meet it: a real `pactl serve` process on a free 127.0.0.1
port, over HTTP, against the local `pactl query` as the reference."""

from __future__ import annotations

import http.client
import io
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_class_folder, run_cli
from PIL import Image

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

TOKEN = "s3cret-token-for-tests"
START_DEADLINE_S = 120.0


@dataclass
class Service:
    url: str
    process: subprocess.Popen[bytes]
    root: Path  # holds imgs/, bundle/, allowed/, outside/
    log: Path
    served: str = "bundle"  # the folder under root that is served (a bundle or a bundle set)

    @property
    def bundle(self) -> Path:
        return self.root / self.served

    @property
    def images(self) -> list[Path]:
        return sorted((self.root / "imgs").rglob("*.png"))

    def client(self, token: str | None = TOKEN) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60.0)


def _cli(args: list[str]) -> None:
    """`pactl ARGS` in this process (set up outside a test: no capsys)."""
    from pactl.cli import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["pactl", *args])
        try:
            main()
        except SystemExit as e:
            assert e.code in (0, None), f"pactl {' '.join(args)} exited {e.code}"


def build_bundle(root: Path) -> None:
    """root/imgs (4 classes x 4 images), root/best.pt (an untrained TINY network, made in a
    fraction of a second), root/bundle."""
    tiny_images_and_checkpoint(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACTL_HOME", str(root / "home"))
        patch.chdir(root)
        _cli(["index", "imgs", "--checkpoint", "best.pt", "--out", "bundle", "--quiet"])


def tiny_images_and_checkpoint(root: Path) -> None:
    """root/imgs (4 classes x 4 images) and root/best.pt (an untrained TINY network)."""
    import torch

    from pactl import checkpoint
    from pactl.config import ModelConfig
    from pactl.model import build_model

    make_class_folder(root / "imgs", classes=4, per_class=4)
    config = ModelConfig(
        backbone="small", weights="none", embedding_dim=16, image_size=16, resize_size=16
    )
    torch.manual_seed(0)
    net, filled = build_model(config)
    weights = checkpoint.clean_state_dict(net)
    classes = [f"class_{c}" for c in range(4)]
    checkpoint.save(root / "best.pt", checkpoint.export_payload(weights, filled, classes, 1, {}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(root: Path, *extra: str, served: str = "bundle") -> Service:
    """`pactl serve root/SERVED` as a subprocess; returns once /health answers."""
    port = free_port()
    log = root / f"serve-{port}.log"
    command = [sys.executable, "-m", "pactl", "serve", str(root / served), "--port", str(port)]
    with open(log, "wb") as sink:
        process = subprocess.Popen([*command, *extra], stdout=sink, stderr=sink, cwd=root)
    service = Service(f"http://127.0.0.1:{port}", process, root, log, served)
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"pactl serve exited {process.returncode}: {log.read_text()}")
        try:
            with service.client() as client:
                if client.get("/health").status_code == 200:
                    return service
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop_service(service)
    raise AssertionError(f"pactl serve did not answer in {START_DEADLINE_S} s: {log.read_text()}")


def stop_service(service: Service) -> None:
    service.process.terminate()
    try:
        service.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        service.process.kill()
        service.process.wait()


_STARTED: list[Service] = []  # the one service of this test session (test_serve*.py share it)


def shared_service(factory: pytest.TempPathFactory, session: pytest.Session) -> Service:
    """Start the service once per session (a bundle of 16 items, a token, an --allow-root
    folder, a 1 MiB upload limit, a 40 ms batch window), stopped when the session ends."""
    if _STARTED:
        return _STARTED[0]
    root = factory.mktemp("serve")
    build_bundle(root)
    (root / "allowed").mkdir()
    (root / "outside").mkdir()
    Image.open(root / "imgs" / "class_1" / "2.png").save(root / "allowed" / "q.png")
    Image.open(root / "imgs" / "class_2" / "1.png").save(root / "outside" / "secret.png")
    os.symlink(root / "outside" / "secret.png", root / "allowed" / "link.png")
    service = start_service(
        root,
        *("--token", TOKEN, "--allow-root", str(root / "allowed")),
        *("--max-upload-mb", "1", "--batch-wait-ms", "40"),
    )
    _STARTED.append(service)
    session.addfinalizer(lambda: stop_service(service))
    return service


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Service:
    return shared_service(tmp_path_factory, request.session)


def upload(path: Path, name: str | None = None) -> tuple[str, tuple[str, bytes, str]]:
    return ("files", (name or path.name, path.read_bytes(), "image/png"))


def local_jsonl(
    service: Service, paths: list[Path], monkeypatch: Any, capsys: Any, *extra: str
) -> dict[str, list[dict[str, Any]]]:
    """`pactl query --format jsonl` in this process: hits per query name."""
    code, out, err = run_cli(
        ["query", *map(str, paths), "--index", str(service.bundle), "--format", "jsonl", *extra],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    grouped: dict[str, list[dict[str, Any]]] = {}
    for line in out.splitlines():
        row = json.loads(line)
        grouped.setdefault(row["query"], []).append(row)
    return grouped


def same_hits(served_hits: list[dict[str, Any]], local_hits: list[dict[str, Any]]) -> None:
    assert [h["id"] for h in served_hits] == [h["id"] for h in local_hits]
    assert [h["path"] for h in served_hits] == [h["path"] for h in local_hits]
    assert [h["label"] for h in served_hits] == [h["label"] for h in local_hits]
    np.testing.assert_allclose(
        [h["score"] for h in served_hits], [h["score"] for h in local_hits], atol=1e-5
    )


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels, with almost no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


# ------------------------------------------------------------------------------ queries


def test_query_uploads_equal_local_query(served: Service, monkeypatch: Any, capsys: Any) -> None:
    """POST /query answers what `pactl query --format jsonl` prints for the same images: the
    same ids, paths and labels, scores to 1e-5; with exclude_self, by the names sent."""
    picks = served.images[::5]
    reference = local_jsonl(served, picks, monkeypatch, capsys, "--k", "5")
    with served.client() as client:
        reply = client.post("/query", params={"k": 5}, files=[upload(p) for p in picks])
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert [r["query"] for r in results] == [p.name for p in picks]
    for picked, result in zip(picks, results, strict=True):
        same_hits(result["hits"], reference[str(picked)])
        assert set(result["hits"][0]) == {"query", "rank", "id", "path", "label", "score"}

    own = local_jsonl(served, picks, monkeypatch, capsys, "--k", "3", "--exclude-self")
    names = json.dumps([str(p) for p in picks])
    with served.client() as client:
        reply = client.post(
            "/query",
            params={"k": 3, "exclude_self": "true"},
            files=[upload(p) for p in picks],
            data={"names": names},
        )
    for picked, result in zip(picks, reply.json()["results"], strict=True):
        assert result["query"] == str(picked)
        same_hits(result["hits"], own[str(picked)])
        assert all(h["path"] != str(picked) for h in result["hits"])


def test_query_by_item_id_equals_local_exclude_self(
    served: Service, monkeypatch: Any, capsys: Any
) -> None:
    """?id=N queries with the item's own image, as `pactl query ITEM --exclude-self` does."""
    with served.client() as client:
        item = client.get("/items/6").json()
        reply = client.post("/query", params={"k": 4, "id": 6, "exclude_self": "true"})
    assert reply.status_code == 200, reply.text
    reference = local_jsonl(served, [Path(item["path"])], monkeypatch, capsys, "--exclude-self")
    same_hits(reply.json()["results"][0]["hits"], reference[item["path"]])
    assert 6 not in [h["id"] for h in reply.json()["results"][0]["hits"]]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "table"])
def test_query_server_prints_what_local_prints(
    served: Service, fmt: str, monkeypatch: Any, capsys: Any
) -> None:
    """`pactl query --server URL` writes the very bytes the local query writes, a missing file
    skipped in both."""
    images = [str(served.images[0]), str(served.root / "imgs" / "class_3"), "missing.png"]
    common = ["--k", "3", "--format", fmt, "--exclude-self"]
    code, local, _ = run_cli(
        ["query", *images, "--index", str(served.bundle), *common], monkeypatch, capsys
    )
    assert code == 0
    code, remote, err = run_cli(
        ["query", *images, "--server", served.url, "--token", TOKEN, *common], monkeypatch, capsys
    )
    assert code == 0, err
    assert "skipped query missing.png: file not found" in err
    assert remote == local and len(local.splitlines()) >= 5 * 3


def test_query_server_fits_requests_to_the_services_upload_limit(
    served: Service, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """The service takes 1 MiB a request: two images of 0.6 MB go in two requests and are both
    answered; one of 1.3 MB is skipped here with why, and the rest are answered (the client
    filled requests to its own fixed size, got a 413 mid-body, and stopped at 'cannot reach')."""
    rng = np.random.default_rng(0)

    def noise(name: str, side: int) -> str:
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(tmp_path / name)
        return str(tmp_path / name)

    first, second, big = noise("a.png", 450), noise("b.png", 450), noise("big.png", 660)
    assert 550_000 < os.path.getsize(first) < 700_000 and os.path.getsize(big) > 2**20
    images = [first, big, str(served.images[1]), second]
    args = ["query", *images, "--k", "2", "--format", "csv", "--server", served.url]
    code, out, err = run_cli([*args, "--token", TOKEN], monkeypatch, capsys)
    assert code == 0, err
    answered = [row.split(",")[0] for row in out.splitlines()[1:]]
    assert sorted(set(answered)) == sorted([first, second, str(served.images[1])])
    assert f"skipped query {big}: {os.path.getsize(big):,} bytes: over the service's" in err


def test_the_network_thread_only_runs_the_forward_pass(tmp_path: Path) -> None:
    """Requests decode their images on their own threads (embed.decode_files) before the
    batcher: a pass takes decoded pictures and reads no file, so a large image being decoded
    holds up no other request's forward pass. Its answers are those of the files."""
    from pactl.embed import decode_files
    from pactl.serve.config import ServeConfig
    from pactl.serve.engine import Engine, Job

    build_bundle(tmp_path)
    engine = Engine(ServeConfig(bundle=tmp_path / "bundle"))
    files = sorted((tmp_path / "imgs").rglob("*.png"))[:3]
    decoded = decode_files([*files, tmp_path / "none.png"], engine.model_cfg)
    assert len(decoded) == 3 and decoded.failed[0][0] == 3
    names = ["a", "b", "c", "d"]
    gone = [tmp_path / "moved" / f"{n}.png" for n in names]  # no file is there to read
    job = Job(gone, names, [None] * 4, 3, False, decoded=decoded)
    answer = engine.answer([job])[0]
    assert [name for name, _ in answer.results] == names[:3] and answer.skipped[0][0] == "d"
    again = Job(
        files, names[:3], [None] * 3, 3, False, decoded=decode_files(files, engine.model_cfg)
    )
    assert engine.answer([again])[0].results == answer.results


def test_query_server_refusals(served: Service, monkeypatch: Any, capsys: Any) -> None:
    image = str(served.images[0])
    code, _, err = run_cli(
        ["query", image, "--server", served.url, "--index", str(served.bundle)],
        monkeypatch,
        capsys,
    )
    assert code == 2 and "--index" in err
    code, _, err = run_cli(
        ["query", image, "--server", served.url, "--token", "wrong-token!"], monkeypatch, capsys
    )
    assert code == 1 and "token" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["query", image, "--server", "ftp://x"], monkeypatch, capsys)
    assert code == 2 and "--server" in err


def test_concurrent_requests_share_passes(served: Service) -> None:
    """Eight clients at once are embedded in fewer than eight forward passes, and each gets
    the answer it gets alone."""
    picks = served.images[:8]
    with served.client() as client:
        alone = [
            client.post("/query", params={"k": 3}, files=[upload(p)]).json()["results"][0]
            for p in picks
        ]
        before = client.get("/health").json()["forward_passes"]
    together: list[Any] = [None] * len(picks)
    barrier = threading.Barrier(len(picks))

    def ask(i: int) -> None:
        with served.client() as client:
            barrier.wait()
            together[i] = client.post("/query", params={"k": 3}, files=[upload(picks[i])])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(picks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    with served.client() as client:
        passes = client.get("/health").json()["forward_passes"] - before
    assert 1 <= passes < len(picks)
    for reply, single in zip(together, alone, strict=True):
        assert reply.status_code == 200
        same_hits(reply.json()["results"][0]["hits"], single["hits"])


# ------------------------------------------------------------------------------ safety


def test_token_refused_and_accepted(served: Service) -> None:
    with served.client(token=None) as client:
        assert client.get("/health").status_code == 401
        refused = client.post("/query", files=[upload(served.images[0])])
        assert refused.status_code == 401 and "token" in refused.json()["detail"]
        assert client.get("/items/0/thumbnail").status_code == 401
        assert client.get("/").status_code == 200  # the page itself holds no data
    with served.client(token="not-the-token") as client:
        assert client.get("/health").status_code == 401
    with served.client() as client:
        assert client.get("/health").status_code == 200


def test_non_loopback_bind_needs_token(served: Service, monkeypatch: Any, capsys: Any) -> None:
    code, _, err = run_cli(["serve", str(served.bundle), "--host", "0.0.0.0"], monkeypatch, capsys)
    assert code == 2 and "--token" in err and len(err.strip().splitlines()) == 1


def test_taken_port_is_one_line(served: Service, monkeypatch: Any, capsys: Any) -> None:
    port = served.url.rsplit(":", 1)[1]
    code, _, err = run_cli(["serve", str(served.bundle), "--port", port], monkeypatch, capsys)
    assert code == 1 and f"cannot listen on 127.0.0.1:{port}" in err
    assert len(err.strip().splitlines()) == 1


def test_serve_without_extra_is_one_line(served: Service, monkeypatch: Any, capsys: Any) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "fastapi" else real(name, *a)
    )
    code, _, err = run_cli(["serve", str(served.bundle)], monkeypatch, capsys)
    assert code == 1 and "pip install 'pactl[serve]'" in err
    assert len(err.strip().splitlines()) == 1


def test_serve_without_a_bundle_takes_the_latest_runs(monkeypatch: Any, capsys: Any) -> None:
    import pactl.index
    import pactl.serve.server
    from pactl.store.home import runs_dir

    runs = runs_dir()
    code, out, err = run_cli(["serve"], monkeypatch, capsys)  # no runs yet: one line, exit 1
    assert code == 1 and out == "" and err.count("\n") == 1
    assert f"no index bundle under {runs}/" in err and "pactl serve BUNDLE" in err
    served: list[Path] = []
    monkeypatch.setattr(
        pactl.serve.server, "serve", lambda config, log: served.append(config.bundle)
    )
    # The bundles here are only their meta.json: which one is taken is the question, not
    # whether its files check out (test_bundle_integrity.py asks that).
    monkeypatch.setattr(pactl.index, "verify_bundle_or_set", lambda bundle, log: None)
    for run, age in (("old", 100), ("new", 0)):
        (runs / run / "index").mkdir(parents=True)
        meta = runs / run / "index" / "meta.json"
        meta.write_text("{}")
        os.utime(meta, (time.time() - age, time.time() - age))
    code, _, err = run_cli(["serve"], monkeypatch, capsys)
    assert code == 0 and served == [runs / "new" / "index"], err
    assert f"using index {runs / 'new' / 'index'}" in err


def test_cli_import_stays_without_the_web_stack() -> None:
    web = "{'fastapi', 'uvicorn', 'starlette'}"
    probe = f"import sys, pactl.cli; print(sorted({web} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr


def test_oversize_upload_is_413(served: Service) -> None:
    big = os.urandom(1_300_000)  # over the 1 MiB the service was given
    with served.client() as client:
        declared = client.post("/query", files=[("file", ("big.png", big, "image/png"))])
        assert declared.status_code == 413 and "upload limit" in declared.json()["detail"]
        boundary = "xyz"
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="b.png"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        chunks = iter([head, big[:700_000], big[700_000:], f"\r\n--{boundary}--\r\n".encode()])
        streamed = client.post(
            "/query",
            content=chunks,  # no Content-Length: counted as it arrives
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        assert streamed.status_code == 413, streamed.text
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (png_claiming(30_000, 30_000), "decompression bomb"),
        (b"", "empty"),
        (b"this is not an image, only some text", "not an image"),
        (None, "truncated"),  # a real PNG cut in half
    ],
)
def test_unreadable_uploads_are_400_one_line(
    served: Service, data: bytes | None, words: str
) -> None:
    if data is None:
        buffer = io.BytesIO()
        pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buffer, "PNG")
        data = buffer.getvalue()[: len(buffer.getvalue()) // 2]
    with served.client() as client:
        reply = client.post("/query", files=[("file", ("bad.png", data, "image/png"))])
        assert reply.status_code == 400, reply.text
        detail = reply.json()["detail"]
        assert words in detail and "\n" not in detail and detail.startswith("cannot read bad.png")
        assert client.get("/health").status_code == 200


def test_thumbnails_come_only_from_items(served: Service) -> None:
    with served.client() as client:
        thumb = client.get("/items/0/thumbnail")
        assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
        picture = Image.open(io.BytesIO(thumb.content))
        original = Image.open(client.get("/items/0").json()["path"])
        assert picture.size == original.size  # 16 px: under the 256 px bound, kept
        huge = 2**63  # past int64: no item has it, and it is no 500
        for bad in ("/items/999999/thumbnail", "/items/-1/thumbnail", "/items/999999"):
            assert client.get(bad).status_code == 404
        for bad in (f"/items/{huge}", f"/items/{huge}/thumbnail", f"/items/-{huge * 4}"):
            assert client.get(bad).status_code == 404, bad
        assert client.post("/query", params={"id": huge}).status_code == 404
        gone = client.post("/delete", json={"ids": [huge]})
        assert gone.status_code == 400 and f"no item with id {huge}" in gone.json()["detail"]
        assert client.get("/items/abc/thumbnail").status_code == 422
    secret = (served.root / "outside" / "secret.png").read_bytes()
    for raw in (
        "/static/../../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/items/..%2F..%2F..%2Fetc%2Fpasswd/thumbnail",
        "/..%2f..%2f..%2fetc%2fpasswd",
        f"/items/0/thumbnail?path={served.root}/outside/secret.png",
        "/static/../serve/app.py",
        "/static/index.html",
    ):
        status, body = raw_get(served, raw)
        assert status in (200, 404, 422) and b"root:" not in body and b"import" not in body
        assert secret not in body
        if status == 200:  # only the thumbnail itself (the extra parameter is ignored)
            assert raw.startswith("/items/0/thumbnail")


def raw_get(service: Service, target: str) -> tuple[int, bytes]:
    """A GET with the path exactly as written (no client-side normalisation)."""
    host, port = service.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.putrequest("GET", target, skip_accept_encoding=True)
        connection.putheader("Authorization", f"Bearer {TOKEN}")
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_path_queries_only_under_allow_root(served: Service) -> None:
    allowed = served.root / "allowed"
    with served.client() as client:
        inside = client.post("/query", params={"path": str(allowed / "q.png"), "k": 3})
        assert inside.status_code == 200, inside.text
        uploaded = client.post("/query", params={"k": 3}, files=[upload(allowed / "q.png")])
        same_hits(inside.json()["results"][0]["hits"], uploaded.json()["results"][0]["hits"])
        for outside in (
            "/etc/passwd",
            str(served.root / "outside" / "secret.png"),
            f"{allowed}/../outside/secret.png",
            str(allowed / "link.png"),  # a link inside that leads out
            str(served.images[0]),  # an item, but not under the root: by ?id= instead
        ):
            reply = client.post("/query", params={"path": outside})
            assert reply.status_code == 403, (outside, reply.text)
            assert "allow-root" in reply.json()["detail"]
        named = client.post(
            "/query",
            params={"k": 3},
            files=[upload(allowed / "q.png")],
            data={"names": json.dumps(["/etc/passwd"])},  # a name only: never read
        )
        assert named.json()["results"][0]["query"] == "/etc/passwd"
        same_hits(named.json()["results"][0]["hits"], uploaded.json()["results"][0]["hits"])
        assert client.post("/query", params={"id": 999999}).status_code == 404


def test_disconnect_mid_upload_leaves_service_up(served: Service) -> None:
    host, port = served.url.removeprefix("http://").split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /query HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + TOKEN.encode()
                + b"\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                b"Content-Length: 500000\r\n\r\n--b\r\nContent-Disposition: form-data; "
                b'name="file"; filename="x.png"\r\n\r\n' + b"\x89PNG" + b"\0" * 2000
            )
    with served.client() as client:
        reply = client.post("/query", params={"k": 2}, files=[upload(served.images[1])])
        assert reply.status_code == 200


def test_hostile_burst_leaves_it_answering(served: Service) -> None:
    """A bounded burst of malformed requests from 12 threads (127.0.0.1 only): none is a 5xx
    but 503 (too many at once), and afterwards the service answers as before."""
    with served.client() as client:
        before = client.post("/query", params={"k": 3}, files=[upload(served.images[2])]).json()
    rng = np.random.default_rng(0)
    junk = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in (0, 10, 5000)]
    attempts: list[tuple[str, str, dict[str, Any]]] = [
        (
            "POST",
            "/query",
            {"content": junk[2], "headers": {"Content-Type": "multipart/form-data; boundary=zz"}},
        ),
        (
            "POST",
            "/query",
            {"content": b"--zz\r\ngarbage", "headers": {"Content-Type": "multipart/form-data"}},
        ),
        ("POST", "/query?k=0", {"files": [upload(served.images[0])]}),
        ("POST", "/query?k=99999999999", {}),
        ("POST", "/query?exclude_self=maybe", {}),
        ("POST", "/query", {"json": {"ids": [1]}}),
        ("POST", "/query", {"data": {"names": "[1, 2"}, "files": [upload(served.images[0])]}),
        ("POST", "/query", {"files": [("files", ("x", junk[1], "image/png"))] * 3}),
        ("POST", "/delete", {"content": junk[2]}),
        ("POST", "/delete", {"json": {"ids": ["x"]}}),
        ("POST", "/add", {"data": {"label": "../../etc"}, "files": [upload(served.images[0])]}),
        ("GET", "/query", {}),
        ("GET", "/items/1e9/thumbnail", {}),
        ("DELETE", "/items/0", {}),
    ]
    statuses: list[int] = []

    def hammer(worker: int) -> None:
        with served.client() as client:
            for n in range(12):
                method, path, options = attempts[(worker + n) % len(attempts)]
                try:
                    statuses.append(client.request(method, path, **options).status_code)
                except httpx.TransportError:
                    statuses.append(0)

    threads = [threading.Thread(target=hammer, args=(w,)) for w in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(statuses) == 144
    assert all(400 <= s < 500 or s == 503 for s in statuses), sorted(set(statuses))
    with served.client() as client:
        after = client.post("/query", params={"k": 3}, files=[upload(served.images[2])]).json()
    same_hits(after["results"][0]["hits"], before["results"][0]["hits"])


# ------------------------------------------------------------------------------ upkeep
# These change the served bundle: they run last.


def test_new_generation_from_cli_add_is_picked_up(
    served: Service, monkeypatch: Any, capsys: Any
) -> None:
    with served.client() as client:
        health = client.get("/health").json()
    extra = make_class_folder(served.root / "extra", classes=1, per_class=2, seed=7)
    code, _, err = run_cli(["index", str(extra), "--add", str(served.bundle)], monkeypatch, capsys)
    assert code == 0, err
    newcomer = sorted(extra.rglob("*.png"))[0]
    with served.client() as client:
        now = client.get("/health").json()
        assert now["items"] == health["items"] + 2 and now["generation"] != health["generation"]
        hits = client.post("/query", params={"k": 1}, files=[upload(newcomer)]).json()
    top = hits["results"][0]["hits"][0]
    assert top["path"] == str(newcomer) and top["score"] == pytest.approx(1.0, abs=1e-5)


def test_add_then_delete_through_the_api(served: Service) -> None:
    image = served.images[3]
    data = image.read_bytes()
    with served.client() as client:
        count = client.get("/health").json()["items"]
        added = client.post(
            "/add", files=[("file", ("new.png", data, "image/png"))], data={"label": "fresh"}
        )
        assert added.status_code == 200, added.text
        again = client.post("/add", files=[("file", ("новый é.png", data, "image/png"))])
        body, second = added.json(), again.json()
        assert body["added"] == 1 and second["count"] == count + 2
        assert Path(second["paths"][0]).name == "000-новый_é.png"  # letters kept, space made _
        assert os.path.isabs(second["paths"][0])
        (new_id,) = body["ids"]
        (path,) = body["paths"]
        assert second["paths"][0] != path and Path(path).read_bytes() == data  # never replaced
        assert Path(path).is_relative_to(served.bundle / "uploads")
        item = client.get(f"/items/{new_id}").json()
        stat = os.stat(path)
        metadata = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        assert item == {"id": new_id, "path": path, "label": "fresh", "metadata": metadata}
        hits = client.post("/query", params={"k": 5}, files=[upload(image)]).json()
        assert new_id in [h["id"] for h in hits["results"][0]["hits"]]
        bad = client.post("/add", files=[("file", ("x.png", b"nope", "image/png"))])
        assert bad.status_code == 400 and "not an image" in bad.json()["detail"]
        before = sorted(served.root.rglob("*"))
        for label in ("../escape", "..", "a/b", "x\x00y"):
            named = client.post("/add", files=[upload(image)], data={"label": label})
            assert named.status_code == 400, (label, named.text)
        assert sorted(served.root.rglob("*")) == before  # nothing written, anywhere

        gone = client.post("/delete", json={"ids": [new_id]})
        assert gone.status_code == 200, gone.text
        assert gone.json() == {"deleted": 1, "count": count + 1}
        assert client.get(f"/items/{new_id}").status_code == 404
        hits = client.post("/query", params={"k": 20}, files=[upload(image)]).json()
        assert new_id not in [h["id"] for h in hits["results"][0]["hits"]]
        unknown = client.post("/delete", json={"ids": [987654]})
        assert unknown.status_code == 400 and "987654" in unknown.json()["detail"]


def test_a_write_while_another_writer_holds_the_bundle_is_409(served: Service) -> None:
    from pactl.store.generations import writer_lock

    image = served.images[4]
    uploads = sorted((served.bundle / "uploads").rglob("*"))
    with served.client() as client:
        before = client.get("/health").json()
        with writer_lock(served.bundle):  # as a `pactl index --add` in another process would
            added = client.post("/add", files=[upload(image)])
            gone = client.post("/delete", json={"ids": [0]})
        for answer in (added, gone):
            assert answer.status_code == 409, answer.text
            assert "being written by another pactl process" in answer.json()["detail"]
        after = client.get("/health").json()
        assert after["items"] == before["items"] and after["generation"] == before["generation"]
        assert client.get("/items/0").status_code == 200  # not deleted
    assert sorted((served.bundle / "uploads").rglob("*")) == uploads  # no orphan upload kept


def test_concurrent_writes_to_one_service_all_land(served: Service) -> None:
    """Writes to one service arrive together (its requests are threads of one process): each
    answered 200 is in the bundle afterwards, none is a 500, and the bundle reads whole."""
    from concurrent.futures import ThreadPoolExecutor

    from pactl.index import load_bundle

    data = served.images[5].read_bytes()
    many = 12
    with served.client() as client:
        before = client.get("/health").json()["items"]

    def add(n: int) -> Any:
        with served.client() as client:
            return client.post("/add", files=[("file", (f"c{n}.png", data, "image/png"))])

    def delete(item: int) -> Any:
        with served.client() as client:
            return client.post("/delete", json={"ids": [item]})

    with ThreadPoolExecutor(many) as pool:
        added = list(pool.map(add, range(many)))
    assert [a.status_code for a in added] == [200] * many, [a.text for a in added]
    ids = [a.json()["ids"][0] for a in added]
    assert len(set(ids)) == many and -1 not in ids
    bundle = load_bundle(served.bundle)
    assert bundle.live_count == before + many and not bundle.is_deleted(np.array(ids)).any()
    with ThreadPoolExecutor(many) as pool:
        gone = list(pool.map(delete, ids))
    assert [g.status_code for g in gone] == [200] * many, [g.text for g in gone]
    assert [g.json()["deleted"] for g in gone] == [1] * many
    bundle = load_bundle(served.bundle)
    assert bundle.is_deleted(np.array(ids)).all() and bundle.live_count == before
    with served.client() as client:
        assert client.get("/health").json()["items"] == before


def test_the_client_refuses_what_a_local_query_refuses_in_the_same_words(tmp_path: Path) -> None:
    from pactl.errors import PactlError
    from pactl.images import ImageError, load_image
    from pactl.serve.client import read_image_bytes

    fifo = tmp_path / "q.png"
    os.mkfifo(fifo)  # opening it to read would block until a writer came
    for name in (fifo, tmp_path, tmp_path / "missing.png"):
        with pytest.raises(ImageError) as local:
            load_image(name)
        with pytest.raises(PactlError) as remote:
            read_image_bytes(name)
        assert str(local.value) == f"{name}: {remote.value}"
    with pytest.raises(PactlError, match=r"^not a regular file \(a FIFO\)$"):
        read_image_bytes(fifo)
