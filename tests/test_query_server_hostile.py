"""`pactl query --server` against a server that is not a pactl service, or that redirects the
token elsewhere: one line saying what answered, exit 1, and the token never leaves its origin.
The servers are tiny canned ones on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import one_error, run_cli

TOKEN = "s3cret-token"


def http(status: str, body: bytes, kind: str = "application/json", length: int = -1) -> bytes:
    size = len(body) if length < 0 else length
    head = f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {size}\r\n"
    return (head + "Connection: close\r\n\r\n").encode() + body


HEALTH = http("200 OK", json.dumps({"status": "ok", "version": "x", "max_files": 8}).encode())


class Canned(socketserver.ThreadingTCPServer):
    """Answers each request path (without its query string) with canned bytes; records the
    raw head of every request it got."""

    daemon_threads = allow_reuse_address = True

    def __init__(self, answers: dict[str, bytes]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answers, self.heads = answers, list[bytes]()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(socketserver.StreamRequestHandler):
    server: Canned

    def handle(self) -> None:
        head = b""
        while b"\r\n\r\n" not in head and (line := self.rfile.readline()):
            head += line
        self.server.heads.append(head)
        length = next(
            (int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
             if k.strip().lower() == b"content-length"),
            0,
        )  # fmt: skip
        self.rfile.read(length)  # the whole upload read: closing on unread data resets
        target = head.split(b" ")[1].split(b"?")[0].decode() if head.count(b" ") else ""
        self.wfile.write(self.server.answers.get(target, http("404 Not Found", b"<p>no</p>")))
        self.wfile.flush()
        self.request.shutdown(socket.SHUT_WR)


@contextmanager
def canned(answers: dict[str, bytes]) -> Iterator[Canned]:
    server = Canned(answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def ask(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    image = tmp_path / "q.png"
    image.write_bytes(b"image bytes")  # the client sends bytes; the service would decode them
    args = ["query", str(image), "--server", url, "--token", TOKEN]
    return run_cli(args, monkeypatch, capsys)


def test_token_is_never_sent_to_another_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with canned({"/health": HEALTH}) as elsewhere:
        target = f"{elsewhere.url}/health"
        moved = http("302 Found", b"", kind="text/plain").replace(
            b"\r\n\r\n", f"\r\nLocation: {target}\r\n\r\n".encode(), 1
        )
        with canned({"/health": moved}) as service:
            code, out, err = ask(service.url, tmp_path, monkeypatch, capsys)
    assert code == 1 and out == ""
    line = one_error(err)
    assert target in line and "another origin" in line, line
    assert elsewhere.heads == []  # not even a request without the token
    assert TOKEN not in err


def test_a_redirect_within_the_origin_is_followed_with_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    moved = http("307 Temporary Redirect", b"", kind="text/plain").replace(
        b"\r\n\r\n", b"\r\nLocation: /real/health\r\n\r\n", 1
    )
    with canned({"/health": moved, "/real/health": HEALTH}) as service:
        code, _, err = ask(service.url, tmp_path, monkeypatch, capsys)
    assert [h.split(b" ")[1] for h in service.heads[:2]] == [b"/health", b"/real/health"]
    assert f"Authorization: Bearer {TOKEN}".encode() in service.heads[1]
    assert code == 1 and "404" in one_error(err)  # its /query is not there: one line too


ODD = {
    "an HTML page": {"/health": http("200 OK", b"<!doctype html><h1>Router</h1>", "text/html")},
    "JSON that is not a pactl service's /health": {"/health": http("200 OK", b'{"hello": 1}')},
    "that are not JSON": {"/health": http("200 OK", b"\x00\xff\xfe garbage", "text/plain")},
    "not HTTP": {"/health": b"\x00\xff garbage that is no status line\r\n\r\n"},
    "in the middle of its answer": {"/health": http("200 OK", b'{"stat', length=4000)},
    "closed the connection": {"/health": b""},
    "answered 404 (Not Found): is it a pactl service": {},
    "JSON that is not a pactl service's query answer": {
        "/health": HEALTH,
        "/query": http("200 OK", b'{"results": [{"query": "q", "hits": "nope"}]}'),
    },
}


@pytest.mark.parametrize("said", list(ODD))
def test_what_is_not_a_pactl_service_is_one_line(
    said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with canned(ODD[said]) as server:
        code, out, err = ask(server.url, tmp_path, monkeypatch, capsys)
    assert code == 1 and out == ""
    assert said in one_error(err)
