"""`pactl query --server URL`: the queries sent to a running `pactl serve`, the answers turned
back into the QueryChunks the local query yields, so the CLI prints them the same way.

Standard library only (urllib): the client needs no extra. Each request carries up to
`chunk` images (128, the local query's forward-pass size, so a service that is not busy embeds
them in the same batch shapes and gives the same digits), and no more than the service's upload
limits (GET /health says them); an image larger than the limit alone is skipped here, with why.
"""

from __future__ import annotations

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
from pactl.files import NotRegular, open_regular, os_reason
from pactl.index.search import Hit
from pactl.pipeline import QueryChunk

CHUNK = 128
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
) -> Iterator[QueryChunk]:
    """Yield a QueryChunk per request; images that cannot be read here, or that exceed the
    service's upload limit alone, are failed here."""
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
        if pending and (len(pending) >= min(CHUNK, most) or size + cost > budget):
            yield _ask(url, token, pending, failed, k, exclude_self, same_item)
            pending, failed, size = [], [], 0
        pending.append((name, data))
        size += cost
    if pending or failed:
        yield _ask(url, token, pending, failed, k, exclude_self, same_item)


def limits(url: str, token: str | None) -> tuple[int, int]:
    """The service's upload limits (bytes in a request, files in a request), from /health."""
    request = urllib.request.Request(f"{url}/health", headers=_auth(token))
    reply = _send(request, f"{url}/health")
    got = (reply.get("max_upload_bytes"), reply.get("max_files"))
    if all(isinstance(v, int) and v > 0 for v in got):
        return int(got[0]), int(got[1])  # type: ignore[arg-type]
    return DEFAULT_LIMITS  # a service from before it said them


def read_image_bytes(path: Path) -> bytes:
    """A query file's bytes, or the reason it cannot be read, as a local query gives it
    (pactl.files: a folder, a FIFO or a device is never opened), without decoding it (the
    service decodes, with embed's limits) and without importing torch."""
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
    k: int,
    exclude_self: bool,
    same_item: bool = False,
) -> QueryChunk:
    if not pending:
        return QueryChunk([], [], failed, [])
    names = [name for name, _ in pending]
    keys = [os.path.abspath(name) for name in names]  # the service finds the items by these
    asked = {"k": k, "exclude_self": str(exclude_self).lower()}
    query = urlencode({**asked, **({"same_item": "true"} if same_item else {})})
    reply = post_files(f"{url}/query?{query}", token, pending, {"names": json.dumps(keys)})
    shown = dict(zip(keys, names, strict=True))
    skipped = [(shown.get(s["query"], s["query"]), s["reason"]) for s in reply.get("skipped", [])]
    found, hits = [], []
    for result in reply.get("results", []):
        name = shown.get(result["query"], result["query"])
        found.append(name)
        hits.append([_hit(name, h) for h in result["hits"]])
    return QueryChunk(found, hits, failed + skipped, [None] * len(found))


def _hit(name: str, row: dict[str, Any]) -> Hit:
    return Hit(name, int(row["rank"]), int(row["id"]), row["path"], row["label"], row["score"])


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
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as e:
        reply = _json_of(e)
        if e.code == 400 and isinstance(reply.get("skipped"), list):
            return reply
        if e.code == 401:
            raise PactlError(f"the service at {base} wants a valid token: give --token") from None
        detail = reply.get("detail") or e.reason
        raise PactlError(f"the service at {base} answered {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", None) or e
        raise PactlError(f"cannot reach the service at {base}: {why}") from None


def _json_of(error: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        reply = json.loads(error.read())
    except ValueError:
        return {}
    return reply if isinstance(reply, dict) else {}
