"""The loaded model and bundle, kept fresh, and the batcher that shares forward passes.

The bundle folder's current generation is read once and kept as a Snapshot; every request
compares the `.pactl-current` link with the snapshot's (one readlink) and a changed link loads
the new generation whole before it replaces the snapshot, so no request sees a half-loaded
state. Queries that arrive within `batch_wait_ms` of each other (up to `max_batch` images) are
embedded in one forward pass on one worker thread, then searched per k.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from pactl.serve.config import ServeConfig
from pactl.store.generations import generation_of
from pactl.store.item_table import ID_MAX


@dataclass
class Snapshot:
    generation: str | None  # the `.pactl-current` target it was read from
    bundle: Any  # pactl.index.Bundle

    @cached_property
    def lookup(self) -> Any:
        from pactl.index.search import PathIndex

        return PathIndex(self.bundle.items, skip=self.bundle.deleted)

    def item(self, item_id: int) -> tuple[str, str] | None:
        """(path, label) of a live item of this generation, None when there is none."""
        at = self._position(item_id)
        if at < 0:
            return None
        return str(self.bundle.items.paths[at]), str(self.bundle.items.labels[at])

    def metadata(self, item_id: int) -> dict[str, int]:
        """What the bundle recorded of the item's file when it was embedded (where known)."""
        at = self._position(item_id)
        if at < 0:
            return {}
        recorded = {"size": self.bundle.items.sizes[at], "mtime_ns": self.bundle.items.mtimes[at]}
        return {key: int(value) for key, value in recorded.items() if value >= 0}

    def _position(self, item_id: int) -> int:
        if not 0 <= item_id <= ID_MAX:  # no item has it (and int64 cannot hold some)
            return -1
        wanted = np.array([item_id], dtype=np.int64)
        at = int(self.bundle.items.positions(wanted)[0])
        return -1 if at < 0 or self.bundle.is_deleted(wanted)[0] else at


@dataclass
class Job:
    """One request's queries: image files to embed, their names, and what excludes itself."""

    files: list[Path]
    names: list[str]
    own: list[int | str | None]  # an item id, a path to look up, or nothing, per query
    k: int
    exclude_self: bool
    future: asyncio.Future[Answer] | None = None
    decoded: Any = None  # the files as embed.decode_files gives them, decoded before batching
    min_score: float | None = None  # same_item: hits below this cosine are left out
    rescore: int | None = None  # a binary bundle's candidates per hit (None: its own depth)

    def add(self, file: Path, name: str, own: int | str | None) -> None:
        self.files.append(file)
        self.names.append(name)
        self.own.append(own)


@dataclass
class Answer:
    results: list[tuple[str, list[Any]]] = field(default_factory=list)  # (name, its Hits)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, reason)


