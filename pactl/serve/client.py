"""`pactl query --server URL`: the queries sent to a running `pactl serve`, the answers turned
back into the QueryChunks the local query yields, so the CLI prints them the same way.

Standard library only (urllib): the client needs no extra. A redirect is followed only within
the service's own origin (scheme, host and port) while it carries the token (urllib would send
`Authorization` anywhere): one to another origin is refused, naming it. An answer that is not
a pactl service's (an HTML page, JSON of another shape, bytes that are not HTTP, a connection
closed mid-answer) is one line saying what answered. Each request carries up to
`chunk` images (128, the local query's forward-pass size, so a service that is not busy embeds
them in the same batch shapes and gives the same digits), and no more than the service's upload
limits (GET /health says them); an image larger than the limit alone is skipped here, with why.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from pactl.errors import PactlError, UsageError
from pactl.results import Hit, QueryChunk
from pactl.store.regular_files import NotRegular, open_regular, os_reason

BATCH_FILES = 128  # files sent in one request at most (fewer where the service says so)
DEFAULT_LIMITS = (20 * 1024 * 1024, 128)  # bytes and files, where /health does not say them
PART_BYTES = 256  # a multipart part's own lines, besides its data (and its name, in "names")
FORM_BYTES = 4096  # the form's other fields and its closing boundary
TIMEOUT_S = 300.0


def check_url(url: str) -> str:
    """An http(s) URL with a host, without its trailing slash."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--server takes a URL such as http://127.0.0.1:8000 (got {url!r:.60})")
    return url.rstrip("/")


def remote_chunks(
    url: str,
    token: str | None,
    images: Iterable[Path],
    k: int,
    exclude_self: bool,
    same_item: bool = False,
    rescore: int | None = None,
) -> Iterator[QueryChunk]:
    """Yield a QueryChunk per request; images that cannot be read here, or that exceed the
    service's upload limit alone, are failed here. `rescore`: a binary bundle's candidates per
    hit (the service's default when None)."""
    asked = {"k": str(k), "exclude_self": str(exclude_self).lower()}
    asked |= {"same_item": "true"} if same_item else {}
    asked |= {"rescore": str(rescore)} if rescore is not None else {}
    limit, most = limits(url, token)
    budget = limit - FORM_BYTES
    pending: list[tuple[str, bytes]] = []
    failed: list[tuple[str, str]] = []
    size = 0
    for image in images:
        name = str(image)
        try:
            data = read_image_bytes(image)
        except PactlError as e:
            failed.append((name, str(e)))
            continue
        cost = len(data) + PART_BYTES + 2 * len(os.path.abspath(name).encode())
        if cost > budget:
            failed.append((name, f"{len(data):,} bytes: over the service's upload limit"))
            continue
        if pending and (len(pending) >= min(BATCH_FILES, most) or size + cost > budget):
            yield _ask(url, token, pending, failed, asked)
            pending, failed, size = [], [], 0
        pending.append((name, data))
        size += cost
    if pending or failed:
        yield _ask(url, token, pending, failed, asked)


def limits(url: str, token: str | None) -> tuple[int, int]:
    """The service's upload limits (bytes in a request, files in a request), from /health."""
    request = urllib.request.Request(f"{url}/health", headers=_auth(token))
    reply = _send(request, f"{url}/health")
    if reply.get("status") != "ok":
        raise not_pactl(url, "JSON that is not a pactl service's /health")
    got = (reply.get("max_upload_bytes"), reply.get("max_files"))
    if all(isinstance(v, int) and v > 0 for v in got):
        return int(got[0]), int(got[1])  # type: ignore[arg-type]
    return DEFAULT_LIMITS  # a service from before it said them


def read_image_bytes(path: Path) -> bytes:
    """A query file's bytes, or the reason it cannot be read, as a local query gives it
    (pactl.store.regular_files: a folder, a FIFO or a device is never opened), without decoding it
    (the service decodes, with embed's limits) and without importing torch."""
    try:
        with open_regular(path) as f:
            return f.read()
    except NotRegular as e:
        raise PactlError(str(e)) from None
    except OSError as e:
        raise PactlError(os_reason(e)) from None


def _ask(
    url: str,
    token: str | None,
    pending: list[tuple[str, bytes]],
    failed: list[tuple[str, str]],
    asked: dict[str, str],
) -> QueryChunk:
    """One POST /query of the `pending` images with the parameters `asked`."""
    if not pending:
        return QueryChunk([], [], failed, [])
    names = [name for name, _ in pending]
    keys = [os.path.abspath(name) for name in names]  # the service finds the items by these
    query = urlencode(asked)
    reply = post_files(f"{url}/query?{query}", token, pending, {"names": json.dumps(keys)})
    try:
        return _chunk(reply, dict(zip(keys, names, strict=True)), failed)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise not_pactl(url, "JSON that is not a pactl service's query answer") from None


