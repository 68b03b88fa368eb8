"""FAISS indexes over L2-normalised vectors: factory choice, build, tuning, bundles on disk.

A bundle is a folder of three files: `index.faiss` (FAISS ids are the item ids), `items.csv`
(`id,path,label`) and `meta.json` (format, version, model fingerprint, factory string, the tuned
search parameters and the Recall@10 they reached). Cosine similarity is the inner product of
L2-normalised vectors, so every index here uses METRIC_INNER_PRODUCT.

An IVF index over more vectors than memory holds is built shard by shard (build_ondisk_index):
its inverted lists go to a fourth file, `index.ivfdata`, which searches read through the page
cache.

A bundle's files change together: each save writes a new generation of the folder and switches
to it in one rename (pactl.fsutil.new_generation), so a reader, or a kill, sees the old bundle
or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl import __version__, records
from pactl.config import IndexConfig
from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.fsutil import (
    check_files,
    new_generation,
    read_current,
    record_files,
    writer_lock,
)
from pactl.search import exclude_by_id

BUNDLE_FORMAT = "pactl.bundle"
BUNDLE_VERSION = 1
VECTORS_FORMAT = "pactl.vectors"
INDEX_FILE, ITEMS_FILE, META_FILE = "index.faiss", "items.csv", "meta.json"
IVFDATA_FILE = "index.ivfdata"  # the inverted lists of an on-disk bundle
BUNDLE_FILES = (INDEX_FILE, ITEMS_FILE, META_FILE, IVFDATA_FILE)
PENDING_IVFDATA = ".index.ivfdata.pending"  # merged lists not yet moved in by write_bundle
MERGE_DIR = ".merge"  # per-shard indexes while build_ondisk_index runs
MAX_SEARCH_SETTING = 10_000_000  # nprobe / efSearch beyond this is a typo or a tampered file
ITEMS_HEADER = ("id", "path", "label")
ON_DISK_CHOICES = ("auto", "yes", "no")

FLAT_MAX_ITEMS = 50_000  # below this exact search takes a few ms a query: nothing to approximate
TRAIN_POINTS_PER_LIST = 64  # k-means sample per list: FAISS asks for >= 39; more costs minutes
TRAIN_POINTS_OTHER = 65_536  # sample cap for trainable indexes without inverted lists
TUNING_QUERIES = 1_000  # data points used as held-out queries when tuning nprobe / efSearch
RECALL_K = 10  # the tuned figure is Recall@10 against exact search
PLATEAU = 0.002  # recall gained by doubling a search knob below which more effort is pointless
ADD_BATCH = 65_536  # vectors per add() call: bounded memory when `vectors` is memory-mapped
NORM_TOLERANCE = 1e-2  # |norm - 1| allowed before vectors are taken as not L2-normalised

Part = tuple[np.ndarray, np.ndarray]  # one shard: (n_i, d) float32 vectors (memory-mapped), ids


class ItemTable:
    """The (id, path, label) rows of a bundle as three arrays indexed by position.

    Ids map to positions through a sorted copy (or directly when ids are 0..n-1), so looking up
    the hits of many queries is one vectorised search, not a dict of millions of entries. Equal
    labels share one string object, so a label costs a pointer per row.
    """

    def __init__(self, ids: np.ndarray, paths: np.ndarray, labels: np.ndarray) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)  # (n,)
        self.paths = paths  # (n,) object array of str
        self.labels = labels  # (n,) object array of str; "" when unlabelled
        if not (len(self.ids) == len(paths) == len(labels)):
            raise ValueError("ids, paths and labels differ in length")
        n = len(self.ids)
        self._identity = bool(np.array_equal(self.ids, np.arange(n, dtype=np.int64)))
        self._order = np.empty(0, dtype=np.int64)
        self._sorted = np.empty(0, dtype=np.int64)
        if not self._identity:
            self._order = np.argsort(self.ids, kind="stable")
            self._sorted = self.ids[self._order]
            repeated = np.flatnonzero(self._sorted[1:] == self._sorted[:-1])
            if len(repeated):
                raise PactlError(f"item id {int(self._sorted[repeated[0]])} appears twice")

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[int, str, str]]) -> ItemTable:
        ids = np.fromiter((int(r[0]) for r in rows), dtype=np.int64, count=len(rows))
        labels = _strings([r[2] or "" for r in rows], share=True)
        return cls(ids, _strings([r[1] for r in rows]), labels)

    @classmethod
    def read(cls, path: Path) -> ItemTable:
        """Parse an `id,path,label` CSV (as `pactl embed` writes it)."""
        ids: list[str] = []
        paths: list[str] = []
        labels: list[str] = []
        # -sig: a spreadsheet's BOM; surrogateescape: file names that are not UTF-8
        with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None or tuple(h.strip() for h in header[:3]) != ITEMS_HEADER:
                raise PactlError(f"{path} does not start with the header id,path,label")
            for row in reader:
                if len(row) < 2:
                    if row:
                        raise PactlError(f"{path} line {reader.line_num}: expected id,path,label")
                    continue
                ids.append(row[0])
                paths.append(row[1])
                labels.append(row[2] if len(row) > 2 else "")
        return cls(_parse_ids(ids, path), _strings(paths), _strings(labels, share=True))

    def write(self, path: Path) -> None:
        from pactl.embed import ITEMS_ENCODING, csv_writer

        with open(path, "w", newline="", **ITEMS_ENCODING) as f:  # type: ignore[call-overload]
            writer = csv_writer(f)
            writer.writerow(ITEMS_HEADER)
            rows = zip(self.ids.tolist(), self.paths.tolist(), self.labels.tolist(), strict=True)
            writer.writerows(rows)

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Row position of each id (any shape), -1 where the table has no such id."""
        wanted = np.asarray(ids, dtype=np.int64)
        n = len(self.ids)
        if self._identity:
            return np.where((wanted >= 0) & (wanted < n), wanted, -1)
        if n == 0:
            return np.full(wanted.shape, -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._sorted, wanted), n - 1)
        return np.where(self._sorted[at] == wanted, self._order[at], -1)

    def max_id(self) -> int:
        return int(self.ids.max()) if len(self.ids) else -1

    def concat(self, other: ItemTable) -> ItemTable:
        return ItemTable.join([self, other])

    @classmethod
    def join(cls, tables: Sequence[ItemTable]) -> ItemTable:
        """The rows of `tables` in order, copied once (not once per table, as chained concat)."""
        return cls(
            np.concatenate([t.ids for t in tables]),
            np.concatenate([t.paths for t in tables]),
            np.concatenate([t.labels for t in tables]),
        )


