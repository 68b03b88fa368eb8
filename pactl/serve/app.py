"""The HTTP side of `pactl serve`: a FastAPI application over an Engine, behind a Guard.

Every error is JSON `{"detail": "one line"}` with a 4xx status (5xx only for a fault of the
service itself). Files are read only where the service was told it may: the page's own files
(a fixed list, never a path from the request), the bundle's items (thumbnails, queries by id)
and, for `?path=` queries, the `--allow-root` folders.
"""

from __future__ import annotations

import asyncio
import hmac
import io
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pactl import __version__
from pactl.config import MAX_K
from pactl.embed import decode_files
from pactl.errors import Busy, PactlError
from pactl.serve.config import PUBLIC_PATHS, ServeConfig
from pactl.serve.engine import Answer, Batcher, Engine, Job
from pactl.serve.uploads import check_allowed, store_for_add, write_scratch

DECODERS = max(2, min(4, os.cpu_count() or 1))  # requests decoding their images at once
STATIC = {  # URL path -> (file in pactl/static, media type): nothing else is ever served
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}
UPLOAD_BODY = {  # the multipart body, for the OpenAPI page (the handlers parse it themselves)
    "requestBody": {
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
                        "names": {"type": "string", "description": "JSON list of query names"},
                        "label": {"type": "string", "description": "POST /add: their label"},
                    },
                }
            }
        }
    }
}


class TooLarge(Exception):
    """The request body went past the upload limit while it was being read."""


