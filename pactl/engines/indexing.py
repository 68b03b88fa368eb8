"""`pactl index --engine ray`: the driver trains the index once (the same seeded sample as a
build here), then one Ray task per shard fills a copy of the trained empty index with its shard
and finds its shard's exact neighbours of the tuning queries; the driver merges the shards'
lists (on disk into index.ivfdata, or in memory), keeps the float copy that lossy codes are
rescored from (floats.npy, in memory builds, as a build here keeps it) and tunes on the union
with the true neighbours merged by score. Same seed, same index, rescoring depth and search
setting as a build here."""

from __future__ import annotations

import copy
import functools
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl.config import EngineConfig, IndexConfig
from pactl.console import QUIET, Reporter, counted
from pactl.engines.cluster import Fault, connected, slots, task_options, wait_all
from pactl.errors import PactlError
from pactl.index.build import add_vectors, check_parts, choose_factory, new_index, train_index
from pactl.index.exact import merge_neighbours, part_neighbours
from pactl.index.gpus import faiss_gpus
from pactl.index.mapped import Part, read_rows
from pactl.index.ondisk import MERGE_DIR, PENDING_IVFDATA, merge_lists, wants_on_disk
from pactl.index.rescoring import FLOATS_FILE, RescoredIndex, lossy, place_floats
from pactl.index.tune import RECALL_K, tune_search, tuning_rows

MIN_PIECE_ROWS = 1_000  # a single vectors file is cut into pieces of at least this many rows
Piece = tuple[int, int, int]  # (part, first row, row past the last): what one task fills


def ray_builder(engine: EngineConfig) -> Any:
    """index_vectors' `build` for `--engine ray` (pactl.verbs.index)."""
    return functools.partial(build_on_ray, engine=engine)


