"""The HTTP side of `pactl serve`: a FastAPI application over an Engine. The rules every
route shares (hosts, token, origins, body limits) are pactl.serve.guard's layers around it, and
every body is parsed through pactl.serve.bodies; a handler holds only its own logic.

Every error is JSON `{"detail": "one line"}` (ASCII, so a name that is not UTF-8 is escaped,
never a 500) with a 4xx status, 507 for a full disk, 5xx only for a fault of the service
itself. Files are read only where the service was told it may: the page's own files (a fixed
list, never a path from the request), the bundle's items (thumbnails, queries by id) and, for
`?path=` queries, the `--allow-root` folders (opened without following links).
"""

from __future__ import annotations

import asyncio
import errno
import html
import io
import json
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from pactl.config import EmbedConfig
from pactl.embed import decode_files
from pactl.errors import Busy, NoSpace, PactlError, ReadOnly
from pactl.index.rescoring import MAX_RESCORE
from pactl.rules import MAX_K
from pactl.serve.bodies import json_object, names_of, upload_form, uploads_of
from pactl.serve.config import ServeConfig
from pactl.serve.engine import Answer, Batcher, Engine, Job
from pactl.serve.guard import SlowBody, TooLarge
from pactl.serve.uploads import fd_path, open_allowed, store_for_add, write_scratch
from pactl.version import __version__

DECODERS = max(2, min(4, os.cpu_count() or 1))  # requests decoding their images at once
STATIC = {  # URL path -> (file in pactl/static, media type): nothing else is ever served
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
    "/review": ("review.html", "text/html; charset=utf-8"),  # pactl.serve.review
    "/static/review.js": ("review.js", "text/javascript; charset=utf-8"),
}
PAGE_SECRET = "{{page-secret}}"  # in index.html: this process's secret, for the page's writes
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
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
REFUSALS = ((Busy, 409), (ReadOnly, 403), (NoSpace, 507))  # PactlError kinds -> status


