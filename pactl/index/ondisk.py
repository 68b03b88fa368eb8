"""IVF indexes over more vectors than memory holds: built shard by shard, their inverted lists
merged into one file (index.ivfdata) that searches read through the page cache."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl.config import IndexConfig
from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.index.build import add_vectors, check_parts, choose_factory, new_index, train_index
from pactl.index.mapped import Part
from pactl.index.tune import tune_search

IVFDATA_FILE = "index.ivfdata"  # the inverted lists of an on-disk bundle
PENDING_IVFDATA = ".index.ivfdata.pending"  # merged lists not yet moved in by write_bundle
MERGE_DIR = ".merge"  # per-shard indexes while build_ondisk_index runs
ON_DISK_CHOICES = ("auto", "yes", "no")


# ---------------------------------------------------------------------------- on-disk merging


def wants_on_disk(config: IndexConfig, n: int, dim: int, sharded: bool) -> bool:
    """Whether to build with build_ondisk_index: asked for (on_disk "yes"), or ("auto") a sharded
    set whose float32 vectors exceed the memory budget, indexed by an IVF factory."""
    if config.on_disk not in ON_DISK_CHOICES:
        raise PactlError(f"on_disk is one of {', '.join(ON_DISK_CHOICES)}, not {config.on_disk!r}")
    if config.on_disk != "auto":
        return config.on_disk == "yes"
    if not sharded or n * dim * 4 <= config.memory_budget_gb * 2**30:
        return False
    factory = config.factory or choose_factory(n, dim, config.memory_budget_gb)
    return _mergeable(new_index(factory, dim))


def build_ondisk_index(
    parts: Sequence[Part],
    config: IndexConfig,
    reporter: Reporter,
    bundle_dir: Path,
    seed: int = 0,
) -> tuple[Any, dict[str, Any]]:
    """Train, fill and tune an IVF index over shards without holding all their vectors at once.

    `parts` are (vectors, ids) per shard in shard order, the vectors typically memory-mapped.
    Training takes a sample across the shards; each shard then fills a copy of the trained empty
    index, which is written to `bundle_dir/.merge/` and freed, so memory holds one shard's lists
    at a time; the lists of all shards are merged into one file of on-disk inverted lists (in
    `bundle_dir`, moved to index.ivfdata by save_bundle). Tuning finds the exact neighbours shard
    by shard too. Returns the index and build_index's record, with on_disk and shards added.
    Disk: the shards' indexes and the merged file side by side, about twice the lists' size.
    """
    n, dim = check_parts(parts)
    factory = config.factory or choose_factory(n, dim, config.memory_budget_gb)
    started = time.perf_counter()
    index = new_index(factory, dim)
    if not _mergeable(index):
        raise PactlError(
            f"on-disk merging needs an IVF factory (e.g. IVF4096,Flat or IVF4096_HNSW32,PQ64), "
            f"not {factory!r}: pick one, or build in memory (--on-disk no)"
        )
    rng = np.random.default_rng(seed)
    trained_on = train_index(index, parts, rng, seed, reporter, factory)
    scratch = bundle_dir / MERGE_DIR
    if scratch.exists():  # left by an interrupted build
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    try:
        files = [
            _fill_shard(index, p, scratch / f"{i:05d}.faiss", reporter) for i, p in enumerate(parts)
        ]
        reporter.log(
            f"merging the inverted lists of {counted(len(files), 'shard')} into {IVFDATA_FILE}"
        )
        # IO_FLAG_MMAP: the shards' lists are read from their files as the merge needs them
        shards = [faiss.read_index(str(f), faiss.IO_FLAG_MMAP) for f in files]
        merge_lists(index, shards, bundle_dir / PENDING_IVFDATA)
        del shards
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tuning = tune_search(
        index, parts, config.target_recall, rng, reporter, query_budget_ms=config.query_budget_ms
    )
    seconds = time.perf_counter() - started
    reporter.log(
        f"built {factory} over {counted(n, 'vector')} of {counted(len(parts), 'shard')} in "
        f"{seconds:.1f} s"
    )
    record = {"factory": factory, **tuning, "ntotal": int(index.ntotal), "on_disk": True}
    return index, {
        **record,
        "shards": len(parts),
        "train_points": trained_on,
        "seed": seed,
        "build_seconds": round(seconds, 3),
    }


def _mergeable(index: Any) -> bool:
    """Whether all of the index's data sits in plain inverted lists that merging can move: an
    IVF (under pre-transforms or not), but not IVFPQR or refinement (data beside the lists) nor
    fast-scan kinds (lists packed in blocks)."""
    inner = faiss.downcast_index(index)
    while isinstance(inner, faiss.IndexPreTransform):
        inner = faiss.downcast_index(inner.index)
    plain = not isinstance(inner, faiss.IndexIVFPQR | faiss.IndexIVFFastScan)
    return isinstance(inner, faiss.IndexIVF) and plain


def _fill_shard(trained: Any, part: Part, path: Path, reporter: Reporter) -> Path:
    """One shard's vectors in a copy of the trained empty index, written to `path`; the copy is
    freed on return, so one shard's lists at a time are in memory."""
    shard = faiss.clone_index(trained)
    add_vectors(shard, part[0], part[1], reporter)
    faiss.write_index(shard, str(path))
    return path