def build_on_ray(
    vectors_dir: Path,
    parts: Sequence[Part],
    config: IndexConfig,
    reporter: Reporter,
    bundle_dir: Path,
    positions: Callable[[np.ndarray], np.ndarray] | None = None,
    *,
    engine: EngineConfig,
    seed: int = 0,
) -> tuple[Any, dict[str, Any]]:
    """Train here, fill one shard per Ray task, merge, tune (the module's docstring). `parts`
    are the (vectors, ids) of `vectors_dir` as index_vectors read them (ids kept by a rebuild
    included); the tasks read their rows from `vectors_dir` themselves (a shared filesystem
    on a cluster). With `positions` (item ids -> rows of the item table), lossy codes built in
    memory are rescored from floats.npy in `bundle_dir` unless config.rescore is 0, as
    pactl.index.build.build_parts does. Returns the index and the record meta.json keeps."""
    n, dim = check_parts(parts)
    factory = config.factory or choose_factory(n, dim, config.memory_budget_gb)
    started = time.perf_counter()
    index = new_index(factory, dim)
    on_disk = wants_on_disk(config, n, dim, sharded=True)
    check_mergeable(index, factory, on_disk)
    rng = np.random.default_rng(seed)
    trained_on = train_index(
        index, parts, rng, seed, reporter, factory, faiss_gpus(config.faiss_device)
    )
    k = min(RECALL_K, n - 1)
    queries, own = read_rows(parts, tuning_rows(n, copy.deepcopy(rng)))  # tune_search's own
    scratch = bundle_dir / MERGE_DIR
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        found, pieces = fill_on_ray(
            vectors_dir, parts, index, queries, k, engine, scratch, reporter
        )
        files = [scratch / f"{i:05d}.faiss" for i in range(len(pieces))]
        index = merge_shards(index, files, on_disk, bundle_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    truth = merge_neighbours(found, own, k) if k >= 1 else None
    if positions is not None and not on_disk and config.rescore != 0 and lossy(index):
        floats = place_floats(parts, bundle_dir / FLOATS_FILE, reporter)
        index = RescoredIndex(index, floats, positions, config.rescore or 1)

    def exact(asked: np.ndarray, asked_own: np.ndarray, asked_k: int) -> np.ndarray:
        if truth is None or asked_k != k or not np.array_equal(asked_own, own):
            raise PactlError("tuning asked for other queries than the shard tasks searched")
        return truth

    tuning = tune_search(
        index, parts, config.target_recall, rng, reporter,
        query_budget_ms=config.query_budget_ms, depth=config.rescore, exact=exact,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    reporter.log(
        f"built {factory} over {counted(n, 'vector')} in {counted(len(pieces), 'Ray task')} in "
        f"{seconds:.1f} s"
    )
    record = {"factory": factory, **tuning, "ntotal": int(index.ntotal), "on_disk": on_disk}
    return index, {
        **record,
        "engine": "ray",
        "shards": len(pieces),
        "train_points": trained_on,
        "seed": seed,
        "build_seconds": round(seconds, 3),
    }


def check_mergeable(index: Any, factory: str, on_disk: bool) -> None:
    """Shards filled apart join only where an index is plain lists or plain codes: an IVF
    (not fast-scan, nor with data beside its lists), or a flat index with an id map; and only an
    IVF's lists merge on disk."""
    inner = unwrapped(index)
    special = isinstance(inner, faiss.IndexIVFPQR | faiss.IndexIVFFastScan)
    ivf = isinstance(inner, faiss.IndexIVF) and not special
    codes = isinstance(inner, faiss.IndexIDMap) and isinstance(
        faiss.downcast_index(inner.index), faiss.IndexFlatCodes
    )
    if on_disk and not ivf:
        raise PactlError(
            f"on-disk merging needs an IVF factory (e.g. IVF4096,Flat), not {factory!r}: pick "
            "one, or build in memory (--on-disk no)"
        )
    if not (ivf or codes):
        raise PactlError(
            f"--engine ray fills shards apart and merges them, which {factory!r} cannot do "
            f"({unmergeable_reason(inner)}): give an IVF or Flat --factory, or build without "
            "--engine ray"
        )


def unwrapped(index: Any) -> Any:
    """The index under its pre-transforms (the id map, if any, kept)."""
    inner = faiss.downcast_index(index)
    while isinstance(inner, faiss.IndexPreTransform):
        inner = faiss.downcast_index(inner.index)
    return inner


def unmergeable_reason(inner: Any) -> str:
    """Why FAISS cannot join this kind's shards, in words."""
    mapped = faiss.downcast_index(inner.index) if isinstance(inner, faiss.IndexIDMap) else inner
    under = unwrapped(mapped)
    if isinstance(under, faiss.IndexHNSW | faiss.IndexNSG):
        return (
            "a graph links each vector to its neighbours in every shard, so it cannot be filled "
            "shard by shard"
        )
    if isinstance(under, faiss.IndexIVFFastScan | faiss.IndexIVFPQR):
        return "a fast-scan or IVFPQR index keeps its codes in a form FAISS does not merge"
    if isinstance(mapped, faiss.IndexPreTransform):
        return "FAISS merges no pre-transform over flat codes; PCA...,IVF...,Flat merges"
    return "FAISS merges only inverted lists and plain flat codes"


def pieces_of(parts: Sequence[Part], wanted: int) -> list[Piece]:
    """One piece per part; a single part (one vectors file) cut into `wanted` pieces of at
    least MIN_PIECE_ROWS rows."""
    if len(parts) > 1:
        return [(i, 0, len(vectors)) for i, (vectors, _) in enumerate(parts)]
    n = len(parts[0][0])
    count = max(1, min(wanted, n // MIN_PIECE_ROWS))
    return [(0, n * i // count, n * (i + 1) // count) for i in range(count)]


def fill_on_ray(
    vectors_dir: Path,
    parts: Sequence[Part],
    index: Any,
    queries: np.ndarray,
    k: int,
    engine: EngineConfig,
    scratch: Path,
    reporter: Reporter,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[Piece]]:
    """Run fill_shard for each piece; their exact neighbours in piece order, and the pieces."""
    with connected(engine, reporter) as ray:
        pieces = pieces_of(parts, engine.shards or slots(ray, gpus=False))
        trained = ray.put(faiss.serialize_index(index))
        asked = ray.put(np.ascontiguousarray(queries, dtype=np.float32))
        task = ray.remote(fill_shard).options(**task_options(ray, gpus=False))
        fault = Fault.from_env()
        refs = [
            task.remote(
                trained, vectors_dir.resolve(), piece,
                np.asarray(parts[piece[0]][1][piece[1] : piece[2]], dtype=np.int64),
                asked, k + 1, scratch.resolve() / f"{i:05d}.faiss", (i, fault),
            )
            for i, piece in enumerate(pieces)
        ]  # fmt: skip
        names = [f"index shard {i}/{len(pieces)}" for i in range(len(pieces))]

        def done(i: int, result: Any) -> None:
            reporter.log(f"{names[i]} filled: {counted(result[2], 'vector')}")

        results = wait_all(ray, refs, names, reporter, done)
    return [(scores, ids) for scores, ids, _ in results], pieces


def fill_shard(
    trained: np.ndarray,
    vectors_dir: Path,
    piece: Piece,
    ids: np.ndarray,
    queries: np.ndarray,
    k: int,
    path: Path,
    fault: tuple[int, Fault | None],
) -> tuple[np.ndarray, np.ndarray, int]:
    """The task: the piece's rows of `vectors_dir` added to a copy of the trained index, written
    to `path` (whole, or not at all: a retry writes it again); returns the piece's top `k`
    (scores, ids) of each query by exact search, and the rows added."""
    from pactl.verbs.vector_sources import read_parts

    shard, injected = fault
    if injected is not None:
        injected.strike(shard)
    part, start, stop = piece
    parts, _ = read_parts(vectors_dir)
    vectors = parts[part][0][start:stop] if part < len(parts) else np.empty((0, 0), np.float32)
    if len(vectors) != len(ids):
        raise PactlError(f"{vectors_dir} changed while its index was built: build it again")
    index = faiss.deserialize_index(np.asarray(trained))
    add_vectors(index, vectors, ids, QUIET)
    partial = path.with_name(f".{path.name}.partial")
    faiss.write_index(index, str(partial))
    os.replace(partial, path)
    if not len(vectors):  # a shard whose every image was skipped
        return np.empty((len(queries), 0), np.float32), np.empty((len(queries), 0), np.int64), 0
    scores, found = part_neighbours((vectors, ids), np.array(queries), k)
    return scores, found, int(index.ntotal)


def merge_shards(index: Any, files: Sequence[Path], on_disk: bool, bundle_dir: Path) -> Any:
    """The index holding the shards' lists or codes in shard order (the order a build here adds
    them): the trained empty `index` given them in one file of on-disk lists, or in memory;
    a flat index is the shards' own joined (FAISS merges only kinds read back alike)."""
    if on_disk:
        # IO_FLAG_MMAP: the shards' lists are read from their files as the merge needs them
        shards = [faiss.read_index(str(f), faiss.IO_FLAG_MMAP) for f in files]
        merge_lists(index, shards, bundle_dir / PENDING_IVFDATA)
        return index
    ivf = faiss.try_extract_index_ivf(index)
    merged = index if ivf is not None else faiss.read_index(str(files[0]))
    for f in files if ivf is not None else files[1:]:
        shard = faiss.read_index(str(f))
        if ivf is not None:  # under a pre-transform too: the lists are the IVF's
            ivf.merge_from(faiss.extract_index_ivf(shard), 0)
            index.ntotal = ivf.ntotal
        else:
            merged.merge_from(shard, 0)
    return merged