class Engine:
    """The model and the current bundle; `answer` runs a batch of jobs on the caller's thread."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.passes = 0  # forward passes run (a pass serves every job of its batch)
        self.queries = 0
        self.reloads = 0
        self._lock = threading.Lock()
        self._load_model_and_bundle()

    def _load_model_and_bundle(self) -> None:
        from pactl.verbs.query import open_query_model

        generation = generation_of(self.config.bundle)
        bundle = self.config.bundle
        instead = (
            f"search its vectors with `pactl query --index {bundle} --vectors FILE.npy`, or "
            "with Index.search in Python"
        )
        opened = open_query_model(
            bundle, None, self.config.device, self.config.faiss_device, "`pactl serve`", instead
        )
        self.model, self.model_cfg, self.device = opened.model.eval(), opened.config, opened.device
        self.snapshot = Snapshot(generation, opened.bundle)

    def fresh(self) -> Snapshot:
        """The current generation's snapshot, loaded whole first if the link moved."""
        if generation_of(self.config.bundle) == self.snapshot.generation:
            return self.snapshot
        with self._lock:
            generation = generation_of(self.config.bundle)
            if generation != self.snapshot.generation:
                self._reload(generation)
            return self.snapshot

    def _reload(self, generation: str | None) -> None:
        from pactl.index import load_bundle_or_set

        bundle = load_bundle_or_set(self.config.bundle, faiss_device=self.config.faiss_device)
        if bundle.meta.get("fingerprint") != self.snapshot.bundle.meta.get("fingerprint"):
            self._load_model_and_bundle()  # rebuilt with another network: load that one
        else:
            self.snapshot = Snapshot(generation, bundle)
        self.reloads += 1

    def answer(self, jobs: list[Job]) -> list[Answer]:
        """Embed every job's decoded images in one forward pass (decoding was done on each
        request's own thread), then search each job with its own k."""
        import torch

        from pactl.embed import embed_decoded

        snapshot = self.fresh()
        row_of: dict[int, int] = {}  # position among all the jobs' files -> row of `vectors`
        reasons: dict[int, str] = {}
        pictures, start = [], 0
        for job in jobs:
            batch = job.decoded
            for index in batch.indices.tolist():
                row_of[start + index] = len(row_of)
            reasons.update((start + index, why) for index, why in batch.failed)
            if len(batch):
                pictures.append(batch.images)
            start += len(job.files)
        vectors = np.empty((0, 0), dtype=np.float32)
        if pictures:
            vectors = embed_decoded(self.model, torch.cat(pictures), self.model_cfg, self.device)
        self.passes += 1
        self.queries += start
        answers, start = [], 0
        for job in jobs:
            positions = range(start, start + len(job.files))
            start += len(job.files)
            answers.append(self._search(snapshot, job, positions, row_of, reasons, vectors))
        return answers

    def _search(
        self,
        snapshot: Snapshot,
        job: Job,
        positions: range,
        row_of: dict[int, int],
        reasons: dict[int, str],
        vectors: np.ndarray,
    ) -> Answer:
        from pactl.images import reason_of
        from pactl.index.search import hits, search

        answer = Answer()
        kept = [i for i, p in enumerate(positions) if p in row_of]
        for i, p in enumerate(positions):
            if p in reasons:
                answer.skipped.append((job.names[i], reason_of(job.files[i], reasons[p])))
        if not kept:
            return answer
        names = [job.names[i] for i in kept]
        own = self._own_ids(snapshot, [job.own[i] for i in kept]) if job.exclude_self else None
        rows = vectors[[row_of[positions[i]] for i in kept]]
        scores, ids = search(snapshot.bundle, rows, job.k, own, rescore=job.rescore)
        found = hits(snapshot.bundle, names, scores, ids)
        if job.min_score is not None:
            found = [[h for h in row if h.score >= job.min_score] for row in found]
        answer.results = list(zip(names, found, strict=True))
        return answer

    def same_item_threshold(self) -> float:
        """The current bundle's calibrated same-item threshold (PactlError: it has none)."""
        from pactl.calibrate import same_item_threshold
        from pactl.verbs.lineage import calibration_of

        meta = self.fresh().bundle.meta
        return same_item_threshold(calibration_of(meta), str(self.config.bundle))[0]

    @staticmethod
    def _own_ids(snapshot: Snapshot, own: list[int | str | None]) -> np.ndarray:
        paths = [o for o in own if isinstance(o, str)]
        found = iter(snapshot.lookup.ids(paths).tolist()) if paths else iter(())
        return np.array(
            [o if isinstance(o, int) else next(found) if isinstance(o, str) else -1 for o in own],
            dtype=np.int64,
        )


class Batcher:
    """Gathers jobs that arrive together into one Engine.answer call on one worker thread."""

    def __init__(self, engine: Engine, max_batch: int, wait_s: float) -> None:
        self.engine, self.max_batch, self.wait_s = engine, max_batch, wait_s
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pactl-embed")
        self.task: asyncio.Task[None] | None = None
        self.carry: Job | None = None  # a job that did not fit the last pass: it opens the next

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.worker.shutdown(wait=False, cancel_futures=True)

    async def submit(self, job: Job) -> Answer:
        job.future = asyncio.get_running_loop().create_future()
        await self.queue.put(job)
        return await job.future

    async def run_on_worker(self, call: Any, *args: Any) -> Any:
        """A blocking call on the embedding thread, between passes (reloads, adds)."""
        return await asyncio.get_running_loop().run_in_executor(self.worker, call, *args)

    async def _run(self) -> None:
        while True:
            jobs = await self._gather()
            live = [j for j in jobs if j.future is not None and not j.future.done()]
            if not live:
                continue
            try:
                answers = await self.run_on_worker(self.engine.answer, live)
            except Exception as e:  # one bad pass fails its requests, never the service
                for job in live:
                    _settle(job, exception=e)
                continue
            for job, answer in zip(live, answers, strict=True):
                _settle(job, answer=answer)

    async def _gather(self) -> list[Job]:
        first, self.carry = self.carry, None
        jobs = [first if first is not None else await self.queue.get()]
        count = len(jobs[0].files)
        deadline = asyncio.get_running_loop().time() + self.wait_s
        while count < self.max_batch:
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), left)
                except TimeoutError:
                    break
            if count + len(job.files) > self.max_batch:
                self.carry = job
                break
            jobs.append(job)
            count += len(job.files)
        return jobs


def _settle(job: Job, answer: Answer | None = None, exception: Exception | None = None) -> None:
    if job.future is None or job.future.done():  # the client went away meanwhile
        return
    if exception is not None:
        job.future.set_exception(exception)
    else:
        job.future.set_result(answer or Answer())