class AsciiJSON(JSONResponse):
    """JSON in ASCII: names that are not UTF-8 (lone surrogates) are escaped, not a 500."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def create_app(config: ServeConfig, engine: Engine, secret: str) -> FastAPI:
    """The routes; pactl.serve.guard.guarded puts the shared rules around them."""
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
        default_response_class=AsciiJSON,
    )
    app.state.config, app.state.engine, app.state.batcher = config, engine, batcher
    _errors(app)
    _pages(app, secret)
    _reads(app)
    _queries(app)
    _writes(app)
    if config.findings is not None and config.decisions is not None:
        from pactl.serve.review import open_review, review_routes

        review_routes(app, open_review(config.findings, config.decisions))
    return app


def _errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = " ".join(str(part) for part in first.get("loc", ()))
        return AsciiJSON({"detail": f"{where}: {first.get('msg', 'invalid')}"}, 422)

    @app.exception_handler(PactlError)
    async def refused(request: Request, exc: PactlError) -> JSONResponse:
        # 409: another writer holds the bundle; 403: it is read-only; 507: the disk is full
        status = next((code for kind, code in REFUSALS if isinstance(exc, kind)), 400)
        return AsciiJSON({"detail": " ".join(str(exc).split())}, status)

    @app.exception_handler(TooLarge)
    async def too_large(request: Request, exc: TooLarge) -> JSONResponse:
        return AsciiJSON({"detail": str(exc)}, 413)

    @app.exception_handler(SlowBody)
    async def slow(request: Request, exc: SlowBody) -> JSONResponse:
        return AsciiJSON({"detail": str(exc)}, 408, headers={"Connection": "close"})

    @app.exception_handler(OSError)
    async def file_system(request: Request, exc: OSError) -> JSONResponse:
        """A write the file system refuses: a read-only bundle or upload folder (403), a full
        disk (507); the reason and the file, in one line."""
        where = exc.filename or "a file"
        if exc.errno in READ_ONLY:
            why = "it is read-only" if exc.errno == errno.EROFS else "permission denied"
            detail = f"cannot write {where} ({why}): this service only reads that folder"
            return AsciiJSON({"detail": detail}, 403)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return AsciiJSON({"detail": f"no space left on the device writing {where}"}, 507)
        return await fault(request, exc)

    @app.exception_handler(Exception)
    async def fault(request: Request, exc: Exception) -> JSONResponse:
        line = " ".join(str(exc).split())[:200] or type(exc).__name__
        return AsciiJSON({"detail": f"internal error: {line}"}, 500)


def _pages(app: FastAPI, secret: str) -> None:
    for url, (name, media) in STATIC.items():

        def page(name: str = name, media: str = media) -> Response:
            text = (resources.files("pactl") / "static" / name).read_text(encoding="utf-8")
            text = text.replace(PAGE_SECRET, html.escape(secret))
            return Response(text, media_type=media, headers={"Cache-Control": "no-store"})

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


def _queries(app: FastAPI) -> None:
    engine: Engine = app.state.engine
    config: ServeConfig = app.state.config
    batcher: Batcher = app.state.batcher
    # Requests decode their own images, beside the network's thread; this many at once, so
    # a burst of large images takes a bounded share of memory and cores.
    decoding = asyncio.Semaphore(DECODERS)

    @app.post("/query", openapi_extra=UPLOAD_BODY)
    async def query(
        k: int = Query(4, ge=1, le=MAX_K, description="Neighbours per query."),
        exclude_self: bool = Query(False, description="Drop each query's own item (by id)."),
        same_item: bool = Query(
            False, description="Keep only hits at or above the calibrated same-item threshold."
        ),
        id: list[int] = Query([], description="Query with these items' images."),  # noqa: A002
        path: list[str] = Query([], description="Images under an --allow-root folder."),
        rescore: int | None = Query(
            None,
            ge=0,
            le=MAX_RESCORE,
            description="A binary bundle: candidates per hit rescored by exact cosine "
            "(default: the bundle's measured depth; 0: Hamming order).",
        ),
        form: FormData | None = Depends(upload_form),
    ) -> Response:
        """Top-k for uploaded images (`file`, `files`), items (`id`) or allowed paths (`path`):
        per query its hits, with the fields of `pactl query --format jsonl`."""
        if form is None:  # the client went away mid-upload
            return Response(status_code=499)
        uploads = uploads_of(form)
        names = names_of(form, len(uploads))
        count = len(uploads) + len(id) + len(path)
        if count == 0:
            raise HTTPException(400, "no query: upload file/files, or give ?id= or ?path=")
        if count > config.max_files:
            raise HTTPException(413, f"{count} queries in one request; at most {config.max_files}")
        if rescore is not None and not hasattr(engine.fresh().bundle.index, "with_rescore"):
            raise HTTPException(400, "rescore is for binary bundles; this one holds float vectors")
        opened: list[int] = []  # ?path= files, open until decoded: never opened again by name
        try:
            with tempfile.TemporaryDirectory(prefix="pactl-serve-") as scratch:
                job = Job([], [], [], k, exclude_self, rescore=rescore)
                job.min_score = _same_item_threshold(engine) if same_item else None
                files = await run_in_threadpool(write_scratch, uploads, Path(scratch))
                for i, (file, upload) in enumerate(zip(files, uploads, strict=True)):
                    given = names[i] if names is not None else None
                    job.add(file, given or upload.filename or f"upload {i + 1}", given)
                for item_id in id:
                    item_path = _item(engine, item_id)[0]
                    job.add(Path(item_path), item_path, item_id)
                for wanted in path:
                    opened.append(open_allowed(wanted, config.allow_roots))
                    job.add(fd_path(opened[-1]), wanted, os.path.abspath(wanted))
                async with decoding:
                    job.decoded = await run_in_threadpool(decode_files, job.files, engine.model_cfg)
                answer = await batcher.submit(job)
        finally:
            for fd in opened:
                os.close(fd)
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
        return AsciiJSON({"detail": f"cannot read {name}: {why}{more}", "skipped": skipped}, 400)
    results = [{"query": name, "hits": [_hit(h) for h in hits]} for name, hits in answer.results]
    return AsciiJSON({"k": k, "results": results, "skipped": skipped})


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
    async def add(form: FormData | None = Depends(upload_form)) -> dict[str, Any]:
        """Embed uploaded images (`file`, `files`, optional `label`) and append them to the
        bundle as a new generation; they are kept under the upload folder."""
        from pactl.console import QUIET
        from pactl.verbs.add import add_to_index

        if form is None:  # the client went away mid-upload
            return {}
        uploads = uploads_of(form)
        if not uploads:
            raise HTTPException(400, "nothing to add: upload file or files")
        label = form.get("label")
        staged = await run_in_threadpool(
            store_for_add, uploads, label if isinstance(label, str) else "", config.uploads
        )
        try:
            async with turn:
                done = await run_in_threadpool(
                    add_to_index,
                    str(staged.folder),
                    config.bundle,
                    None,
                    EmbedConfig(device=config.device),
                    QUIET,
                )
        except BaseException:  # not added (another writer, a full disk): keep nothing of it
            staged.drop()
            raise
        staged.keep()
        snapshot = await run_in_threadpool(engine.fresh)
        added = sorted(os.path.abspath(p) for p in staged.folder.rglob("*") if p.is_file())
        ids = snapshot.lookup.ids(added).tolist()
        return {"added": done["added"], "count": done["count"], "ids": ids, "paths": added}

    @app.post("/delete")
    async def delete(body: dict[str, Any] = Depends(json_object)) -> dict[str, Any]:
        """Remove items by id or path (JSON `{"ids": [...], "paths": [...]}`, sent as
        `Content-Type: application/json`): a new generation in which no search finds them."""
        from pactl.index import delete_items

        ids, paths = body.get("ids", []), body.get("paths", [])
        if not _list_of(ids, int) or not _list_of(paths, str) or not (ids or paths):
            raise HTTPException(400, 'give {"ids": [integers]} and/or {"paths": [strings]}')
        async with turn:
            removed = await run_in_threadpool(
                lambda: delete_items(config.bundle, ids=tuple(ids), paths=tuple(paths))
            )
        snapshot = await run_in_threadpool(engine.fresh)
        return {"deleted": int(removed), "count": int(snapshot.bundle.live_count)}


def _list_of(value: Any, kind: type) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, kind) and not isinstance(v, bool) for v in value
    )
