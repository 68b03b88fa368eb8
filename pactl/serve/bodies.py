"""Every body a route parses, read through one of two dependencies: `json_object` (a JSON body,
`Content-Type: application/json` only) and `upload_form` (a multipart form). One bound applies
to whatever JSON they parse, the body or a form field such as `names`: its size, its nesting
(checked before parsing, so 100,000 levels cost no recursion), and strings that name files
(a lone surrogate is refused unless it stands for a byte of a name that is not UTF-8)."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
from fastapi import HTTPException, Request
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as FormError
from starlette.requests import ClientDisconnect

from pactl.serve.config import ServeConfig
from pactl.serve.guard import TooLarge

MAX_JSON_BYTES = 1 << 20  # a JSON body or field: a /delete of some 10,000 paths
MAX_DEPTH = 32  # nesting of lists and objects; the service's own bodies use 2
MAX_FIELDS = 64  # form fields besides the files
STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def load_json(raw: bytes, what: str) -> Any:
    """`raw` parsed, within the size and depth bounds (400 naming them), else 400."""
    if len(raw) > MAX_JSON_BYTES:
        raise HTTPException(400, f"{what} is {len(raw):,} bytes: at most {MAX_JSON_BYTES:,}")
    depth = nesting(raw)
    if depth > MAX_DEPTH:
        raise HTTPException(400, f"{what} nests {depth:,} levels deep: at most {MAX_DEPTH}")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise HTTPException(400, f"{what} is not JSON") from None
    _check_strings(value, what)
    return value


def nesting(raw: bytes) -> int:
    """How deep lists and objects nest in JSON text (brackets inside strings not counted)."""
    brackets = np.frombuffer(STRING.sub(b"", raw).translate(None, NOT_BRACKETS), dtype=np.uint8)
    if not len(brackets):
        return 0
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def _check_strings(value: Any, what: str) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise HTTPException(
                400, f"{what} holds a lone surrogate that no file name has (escaped as \\uD8xx)"
            ) from None
    elif isinstance(value, list):
        for item in value:
            _check_strings(item, what)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, what)
            _check_strings(item, what)


async def json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object; any other media type is 415 (a browser sends `text/plain`
    across sites without asking first; `application/json` it never does)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise HTTPException(415, "the body must be JSON sent as Content-Type: application/json")
    try:
        body = load_json(await request.body(), "the body")
    except ClientDisconnect:
        raise HTTPException(400, "the client went away") from None
    if not isinstance(body, dict):
        raise HTTPException(400, "the body must be a JSON object")
    return body


async def upload_form(request: Request) -> FormData | None:
    """The multipart form, within the limits; None when the client went away mid-upload."""
    from python_multipart.multipart import DEFAULT_MAX_HEADER_SIZE

    config: ServeConfig = request.app.state.config
    try:
        return await request.form(
            max_files=config.max_files, max_fields=MAX_FIELDS, max_part_size=MAX_JSON_BYTES
        )
    except TooLarge as e:
        raise HTTPException(413, str(e)) from None
    except ClientDisconnect:
        return None
    except FormError as e:  # Starlette's own, for multipart data it cannot parse
        if "Maximum header size exceeded" in _causes(e):
            raise HTTPException(
                400,
                f"a part's headers are over {DEFAULT_MAX_HEADER_SIZE:,} bytes: give the upload "
                "a shorter file name",
            ) from None
        raise


def _causes(error: BaseException) -> str:
    """The messages of the exceptions an error was raised from (multipart's own reason)."""
    seen: list[str] = []
    inner: BaseException | None = error
    while inner is not None and len(seen) < 8:
        seen.append(str(inner))
        inner = inner.__cause__ or inner.__context__
    return " | ".join(seen)


def uploads_of(form: FormData) -> list[UploadFile]:
    files = [*form.getlist("file"), *form.getlist("files")]
    if any(not isinstance(f, UploadFile) for f in files):
        raise HTTPException(400, "the fields file and files must be uploaded files")
    return [f for f in files if isinstance(f, UploadFile)]


def names_of(form: FormData, count: int) -> list[str] | None:
    """The optional `names` field: a JSON list of one string per upload."""
    raw = form.get("names")
    if raw is None:
        return None
    names = (
        load_json(raw.encode("utf-8", "surrogateescape"), "names") if isinstance(raw, str) else None
    )
    if (
        not isinstance(names, list)
        or len(names) != count
        or not all(isinstance(n, str) for n in names)
    ):
        raise HTTPException(400, f"names must be a JSON list of {count} strings, one per upload")
    return names