class Guard:
    """Outermost ASGI layer: the token on every data request, the body size limit (declared
    and actual), before any of the body is parsed."""

    def __init__(self, app: ASGIApp, token: str | None, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.token = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.token and scope["path"] not in PUBLIC_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.token):
                return await _reply(
                    send, 401, "a valid token is needed (header Authorization: Bearer TOKEN)"
                )
        declared = headers.get(b"content-length", b"0")
        if not declared.isdigit():
            return await _reply(send, 400, "Content-Length is not a number")
        if int(declared) > self.max_bytes:
            return await _reply(send, 413, self.too_large())
        await self.app(scope, self._counted(receive), send)

    def too_large(self) -> str:
        return f"the request is over the upload limit of {self.max_bytes:,} bytes"

    def _counted(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise TooLarge(self.too_large())
            return message

        return counted


async def _reply(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(config: ServeConfig, engine: Engine) -> ASGIApp:
    batcher = Batcher(engine, config.max_batch, config.batch_wait_ms / 1000)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(
        title="pactl serve",
        version=__version__,
        description="Top-k image retrieval over one pactl bundle.",
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.config, app.state.engine, app.state.batcher = config, engine, batcher
    _errors(app)
    _pages(app)
    _reads(app)
    _queries(app)
    _writes(app)
    return Guard(app, config.token, config.max_upload_bytes)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = " ".join(str(part) for part in first.get("loc", ()))
        return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid')}"}, 422)

    @app.exception_handler(PactlError)
    async def refused(request: Request, exc: PactlError) -> JSONResponse:
        status = 409 if isinstance(exc, Busy) else 400  # another writer holds the bundle
        return JSONResponse({"detail": " ".join(str(exc).split())}, status)

    @app.exception_handler(TooLarge)
    async def too_large(request: Request, exc: TooLarge) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 413)

    @app.exception_handler(Exception)
    async def fault(request: Request, exc: Exception) -> JSONResponse:
        line = " ".join(str(exc).split())[:200] or type(exc).__name__
        return JSONResponse({"detail": f"internal error: {line}"}, 500)


def _pages(app: FastAPI) -> None:
    for url, (name, media) in STATIC.items():

        def page(name: str = name, media: str = media) -> Response:
            text = (resources.files("pactl") / "static" / name).read_text(encoding="utf-8")
            return Response(text, media_type=media, headers={"Cache-Control": "no-cache"})

        app.add_api_route(url, page, methods=["GET"], include_in_schema=False)


def _reads(app: FastAPI) -> None:
    engine: Engine = app.state.engine
    config: ServeConfig = app.state.config

    @app.get("/health")
    def health() -> dict[str, Any]:
        """Ready, what is served, and the batcher's counters."""
        snapshot = engine.fresh()
        return {
            "status": "ok",
            "version": __version__,
            "items": int(snapshot.bundle.live_count),
            "dimension": int(snapshot.bundle.index.d),
            "generation": snapshot.generation,
            "forward_passes": engine.passes,
            "queries": engine.queries,
            "reloads": engine.reloads,
            "max_upload_bytes": config.max_upload_bytes,  # what `query --server` fits under
            "max_files": config.max_files,
        }

    @app.get("/items/{item_id}")
    def item(item_id: int) -> dict[str, Any]:
        """An item's path and label, and the size and mtime_ns its file had when embedded."""
        snapshot = engine.fresh()
        found = snapshot.item(item_id)
        if found is None:
            raise HTTPException(404, f"no item {item_id} in the bundle")
        path, label = found
        metadata = snapshot.metadata(item_id)
        return {"id": item_id, "path": path, "label": label, "metadata": metadata}

    @app.get("/items/{item_id}/thumbnail", response_class=Response)
    def thumbnail(item_id: int) -> Response:
        """The item's image, at most thumbnail_size pixels a side, as JPEG."""
        from pactl.images import ImageError, load_image

        path, _ = _item(engine, item_id)
        size = config.thumbnail_size
        try:
            image = load_image(path, target_size=size)
        except ImageError as e:
            raise HTTPException(404, f"item {item_id}'s image cannot be read: {e.reason}") from e
        image.thumbnail((size, size))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=85)
        headers = {"Cache-Control": "private, max-age=300"}
        return Response(buffer.getvalue(), media_type="image/jpeg", headers=headers)


def _item(engine: Engine, item_id: int) -> tuple[str, str]:
    found = engine.fresh().item(item_id)
    if found is None:
        raise HTTPException(404, f"no item {item_id} in the bundle")
    return found


async def read_form(request: Request, config: ServeConfig) -> FormData:
    """The multipart form, within the limits; a client gone mid-upload is ClientDisconnect."""
    try:
        return await request.form(max_files=config.max_files, max_fields=64)
    except TooLarge as e:
        raise HTTPException(413, str(e)) from None


def _uploads(form: FormData) -> list[UploadFile]:
    files = [*form.getlist("file"), *form.getlist("files")]
    if any(not isinstance(f, UploadFile) for f in files):
        raise HTTPException(400, "the fields file and files must be uploaded files")
    return [f for f in files if isinstance(f, UploadFile)]


def _names(form: FormData, count: int) -> list[str] | None:
    """The optional `names` field: a JSON list of one string per upload."""
    raw = form.get("names")
    if raw is None:
        return None
    try:
        names = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        names = None
    if (
        not isinstance(names, list)
        or len(names) != count
        or not all(isinstance(n, str) for n in names)
    ):
        raise HTTPException(400, f"names must be a JSON list of {count} strings, one per upload")
    return names


def _queries(app: FastAPI) -> None:
    engine: Engine = app.state.engine
    config: ServeConfig = app.state.config
    batcher: Batcher = app.state.batcher
    # Requests decode their own images, beside the network's thread; this many at once, so
    # a burst of large images takes a bounded share of memory and cores.
    decoding = asyncio.Semaphore(DECODERS)

    @app.post("/query", openapi_extra=UPLOAD_BODY)
    async def query(
        request: Request,
        k: int = Query(4, ge=1, le=MAX_K, description="Neighbours per query."),
        exclude_self: bool = Query(False, description="Drop each query's own item (by id)."),
        same_item: bool = Query(
            False, description="Keep only hits at or above the calibrated same-item threshold."
        ),
        id: list[int] = Query([], description="Query with these items' images."),  # noqa: A002
        path: list[str] = Query([], description="Images under an --allow-root folder."),
    ) -> Response:
        """Top-k for uploaded images (`file`, `files`), items (`id`) or allowed paths (`path`):
        per query its hits, with the fields of `pactl query --format jsonl`."""
        try:
            form = await read_form(request, config)
        except ClientDisconnect:
            return Response(status_code=499)
        uploads = _uploads(form)
        names = _names(form, len(uploads))
        count = len(uploads) + len(id) + len(path)
        if count == 0:
            raise HTTPException(400, "no query: upload file/files, or give ?id= or ?path=")
        if count > config.max_files:
            raise HTTPException(413, f"{count} queries in one request; at most {config.max_files}")
        with tempfile.TemporaryDirectory(prefix="pactl-serve-") as scratch:
            job = Job([], [], [], k, exclude_self)
            job.min_score = _same_item_threshold(engine) if same_item else None
            files = await run_in_threadpool(write_scratch, uploads, Path(scratch))
            for i, (file, upload) in enumerate(zip(files, uploads, strict=True)):
                given = names[i] if names is not None else None
                job.files.append(file)
                job.names.append(given or upload.filename or f"upload {i + 1}")
                job.own.append(given)
            for item_id in id:
                item_path, _ = _item(engine, item_id)
                job.files.append(Path(item_path))
                job.names.append(item_path)
                job.own.append(item_id)
            for wanted in path:
                job.files.append(check_allowed(wanted, config.allow_roots))
                job.names.append(wanted)
                job.own.append(os.path.abspath(wanted))
            async with decoding:
                job.decoded = await run_in_threadpool(decode_files, job.files, engine.model_cfg)
            answer = await batcher.submit(job)
        return _answer_response(answer, k)


def _same_item_threshold(engine: Engine) -> float:
    try:
        return engine.same_item_threshold()
    except PactlError as e:
        raise HTTPException(400, f"same_item: {e}") from None


def _answer_response(answer: Answer, k: int) -> JSONResponse:
    skipped = [{"query": name, "reason": why} for name, why in answer.skipped]
    if not answer.results:
        name, why = answer.skipped[0]
        more = f" ({len(skipped) - 1} more)" if len(skipped) > 1 else ""
        return JSONResponse({"detail": f"cannot read {name}: {why}{more}", "skipped": skipped}, 400)
    results = [{"query": name, "hits": [_hit(h) for h in hits]} for name, hits in answer.results]
    return JSONResponse({"k": k, "results": results, "skipped": skipped})


def _hit(hit: Any) -> dict[str, Any]:
    """`pactl query --format jsonl`'s fields; the score unrounded (a client rounds it as the
    CLI does, so both print the same digits)."""
    return {
        "query": hit.query,
        "rank": hit.rank,
        "id": hit.id,
        "path": hit.path,
        "label": hit.label,
        "score": float(hit.score),
    }


def _writes(app: FastAPI) -> None:
    engine: Engine = app.state.engine
    config: ServeConfig = app.state.config
    # This service's writes take turns (a write of another process is refused with 409): the
    # bundle's writer lock admits one thread, and a request waiting here holds no thread.
    turn = asyncio.Lock()

    @app.post("/add", openapi_extra=UPLOAD_BODY)
    async def add(request: Request) -> dict[str, Any]:
        """Embed uploaded images (`file`, `files`, optional `label`) and append them to the
        bundle as a new generation; they are kept under the upload folder."""
        from pactl.console import QUIET
        from pactl.pipeline import add_to_index

        try:
            form = await read_form(request, config)
        except ClientDisconnect:
            return {}
        uploads = _uploads(form)
        if not uploads:
            raise HTTPException(400, "nothing to add: upload file or files")
        label = form.get("label")
        stored = await run_in_threadpool(
            store_for_add, uploads, label if isinstance(label, str) else "", config.uploads
        )
        try:
            async with turn:
                done = await run_in_threadpool(
                    add_to_index, str(stored), config.bundle, None, config.device, QUIET
                )
        except BaseException:  # not added (another writer, a full disk): keep nothing of it
            shutil.rmtree(stored, ignore_errors=True)
            raise
        snapshot = await run_in_threadpool(engine.fresh)
        added = sorted(os.path.abspath(p) for p in stored.rglob("*") if p.is_file())
        ids = snapshot.lookup.ids(added).tolist()
        return {"added": done["added"], "count": done["count"], "ids": ids, "paths": added}

    @app.post("/delete")
    async def delete(request: Request) -> dict[str, Any]:
        """Remove items by id or path (JSON `{"ids": [...], "paths": [...]}`): a new generation
        in which no search finds them."""
        from pactl.index import delete_items

        body = await _json_body(request)
        ids, paths = body.get("ids", []), body.get("paths", [])
        if not _list_of(ids, int) or not _list_of(paths, str) or not (ids or paths):
            raise HTTPException(400, 'give {"ids": [integers]} and/or {"paths": [strings]}')
        async with turn:
            removed = await run_in_threadpool(
                lambda: delete_items(config.bundle, ids=tuple(ids), paths=tuple(paths))
            )
        snapshot = await run_in_threadpool(engine.fresh)
        return {"deleted": int(removed), "count": int(snapshot.bundle.live_count)}


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ClientDisconnect:
        raise HTTPException(400, "the client went away") from None
    except ValueError:
        raise HTTPException(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise HTTPException(400, "the body must be a JSON object")
    return body


def _list_of(value: Any, kind: type) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, kind) and not isinstance(v, bool) for v in value
    )