def merge_lists(target: Any, sources: Sequence[Any], path: Path) -> None:
    """Give the empty `target` the inverted lists of all `sources` (same quantiser and codec),
    concatenated list by list into one file of on-disk lists at `path`."""
    ivf = faiss.extract_index_ivf(target)
    lists = faiss.InvertedListsPtrVector()  # type: ignore[attr-defined]  # not in the stub
    for source in sources:
        lists.push_back(faiss.extract_index_ivf(source).invlists)
    path.unlink(missing_ok=True)
    merged: Any = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(path))
    with quiet_c_stdout():
        ntotal = merged.merge_from_multiple(lists.data(), lists.size(), False, False)
    ivf.replace_invlists(merged, True)
    merged.this.disown()  # the index frees the lists now
    target.ntotal = ivf.ntotal = ntotal


def empty_like(index: Any) -> Any:
    """A trained, empty copy of an IVF index (quantiser, codec, search setting), its lists in
    memory. Serialising on-disk lists writes their header only, so their data is never read."""
    source: Any = faiss.extract_index_ivf(index)
    if not isinstance(faiss.downcast_InvertedLists(source.invlists), faiss.OnDiskInvertedLists):
        copy = faiss.clone_index(index)
        copy.reset()
        return copy
    reader = faiss.VectorIOReader()
    faiss.copy_array_to_vector(faiss.serialize_index(index), reader.data)
    copy = faiss.read_index(reader, faiss.IO_FLAG_SKIP_IVF_DATA)
    ivf = faiss.extract_index_ivf(copy)
    lists: Any = faiss.ArrayInvertedLists(ivf.nlist, ivf.code_size)
    ivf.replace_invlists(lists, True)
    lists.this.disown()
    copy.ntotal = ivf.ntotal = 0
    return copy


def add_on_disk(
    index: Any, vectors: np.ndarray, ids: np.ndarray, bundle_dir: Path, reporter: Reporter
) -> Any:
    """A new index holding the lists of the on-disk `index` and `vectors`, coded with the same
    trained quantiser, merged into a fresh lists file for save_bundle to swap in: the bundle's
    own index.ivfdata is only read, so a failed add leaves the bundle as it was."""
    fresh = empty_like(index)
    add_vectors(fresh, vectors, ids, reporter)
    merged = empty_like(index)
    merge_lists(merged, [index, fresh], bundle_dir / PENDING_IVFDATA)
    return merged


@contextlib.contextmanager
def quiet_c_stdout() -> Iterator[None]:
    """Discard what FAISS printf()s while it sizes or re-points on-disk lists ("resizing ...",
    "IO_FLAG_ONDISK_SAME_DIR: updating ..."): on C stdout those lines would land among the
    results of `pactl query ... > hits.csv`. Errors still arrive as exceptions."""
    if sys.stdout is not None:
        sys.stdout.flush()
    libc = ctypes.CDLL(None)
    libc.fflush(None)
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