def _chunk(
    reply: dict[str, Any], shown: dict[str, str], failed: list[tuple[str, str]]
) -> QueryChunk:
    """The QueryChunk of a /query answer; KeyError, TypeError or ValueError where the answer
    does not have its shape."""
    skipped = [
        (shown.get(s["query"], s["query"]), str(s["reason"])) for s in reply.get("skipped", [])
    ]
    found, hits = [], []
    for result in reply["results"]:
        name = shown.get(result["query"], result["query"])
        found.append(str(name))
        hits.append([_hit(name, h) for h in result["hits"]])
    return QueryChunk(found, hits, failed + skipped, [None] * len(found))


def _hit(name: str, row: dict[str, Any]) -> Hit:
    path, label = row["path"], row["label"]
    if not (isinstance(path, str) and isinstance(label, str)):
        raise TypeError("path and label are text")
    return Hit(name, int(row["rank"]), int(row["id"]), path, label, float(row["score"]))


def post_files(
    url: str, token: str | None, files: list[tuple[str, bytes]], fields: dict[str, str]
) -> dict[str, Any]:
    """POST a multipart form (`files` fields and plain `fields`); the JSON reply. A reply of
    400 that lists skipped images (none could be read) is a reply too."""
    boundary = uuid.uuid4().hex
    body = bytearray()
    for key, value in fields.items():
        body += _part(boundary, f'name="{key}"', value.encode())
    for n, (_, data) in enumerate(files):
        body += _part(boundary, f'name="files"; filename="{n}"', data)
    body += f"--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", **_auth(token)}
    request = urllib.request.Request(url, data=bytes(body), headers=headers, method="POST")
    return _send(request, url)


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _part(boundary: str, disposition: str, data: bytes) -> bytes:
    head = f"--{boundary}\r\nContent-Disposition: form-data; {disposition}\r\n\r\n"
    return head.encode() + data + b"\r\n"


def _send(request: urllib.request.Request, url: str) -> dict[str, Any]:
    base = url.split("?")[0].rsplit("/", 1)[0]
    opener = urllib.request.build_opener(SameOriginRedirects())
    try:
        with opener.open(request, timeout=TIMEOUT_S) as response:
            body, kind = response.read(), response.headers.get_content_type()
    except urllib.error.HTTPError as e:
        refused = _json_of(e)
        if e.code == 400 and isinstance(refused.get("skipped"), list):
            return refused  # none of the images could be read: an answer too
        raise _refusal(e, refused, base) from None
    except (http.client.IncompleteRead, http.client.RemoteDisconnected):
        raise PactlError(
            f"{base} closed the connection in the middle of its answer: is it a pactl service "
            "(`pactl serve`), and still running?"
        ) from None
    except http.client.HTTPException as e:  # a status line or headers that are not HTTP
        raise not_pactl(base, f"something that is not HTTP ({type(e).__name__})") from None
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", None) or e
        raise PactlError(f"cannot reach the service at {base}: {why}") from None
    try:
        reply = json.loads(body)
    except ValueError:  # UnicodeDecodeError too
        raise not_pactl(base, _what(body, kind)) from None
    if not isinstance(reply, dict):
        raise not_pactl(base, "JSON that is not a pactl service's answer")
    return reply


def _refusal(error: urllib.error.HTTPError, reply: dict[str, Any], base: str) -> PactlError:
    """The one line for an HTTP error status."""
    if error.code == 401:
        return PactlError(f"the service at {base} wants a valid token: give --token")
    detail = reply.get("detail")
    if not isinstance(detail, str):  # not FastAPI's error body: maybe not pactl at all
        return PactlError(
            f"{base} answered {error.code} ({error.reason}): is it a pactl service (`pactl serve`)?"
        )
    return PactlError(f"the service at {base} answered {error.code}: {detail}")


def not_pactl(url: str, what: str) -> PactlError:
    return PactlError(f"{url} is not a pactl service (`pactl serve`): it answered {what}")


def _what(body: bytes, kind: str) -> str:
    """What a body that is not JSON looks like, in a few words."""
    if kind in ("text/html", "application/xhtml+xml") or body.lstrip()[:1] == b"<":
        return "an HTML page"
    if kind == "application/json":
        return f"{len(body):,} bytes of malformed JSON"
    return f"{len(body):,} bytes of {kind} that are not JSON"


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of an URL, the port filled in for http and https."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # a port that is not a number names no origin of ours
        port = -1
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects followed as urllib does, except that a request with a token is never sent to
    another origin (urllib would copy its Authorization header there)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        if req.has_header("Authorization") and _origin(newurl) != _origin(req.full_url):
            here = req.full_url.split("?")[0]
            raise PactlError(
                f"{here} redirected to {newurl:.200}, another origin: the token is not sent "
                "there (give that address as --server if it is the service)"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _json_of(error: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        reply = json.loads(error.read())
    except ValueError:
        return {}
    return reply if isinstance(reply, dict) else {}