def _strings(values: list[str], share: bool = False) -> np.ndarray:
    """An object array of `values`; with `share`, equal strings become one object (labels repeat
    a lot, paths do not)."""
    out = np.empty(len(values), dtype=object)
    if share:
        shared: dict[str, str] = {}
        values = [shared.setdefault(v, v) for v in values]
    out[:] = values
    return out


def _parse_ids(ids: list[str], path: Path) -> np.ndarray:
    if not ids:
        return np.empty(0, dtype=np.int64)
    try:
        return np.asarray(ids, dtype=str).astype(np.int64)
    except ValueError:
        for value in ids:
            try:
                int(value)
            except ValueError:
                raise PactlError(f"{path}: id {value!r} is not an integer") from None
        raise


@dataclass
class Bundle:
    path: Path  # the bundle folder
    index: Any  # faiss.Index, search parameters already set from meta.json
    items: ItemTable
    meta: dict[str, Any]
    mmapped: bool = False  # the index reads its codes from index.faiss (or .ivfdata) in place


# ---------------------------------------------------------------------------- factory choice


def choose_factory(n: int, dim: int, memory_budget_gb: float = 8.0) -> str:
    """The default FAISS factory string for `n` vectors of `dim` floats.

    Exact search below FLAT_MAX_ITEMS; above, an IVF index with ~4 sqrt(n) lists (a power of two)
    whose coarse quantiser is an HNSW graph, so assigning vectors and queries to lists stays cheap
    as nlist grows. Flat codes when they fit the budget, else the finest product quantiser (up to
    one byte per 4 dimensions) that does.
    """
    if n < 1 or dim < 1:
        raise PactlError(f"cannot index {n} vectors of dimension {dim}")
    if n < FLAT_MAX_ITEMS:
        return "Flat"
    nlist = 2 ** round(math.log2(4 * math.sqrt(n)))
    budget = memory_budget_gb * 2**30
    if _ivf_bytes(n, dim, nlist, 4 * dim) <= budget:
        return f"IVF{nlist}_HNSW32,Flat"
    # At most 4 dimensions per sub-quantiser: finer codes cost more to train than they return.
    for m in (m for m in range(max(dim // 4, 1), 0, -1) if dim % m == 0):
        if _ivf_bytes(n, dim, nlist, m) <= budget:
            return f"IVF{nlist}_HNSW32,PQ{m}"
    raise PactlError(
        f"{n:,} vectors of dimension {dim} do not fit in {memory_budget_gb} GB even as 1-byte "
        "codes; raise the memory budget or pass a FAISS factory string"
    )


def _ivf_bytes(n: int, dim: int, nlist: int, code_bytes: int) -> int:
    """Resident size of an IVF index: codes and an 8-byte id per vector, plus the HNSW quantiser
    (float32 centroids and 2 x 32 four-byte links each on the graph's base level)."""
    return n * (code_bytes + 8) + nlist * (4 * dim + 64 * 4)


# ---------------------------------------------------------------------------- build and tune


def build_index(
    vectors: np.ndarray,
    config: IndexConfig,
    reporter: Reporter,
    seed: int = 0,
    ids: np.ndarray | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Train, fill and tune an index over `vectors` (row i gets id i unless `ids` is given).

    Returns the index, search parameters set, and the tuning record that goes into meta.json:
    factory, search_params, recall_at_10 (measured against exact search), ntotal, and more.
    """
    x = _as_matrix(vectors, "vectors")
    n, dim = x.shape
    if n == 0:
        raise PactlError("there are no vectors to index")
    item_ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    if item_ids.shape != (n,) or len(np.unique(item_ids)) != n:
        raise PactlError(f"ids must be {n} distinct integers, one per vector")
    factory = config.factory or choose_factory(n, dim, config.memory_budget_gb)
    started = time.perf_counter()
    index = new_index(factory, dim)
    rng = np.random.default_rng(seed)
    trained_on = _train(index, [(x, item_ids)], rng, seed, reporter, factory)
    add_vectors(index, x, item_ids, reporter)
    tuning = tune(index, [(x, item_ids)], config.target_recall, rng, reporter)
    seconds = time.perf_counter() - started
    reporter.log(f"built {factory} over {n:,} vectors in {seconds:.1f} s")
    record = {"factory": factory, **tuning, "ntotal": int(index.ntotal)}
    return index, {
        **record,
        "train_points": trained_on,
        "seed": seed,
        "build_seconds": round(seconds, 3),
    }


def check_factory(factory: str) -> None:
    """Refuse factory strings that FAISS accepts but then aborts the process on (a zero list
    count, code size or graph degree: `HNSW0`, `IVF0,Flat`, `PQ4x0`, `NSG2` ...) or fails to
    parse with a C++ exception (numbers beyond 32 bits)."""
    if not factory or len(factory) > 200 or not re.fullmatch(r"[A-Za-z0-9_,()x.+-]+", factory):
        raise PactlError(f"{factory!r} is not a FAISS factory string (e.g. Flat, IVF1024,PQ32)")
    for match in re.finditer(r"([A-Za-z]*)(\d+)", factory):
        name, number = match.group(1), int(match.group(2))
        least = {"HNSW": 2, "NSG": 3}.get(name.upper(), 1)
        if not least <= number < 2**31:
            raise PactlError(
                f"factory {factory!r}: {name}{number} is out of range "
                f"({name or 'the number'} must be from {least} to {2**31 - 1:,})"
            )


def new_index(factory: str, dim: int) -> Any:
    """An empty inner-product index; kinds without their own id storage get an IndexIDMap2."""
    check_factory(factory)
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise PactlError(f"FAISS cannot make {factory!r} for dimension {dim}: {_why(e)}") from e
    has_ids = faiss.try_extract_index_ivf(index) is not None or isinstance(index, faiss.IndexIDMap)
    return index if has_ids else faiss.IndexIDMap2(index)


def _train(
    index: Any,
    parts: Sequence[Part],
    rng: np.random.Generator,
    seed: int,
    reporter: Reporter,
    name: str,
) -> int:
    """Train on a seeded sample of the rows of all parts; returns its size (0 when nothing needs
    training)."""
    if index.is_trained:
        return 0
    ivf = faiss.try_extract_index_ivf(index)
    cap = TRAIN_POINTS_PER_LIST * ivf.nlist if ivf is not None else TRAIN_POINTS_OTHER
    n = _count(parts)
    m = min(n, cap)
    # Sorted rows read each memory-mapped part front to back.
    rows = np.sort(rng.choice(n, size=m, replace=False))
    sample, _ = _read_rows(parts, rows)
    _check_unit_rows(sample, rows)
    if ivf is not None:
        ivf.cp.seed = seed
        inner = faiss.downcast_index(ivf)
        if hasattr(inner, "pq"):
            inner.pq.cp.seed = seed
    reporter.log(f"training {name} on {m:,} of {n:,} vectors")
    try:
        index.train(sample)
    except RuntimeError as e:
        raise PactlError(f"training {name} failed: {_why(e)}") from e
    return m


def _count(parts: Sequence[Part]) -> int:
    return sum(len(vectors) for vectors, _ in parts)


def _read_rows(parts: Sequence[Part], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vectors (float32, in memory) and ids at sorted `rows`, numbered across the parts in
    order. Each part gives its own rows, so the parts themselves are never joined."""
    vectors, ids, start = [], [], 0
    for part, part_ids in parts:
        low, high = np.searchsorted(rows, [start, start + len(part)])
        local = rows[low:high] - start
        vectors.append(np.ascontiguousarray(part[local], dtype=np.float32))
        ids.append(np.asarray(part_ids, dtype=np.int64)[local])
        start += len(part)
    return np.concatenate(vectors), np.concatenate(ids)


def add_vectors(index: Any, vectors: np.ndarray, ids: np.ndarray, reporter: Reporter) -> None:
    """Add rows in batches (a memory-mapped array is read once, a slice at a time)."""
    n = len(vectors)
    with reporter.bar("adding vectors", total=n) as advance:
        for start in range(0, n, ADD_BATCH):
            stop = min(start + ADD_BATCH, n)
            batch = np.ascontiguousarray(vectors[start:stop], dtype=np.float32)
            _check_unit_rows(batch, np.arange(start, stop))
            index.add_with_ids(batch, np.ascontiguousarray(ids[start:stop], dtype=np.int64))
            advance(stop - start)


def _check_unit_rows(batch: np.ndarray, rows: np.ndarray) -> None:
    """Refuse NaN/inf and vectors far from unit length: inner product is cosine only on those."""
    norms = np.sqrt(np.einsum("ij,ij->i", batch, batch, dtype=np.float64))
    bad = np.flatnonzero(~(np.abs(norms - 1.0) <= NORM_TOLERANCE))
    if len(bad):
        i = bad[0]
        raise PactlError(
            f"vector {int(rows[i])} has norm {norms[i]:.4g}; pactl indexes L2-normalised vectors "
            "(cosine similarity as inner product): normalise them first"
        )


@dataclass(frozen=True)
class _Knob:
    name: str  # what the log calls it
    low: int  # the cheapest setting worth trying
    high: int  # the most expensive (exhaustive for IVF)
    params: Callable[[int], str]  # setting -> ParameterSpace string


def _knob(index: Any, k: int) -> _Knob | None:
    """The search-time setting that trades speed for recall, or None for exact/fixed kinds."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        graph = hasattr(faiss.downcast_index(ivf.quantizer), "hnsw")

        def ivf_params(p: int) -> str:
            # The HNSW quantiser must look at least as wide as the lists it returns.
            return f"nprobe={p},quantizer_efSearch={max(64, 2 * p)}" if graph else f"nprobe={p}"

        return _Knob("nprobe", 1, int(ivf.nlist), ivf_params)
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if hasattr(inner, "hnsw"):
        return _Knob("efSearch", max(16, k + 1), max(4096, k + 1), lambda e: f"efSearch={e}")
    return None


def tune(
    index: Any,
    parts: Sequence[Part],
    target: float,
    rng: np.random.Generator,
    reporter: Reporter,
) -> dict[str, Any]:
    """Find the cheapest search setting reaching Recall@10 >= target and leave it set.

    `parts` are the indexed (vectors, ids), one part or one per shard. Queries are a seeded
    sample of the indexed vectors; each query's own id is removed from both the exact and the
    approximate neighbours (as `pactl query` does), so the figure is the recall of the other
    items, the ones a query actually wants.
    """
    n = _count(parts)
    k = min(RECALL_K, n - 1)
    record: dict[str, Any] = {"search_params": "", "recall_at_10": None, "target_recall": target}
    if k < 1:
        return {**record, "target_reached": False, "tuning_queries": 0}
    rows = np.sort(rng.choice(n, size=min(TUNING_QUERIES, n), replace=False))
    queries, own = _read_rows(parts, rows)
    truth = exact_neighbours(parts, queries, own, k)
    space: Any = faiss.ParameterSpace()  # (its stub types the params string as int)

    def measure(params: str) -> float:
        if params:
            space.set_index_parameters(index, params)
        scores, found = index.search(queries, k + 1)
        return recall_at_k(exclude_by_id(scores, found, own, k)[1], truth)

    knob = _knob(index, k)
    if knob is None:
        params, recall = "", measure("")
        reached = recall >= target
    else:
        setting, recall, reached = _smallest_setting(knob, measure, target, reporter)
        params = knob.params(setting)
        space.set_index_parameters(index, params)
    if not reached:
        reporter.log(f"recall@10 {recall:.4f} is below the target {target}: best this index gives")
    record.update(search_params=params, recall_at_10=recall, target_reached=reached)
    return {**record, "tuning_queries": len(rows)}


def _smallest_setting(
    knob: _Knob, measure: Callable[[str], float], target: float, reporter: Reporter
) -> tuple[int, float, bool]:
    """Double the knob until recall reaches `target`, then bisect down to the smallest setting.

    If recall stops growing first (product-quantised codes cap it), take the cheapest setting
    within PLATEAU of the best seen. Returns (setting, recall, target reached).
    """
    seen: dict[int, float] = {}

    def at(setting: int) -> float:
        if setting not in seen:
            seen[setting] = measure(knob.params(setting))
            reporter.log(f"  {knob.name}={setting}: recall@10 {seen[setting]:.4f}")
        return seen[setting]

    failed, setting = 0, knob.low
    while at(setting) < target:
        grew = failed == 0 or seen[setting] - seen[failed] >= PLATEAU
        if setting >= knob.high or not grew:
            best = max(seen.values())
            cheapest = min(s for s, r in seen.items() if r >= best - PLATEAU)
            return cheapest, seen[cheapest], False
        failed, setting = setting, min(2 * setting, knob.high)
    while failed and setting - failed > 1:
        middle = (failed + setting) // 2
        failed, setting = (failed, middle) if at(middle) >= target else (middle, setting)
    return setting, seen[setting], True


def exact_neighbours(
    parts: Sequence[Part], queries: np.ndarray, own: np.ndarray, k: int
) -> np.ndarray:
    """Ids of the k largest inner products of each query over all parts, its own id `own[i]`
    excluded. Each part is searched on its own and the per-part top k+1 merged by score, so only
    one part is read at a time and the result equals a search of the parts joined."""
    scores, ids = [], []
    for vectors, part_ids in parts:
        if len(vectors):
            fetch = min(k + 1, len(vectors))
            s, rows = faiss.knn(queries, vectors, fetch, metric=faiss.METRIC_INNER_PRODUCT)
            scores.append(s)
            ids.append(np.asarray(part_ids, dtype=np.int64)[rows])
    all_scores, all_ids = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
    best = np.argsort(-all_scores, axis=1, kind="stable")[:, : k + 1]  # (nq, <= k+1)
    merged = np.take_along_axis(all_scores, best, axis=1), np.take_along_axis(all_ids, best, axis=1)
    return exclude_by_id(*merged, own, k)[1]


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Share of the true neighbour ids (rows of `truth`, -1 = none) present in the same row of
    `found`: Recall@k in the approximate-search sense, with k = truth.shape[1]."""
    valid = truth >= 0
    hit = (truth[:, :, None] == found[:, None, :]).any(axis=2) & valid
    return float(hit.sum() / max(int(valid.sum()), 1))


def _as_matrix(values: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(values, np.ndarray) or values.ndim != 2:
        raise PactlError(f"{what} must be a 2-D float32 array (rows x dimension)")
    if values.dtype != np.float32:
        raise PactlError(f"{what} must be float32, not {values.dtype}")
    return values


def _why(error: Exception) -> str:
    """The useful tail of a FAISS C++ exception message."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text.rsplit("Error: ", 1)[-1][:200]


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
    n, dim = _check_parts(parts)
    factory = config.factory or choose_factory(n, dim, config.memory_budget_gb)
    started = time.perf_counter()
    index = new_index(factory, dim)
    if not _mergeable(index):
        raise PactlError(
            f"on-disk merging needs an IVF factory (e.g. IVF4096,Flat or IVF4096_HNSW32,PQ64), "
            f"not {factory!r}: pick one, or build in memory (--on-disk no)"
        )
    rng = np.random.default_rng(seed)
    trained_on = _train(index, parts, rng, seed, reporter, factory)
    scratch = bundle_dir / MERGE_DIR
    if scratch.exists():  # left by an interrupted build
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    try:
        files = [
            _fill_shard(index, p, scratch / f"{i:05d}.faiss", reporter) for i, p in enumerate(parts)
        ]
        reporter.log(f"merging the inverted lists of {len(files)} shards into {IVFDATA_FILE}")
        # IO_FLAG_MMAP: the shards' lists are read from their files as the merge needs them
        shards = [faiss.read_index(str(f), faiss.IO_FLAG_MMAP) for f in files]
        _merge_lists(index, shards, bundle_dir / PENDING_IVFDATA)
        del shards
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tuning = tune(index, parts, config.target_recall, rng, reporter)
    seconds = time.perf_counter() - started
    reporter.log(f"built {factory} over {n:,} vectors of {len(parts)} shards in {seconds:.1f} s")
    record = {"factory": factory, **tuning, "ntotal": int(index.ntotal), "on_disk": True}
    return index, {
        **record,
        "shards": len(parts),
        "train_points": trained_on,
        "seed": seed,
        "build_seconds": round(seconds, 3),
    }


def _check_parts(parts: Sequence[Part]) -> tuple[int, int]:
    """(total rows, dimension) of the parts, which must hold distinct ids, one per vector."""
    dims = {_as_matrix(vectors, "vectors").shape[1] for vectors, _ in parts}
    n = _count(parts)
    if n == 0:
        raise PactlError("there are no vectors to index")
    if len(dims) != 1:
        raise PactlError(f"the shards hold vectors of different dimensions: {sorted(dims)}")
    if any(np.shape(ids) != (len(vectors),) for vectors, ids in parts):
        raise PactlError("each shard needs one id per vector")
    ids = np.concatenate([np.asarray(ids, dtype=np.int64) for _, ids in parts])
    if len(np.unique(ids)) != n:
        raise PactlError(f"ids must be {n} distinct integers, one per vector")
    return n, dims.pop()


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


def _merge_lists(target: Any, sources: Sequence[Any], path: Path) -> None:
    """Give the empty `target` the inverted lists of all `sources` (same quantiser and codec),
    concatenated list by list into one file of on-disk lists at `path`."""
    ivf = faiss.extract_index_ivf(target)
    lists = faiss.InvertedListsPtrVector()  # type: ignore[attr-defined]  # not in the stub
    for source in sources:
        lists.push_back(faiss.extract_index_ivf(source).invlists)
    path.unlink(missing_ok=True)
    merged: Any = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(path))
    with _quiet_c_stdout():
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


def _add_on_disk(
    index: Any, vectors: np.ndarray, ids: np.ndarray, bundle_dir: Path, reporter: Reporter
) -> Any:
    """A new index holding the lists of the on-disk `index` and `vectors`, coded with the same
    trained quantiser, merged into a fresh lists file for save_bundle to swap in: the bundle's
    own index.ivfdata is only read, so a failed add leaves the bundle as it was."""
    fresh = empty_like(index)
    add_vectors(fresh, vectors, ids, reporter)
    merged = empty_like(index)
    _merge_lists(merged, [index, fresh], bundle_dir / PENDING_IVFDATA)
    return merged


@contextlib.contextmanager
def _quiet_c_stdout() -> Iterator[None]:
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


# ---------------------------------------------------------------------------- bundles on disk


def save_bundle(
    out: Path,
    index: Any,
    items_csv_source: Path | list[tuple[int, str, str]] | ItemTable,
    meta: dict[str, Any],
) -> None:
    """Write index.faiss, items.csv and meta.json (and index.ivfdata) as a new generation of
    the bundle folder `out`, which becomes current in one step once all are on disk."""
    with new_generation(out, BUNDLE_FILES) as gen:
        write_bundle(gen, index, items_csv_source, meta)


def write_bundle(
    gen: Path,
    index: Any,
    items_csv_source: Path | list[tuple[int, str, str]] | ItemTable,
    meta: dict[str, Any],
) -> None:
    """Write a bundle's files into the fresh generation folder `gen`.

    `meta` should carry the vectors' checkpoint, fingerprint and model_config and the tuning
    record of build_index; format, version, dimension, count, the generation and the size of
    each file are set here from the index itself, so a loader can tell that the files belong
    together. An index with on-disk lists (build_ondisk_index) also gets index.ivfdata.
    """
    lists = _ondisk_lists(index)
    items = (
        items_csv_source
        if isinstance(items_csv_source, ItemTable)
        else ItemTable.read(items_csv_source)
        if isinstance(items_csv_source, Path)
        else ItemTable.from_rows(items_csv_source)
    )
    if len(items) != index.ntotal:
        raise PactlError(f"{len(items)} items for an index of {index.ntotal} vectors")
    if lists is not None:
        _place_lists(gen, lists)
    faiss.write_index(index, str(gen / INDEX_FILE))
    if isinstance(items_csv_source, Path):
        shutil.copyfile(items_csv_source, gen / ITEMS_FILE)
    else:
        items.write(gen / ITEMS_FILE)
    derived = {
        "dimension": int(index.d),
        "count": int(index.ntotal),
        "metric": "ip" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2",
        "on_disk": lists is not None,
        "index_bytes": (gen / INDEX_FILE).stat().st_size,
        **({"ivfdata_bytes": (gen / IVFDATA_FILE).stat().st_size} if lists is not None else {}),
    }
    header = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "pactl_version": __version__}
    mine = {*header, *derived, "index_bytes", "ivfdata_bytes", "generation", "files"}
    rest = {k: v for k, v in meta.items() if k not in mine}
    full = record_files(gen, {**header, **rest, **derived})
    (gen / META_FILE).write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")


def _ondisk_lists(index: Any) -> Any | None:
    """The index's OnDiskInvertedLists when they have a file of their own, else None.

    Lists mapped from index.faiss (load_bundle with mmap) have no file of their own, and
    write_index cannot serialise them in place: refused.
    """
    ivf: Any = faiss.try_extract_index_ivf(index)
    lists = faiss.downcast_InvertedLists(ivf.invlists) if ivf is not None else None
    if not isinstance(lists, faiss.OnDiskInvertedLists):
        return None
    if not lists.filename:
        raise PactlError("a memory-mapped index cannot be saved: load it with mmap=False first")
    return lists


def _place_lists(gen: Path, lists: Any) -> None:
    """Put the lists file into `gen` as index.ivfdata and point the index at that name.

    index.faiss records the lists' file name; readers open it with IO_FLAG_ONDISK_SAME_DIR,
    which keeps that name's last component and looks for it beside index.faiss, so the folder
    can move. Lists merged into `gen` (build_ondisk_index, an --add) are renamed; any other
    lists file (another bundle's) is copied, never taken from it.
    """
    final = gen / IVFDATA_FILE
    source = Path(lists.filename)
    if source.parent.resolve() == gen.resolve():
        with open(source, "rb") as f:  # the merge wrote through a shared mapping
            os.fsync(f.fileno())
        if source.resolve() != final.resolve():
            os.replace(source, final)
    else:
        shutil.copyfile(source, final)
    lists.filename = str(final)


def add_to_bundle(
    bundle_dir: Path,
    vectors: np.ndarray,
    items: list[tuple[int, str, str]],
    meta_check: dict[str, Any],
    reporter: Reporter | None = None,
) -> None:
    """Append vectors (with their items) to a bundle; they must come from the bundle's model.

    `meta_check` is the new vectors' meta.json: its dimension and model fingerprint must match
    the bundle's. New ids must not be in the bundle yet. The tuned search setting is kept. The
    result is a new generation of the bundle (the old one is only read); an on-disk bundle gets
    a new index.ivfdata, its lists and the new ones merged into a fresh file.
    """
    with writer_lock(bundle_dir):
        bundle = load_bundle(bundle_dir, mmap=False)
        x = _as_matrix(vectors, "vectors")
        dim = int(bundle.index.d)
        for given in (x.shape[1], meta_check.get("dimension", x.shape[1])):
            if given != dim:
                raise PactlError(
                    f"new vectors have dimension {given}; bundle {bundle_dir} has {dim}"
                )
        mine, theirs = bundle.meta.get("fingerprint"), meta_check.get("fingerprint")
        if mine != theirs:
            raise PactlError(
                f"new vectors come from another model (fingerprint {str(theirs)[:12]}, bundle "
                f"{bundle_dir} has {str(mine)[:12]}): embed them with the bundle's checkpoint"
            )
        if len(items) != len(x):
            raise PactlError(f"{len(items)} items for {len(x)} new vectors")
        new = ItemTable.from_rows(items)
        clash = new.ids[bundle.items.positions(new.ids) >= 0]
        if len(clash):
            raise PactlError(
                f"id {int(clash[0])} is already in {bundle_dir} ({len(clash)} clashing ids); "
                f"number new items from {bundle.items.max_id() + 1}"
            )
        with new_generation(bundle_dir, BUNDLE_FILES) as gen:
            index = bundle.index
            if _ondisk_lists(index) is not None:
                index = _add_on_disk(index, x, new.ids, gen, reporter or QUIET)
            else:
                add_vectors(index, x, new.ids, reporter or QUIET)
            write_bundle(gen, index, bundle.items.concat(new), bundle.meta)


def load_bundle(path: Path, mmap: bool = True) -> Bundle:
    """Open a bundle's current generation, checking it is whole and consistent; sets the tuned
    search parameters.

    With `mmap`, index kinds that FAISS can map (IVF lists, flat codes) read their vectors from
    the file through the page cache instead of copying them into memory. An on-disk bundle
    (index.ivfdata) is always read that way, whatever `mmap` says.
    """
    check_folder(path)
    return read_current(path, lambda gen: _load_generation(path, gen, mmap))


def _load_generation(path: Path, gen: Path, mmap: bool) -> Bundle:
    for name in (META_FILE, ITEMS_FILE, INDEX_FILE):
        if not (gen / name).is_file():
            raise PactlError(f"bundle {path} lacks {name}: rebuild it with `pactl index`")
    meta = _read_meta(path, gen)
    check_files(gen, meta, path, "rebuild the bundle with `pactl index`")
    index, flag = _read_index(gen, meta, mmap)
    items = ItemTable.read(gen / ITEMS_FILE)
    if len(items) != index.ntotal:
        raise PactlError(
            f"bundle {path} is inconsistent: {ITEMS_FILE} has {len(items):,} rows but "
            f"{INDEX_FILE} holds {index.ntotal:,} vectors; rebuild it with `pactl index`"
        )
    if meta["dimension"] != index.d:
        raise PactlError(
            f"bundle {path}: meta.json says dimension {meta['dimension']}, "
            f"{INDEX_FILE} has {index.d}"
        )
    params = str(meta.get("search_params") or "")
    if params:
        try:
            space: Any = faiss.ParameterSpace()
            space.set_index_parameters(index, params)
        except RuntimeError as e:
            raise PactlError(f"bundle {path}: search_params {params!r}: {_why(e)}") from e
    return Bundle(path, index, items, meta, mmapped=flag != 0)


def bundle_count(path: Path) -> int:
    """The number of items in the bundle's current generation (read from its meta.json)."""
    return int(read_current(path, lambda gen: _read_meta(path, gen))["count"])


def _read_index(gen: Path, meta: dict[str, Any], mmap: bool) -> tuple[Any, int]:
    """index.faiss (and index.ivfdata), sizes checked against meta.json; returns the index and
    the FAISS read flag used."""
    index_file, ivfdata = gen / INDEX_FILE, gen / IVFDATA_FILE
    _check_size(index_file, meta.get("index_bytes"))
    recorded = meta.get("on_disk")
    on_disk = bool(recorded) or (recorded is None and ivfdata.exists())
    if on_disk:
        if not ivfdata.is_file():
            raise PactlError(
                f"bundle {gen} lacks {IVFDATA_FILE} (its inverted lists): "
                "rebuild it with `pactl index`"
            )
        _check_size(ivfdata, meta.get("ivfdata_bytes"))
        # SAME_DIR: the lists file is looked for beside index.faiss, wherever the folder is now
        flag = int(faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY)
    else:
        flag = _mmap_flag(index_file) if mmap else 0
    try:
        with _quiet_c_stdout() if on_disk else contextlib.nullcontext():
            index = faiss.read_index(str(index_file), flag)
    except RuntimeError as e:
        raise PactlError(
            f"{index_file} is truncated or corrupt ({_why(e)}): rebuild it with `pactl index`"
        ) from e
    if on_disk:
        _check_lists_fit(index, ivfdata)
    return index, flag


def _check_lists_fit(index: Any, ivfdata: Path) -> None:
    """The lists index.faiss describes must lie inside index.ivfdata: past its end they would
    fault (SIGBUS) at search time instead of failing here."""
    lists = _ondisk_lists(index)
    size = ivfdata.stat().st_size
    if lists is None:
        raise PactlError(
            f"{ivfdata.parent / INDEX_FILE} has no on-disk lists although {IVFDATA_FILE} is "
            "there: rebuild the bundle with `pactl index`"
        )
    if lists.totsize > size:
        raise PactlError(
            f"{ivfdata} is truncated or corrupt ({size:,} bytes, {INDEX_FILE} expects "
            f"{lists.totsize:,}): rebuild the bundle with `pactl index`"
        )


def _check_size(file: Path, recorded: Any) -> None:
    actual = file.stat().st_size
    if isinstance(recorded, int) and recorded != actual:
        raise PactlError(
            f"{file} is truncated or corrupt ({actual:,} bytes, meta.json records "
            f"{recorded:,}): rebuild the bundle with `pactl index`"
        )


def check_folder(path: Path) -> None:
    """One line when `path` is not a folder that could be a bundle."""
    if not path.exists():
        raise PactlError(f"bundle {path} does not exist: build one with `pactl index`")
    if not path.is_dir():
        raise PactlError(f"bundle {path} is not a folder")


def _read_meta(path: Path, gen: Path) -> dict[str, Any]:
    """meta.json of a bundle generation, every field pactl uses checked (one line naming it)."""
    where = path / META_FILE
    meta = records.read_json_object(gen / META_FILE, where, "a pactl bundle's meta.json")
    found = meta.get("format")
    if found != BUNDLE_FORMAT:
        vectors = found == VECTORS_FORMAT
        hint = "; it holds vectors: index them with `pactl index`" if vectors else ""
        raise PactlError(f"{path} is not a pactl bundle (meta.json format {found!r}){hint}")
    if meta.get("version") != BUNDLE_VERSION:
        raise PactlError(
            f"bundle {path} has version {meta.get('version')!r}; pactl {__version__} reads "
            f"version {BUNDLE_VERSION}: rebuild it with `pactl index`"
        )
    records.field(meta, "dimension", int, where, 1, 65_536)
    records.field(meta, "count", int, where, 0, 2**40)
    records.field(meta, "fingerprint", str, where, optional=True)
    records.field(meta, "checkpoint", str, where, optional=True)
    records.field(meta, "model_config", dict, where, optional=True)
    records.field(meta, "factory", str, where, optional=True)
    records.field(meta, "on_disk", bool, where, optional=True)
    for key in ("index_bytes", "ivfdata_bytes"):
        records.field(meta, key, int, where, 0, 2**62, optional=True)
    params = records.field(meta, "search_params", str, where, optional=True)
    if params:
        _check_search_params(params, where)
    return meta


def _check_search_params(params: str, where: Path) -> None:
    """`name=value` pairs with positive integer values: FAISS aborts on some zero settings."""
    for pair in params.split(","):
        name, _, value = pair.partition("=")
        if not re.fullmatch(r"[A-Za-z_]+", name.strip()) or not value.strip().isdigit():
            raise PactlError(f"{where}: search_params {params!r} is not name=number,...")
        if not 1 <= int(value) <= MAX_SEARCH_SETTING:
            raise PactlError(f"{where}: search_params {params!r}: {name} is out of range")


def _mmap_flag(index_file: Path) -> int:
    """The FAISS read flag that maps this index kind's codes, keyed on the file's first fourcc.

    IVF files ("Iw..") map their inverted lists; flat codes, bare ("IxF.") or under an id map
    ("IxM2", "IxMp") or an HNSW graph ("IHN."), map through IO_FLAG_MMAP_IFC. Anything else
    (pre-transforms, refinement, ...) is read into memory.
    """
    with open(index_file, "rb") as f:
        fourcc = f.read(4)
    if fourcc[:2] == b"Iw":
        return int(faiss.IO_FLAG_MMAP)
    if fourcc[:3] in (b"IxF", b"IHN") or fourcc in (b"IxM2", b"IxMp"):
        return int(faiss.IO_FLAG_MMAP_IFC)
    return 0
