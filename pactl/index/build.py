"""Choosing a FAISS factory, building an index over vectors, and tuning its search setting
for a target Recall@10 against exact search."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

from pactl.config import IndexConfig
from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.index.mapped import blocks
from pactl.index.search import exclude_by_id

FLAT_MAX_ITEMS = 50_000  # below this exact search takes a few ms a query: nothing to approximate
TRAIN_POINTS_PER_LIST = 64  # k-means sample per list: FAISS asks for >= 39; more costs minutes
TRAIN_POINTS_OTHER = 65_536  # sample cap for trainable indexes without inverted lists
TUNING_QUERIES = 1_000  # data points used as held-out queries when tuning nprobe / efSearch
RECALL_K = 10  # the tuned figure is Recall@10 against exact search
PLATEAU = 0.002  # recall gained by doubling a search knob below which more effort is pointless
ADD_BATCH = 65_536  # vectors per add() call where a bundle is filled again (bundle.py)
NORM_TOLERANCE = 1e-2  # |norm - 1| allowed before vectors are taken as not L2-normalised

Part = tuple[np.ndarray, np.ndarray]  # one shard: (n_i, d) float32 vectors (memory-mapped), ids
FAISS_DEVICES = ("auto", "cpu", "gpu")  # auto: the GPUs when this FAISS has any, else the CPU
GPU_MAX_K = 2048  # the most hits a FAISS GPU search selects per query (GPU_MAX_SELECTION_K)
GPU_INSTALL = "pip install 'pactl[gpu]' (see docs/cli.md, pactl index --faiss-device)"


# ---------------------------------------------------------------------------- FAISS on GPUs


def faiss_gpus(device: str = "auto") -> int:
    """How many GPUs FAISS uses for `device` (0: the CPU path). faiss-cpu reports none; the
    `gpu` extra's faiss-gpu-cu12 reports the visible CUDA devices."""
    if device not in FAISS_DEVICES:
        raise PactlError(f"FAISS device {device!r}: choose one of {', '.join(FAISS_DEVICES)}")
    count = int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    if device == "gpu" and count < 1:
        raise PactlError(f"--faiss-device gpu: this FAISS sees no GPU; install {GPU_INSTALL}")
    return 0 if device == "cpu" else count


def to_gpus(index: Any) -> Any:
    """`index` copied onto every visible GPU (one replica on each)."""
    return faiss.index_cpu_to_all_gpus(index)


def gpu_searcher(index: Any, gpus: int) -> Any:
    """What to search `index` with: a GPU copy of a brute-force (Flat) index when there are
    GPUs, else the index itself. Other kinds search on the CPU, with their tuned parameters."""
    if not gpus or not _is_flat(index):
        return index
    try:
        return to_gpus(index)
    except RuntimeError:  # a wrapper the GPU cloner does not know: the same search on the CPU
        return index


def _is_flat(index: Any) -> bool:
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    return isinstance(faiss.downcast_index(inner), faiss.IndexFlat)


def _clustering_on_gpus(ivf: Any) -> Any:
    """A GPU brute-force index for the k-means of an IVF's training, in the metric the CPU
    training would use (the quantiser's own when it trains alone, else L2), so assignments,
    and hence the lists, match the CPU path's."""
    mode = ivf.quantizer_trains_alone  # a C char: SWIG hands it over as a one-letter str
    trains_alone = ord(mode) if isinstance(mode, str) else int(mode)
    metric = ivf.quantizer.metric_type if trains_alone == 0 else faiss.METRIC_L2
    return to_gpus(faiss.IndexFlat(ivf.d, metric))


def _gpu_quantizer(index: Any, gpus: int) -> tuple[Any, Any] | None:
    """(ivf, GPU copy of its brute-force quantiser) while adding on GPUs; None to add on the CPU
    (no GPUs, not IVF, or a graph quantiser, which assigns cheaply on the CPU)."""
    ivf = faiss.try_extract_index_ivf(index) if gpus else None
    if ivf is None or not isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexFlat):
        return None
    return ivf, to_gpus(faiss.downcast_index(ivf.quantizer))


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
        "codes: pass a FAISS factory string (--factory) that fits"
    )


def choose_binary_factory(n: int, bits: int) -> str:
    """The default FAISS binary factory for `n` codes of `bits` bits: exact Hamming search
    (BFlat) at every size. An IVF of binary k-means lists was the default above 2,000,000 codes
    until measured at 10,000,000 512-bit codes (docs/benchmarks.md, bench/binary_probe.py): a
    query's neighbours were spread over many of its lists, and rescored it reached Recall@10
    0.55 at its tuned nprobe and 0.86 at a quarter of its lists, where BFlat over the same codes
    reached 0.97. `--factory BIVF<n>[_HNSW<m>]` or `BHNSW<m>` still builds them."""
    if n < 1 or bits < 8:
        raise PactlError(f"cannot index {n} codes of {bits} bits")
    return "BFlat"


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
    x = as_matrix(vectors, "vectors")
    item_ids = np.arange(len(x), dtype=np.int64) if ids is None else np.asarray(ids, np.int64)
    return build_parts([(x, item_ids)], config, reporter, seed)


def build_parts(
    parts: Sequence[Part], config: IndexConfig, reporter: Reporter, seed: int = 0
) -> tuple[Any, dict[str, Any]]:
    """build_index over the (vectors, ids) of several parts in order (the shards of a set), as
    over the parts joined, without joining them: no copy of the whole set is made."""
    n, dim = check_parts(parts)
    factory = config.factory or choose_factory(n, dim, config.memory_budget_gb)
    gpus = faiss_gpus(config.faiss_device)
    started = time.perf_counter()
    index = new_index(factory, dim)
    rng = np.random.default_rng(seed)
    trained_on = _train(index, parts, rng, seed, reporter, factory, gpus)
    add_parts(index, parts, reporter, gpus)
    tuning = tune(index, parts, config.target_recall, rng, reporter, gpus)
    seconds = time.perf_counter() - started
    where = f" on {gpus} GPU(s)" if gpus else ""
    reporter.log(f"built {factory} over {counted(n, 'vector')} in {seconds:.1f} s{where}")
    record = {"factory": factory, **tuning, "ntotal": int(index.ntotal)}
    return index, {
        **record,
        "train_points": trained_on,
        "seed": seed,
        "build_seconds": round(seconds, 3),
        "faiss_gpus": gpus,
    }


def check_parts(parts: Sequence[Part]) -> tuple[int, int]:
    """(total rows, dimension) of the parts, which must hold float32 vectors of one dimension
    and distinct ids, one per vector."""
    dims = {as_matrix(vectors, "vectors").shape[1] for vectors, _ in parts}
    n = _count(parts)
    if n == 0:
        raise PactlError("there are no vectors to index")
    if len(dims) != 1:
        raise PactlError(f"the shards hold vectors of different dimensions: {sorted(dims)}")
    if any(np.shape(ids) != (len(vectors),) for vectors, ids in parts):
        raise PactlError(f"ids must be {n} distinct integers, one per vector")
    ids = np.concatenate([np.asarray(ids, dtype=np.int64) for _, ids in parts])
    if len(np.unique(ids)) != n:
        raise PactlError(f"ids must be {n} distinct integers, one per vector")
    return n, dims.pop()


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


def check_factory_parses(factory: str) -> None:
    """Refuse, before any work, a factory string FAISS cannot parse. The set's dimension is not
    known yet: a small one stands in, and only a parse failure counts (one the dimension
    causes is for build time to say)."""
    check_factory(factory)
    try:
        if factory.startswith("B"):  # a binary index's (pactl.index.binary)
            faiss.index_binary_factory(64, factory)
        else:
            faiss.index_factory(96, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        if factory.startswith("B"):
            raise PactlError(
                f"FAISS cannot parse the binary factory {factory!r} (e.g. BFlat, BIVF1024, BHNSW32)"
            ) from None
        if "parse" in str(e):
            raise PactlError(
                f"FAISS cannot parse the factory {factory!r} (e.g. Flat, IVF1024,Flat, HNSW32)"
            ) from None


def new_index(factory: str, dim: int) -> Any:
    """An empty inner-product index; kinds without their own id storage get an IndexIDMap2."""
    check_factory(factory)
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise PactlError(
            f"FAISS cannot make {factory!r} for dimension {dim}: {faiss_reason(e)}"
        ) from e
    has_ids = faiss.try_extract_index_ivf(index) is not None or isinstance(index, faiss.IndexIDMap)
    return index if has_ids else faiss.IndexIDMap2(index)


def _train(
    index: Any,
    parts: Sequence[Part],
    rng: np.random.Generator,
    seed: int,
    reporter: Reporter,
    name: str,
    gpus: int = 0,
) -> int:
    """Train on a seeded sample of the rows of all parts; returns its size (0 when nothing needs
    training). With `gpus`, an IVF's k-means assigns points on the GPUs."""
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
    on_gpus: Any = ivf if gpus else None  # (the stubs type clustering_index as never None)
    clustering = _clustering_on_gpus(on_gpus) if on_gpus is not None else None
    if on_gpus is not None:
        on_gpus.clustering_index = clustering  # `clustering` keeps it alive until training ends
    try:
        index.train(sample)
    except RuntimeError as e:
        raise PactlError(f"training {name} failed: {faiss_reason(e)}") from e
    finally:
        if on_gpus is not None:
            on_gpus.clustering_index = None  # not saved; the GPU copy goes with `clustering`
    return m


def _count(parts: Sequence[Part]) -> int:
    return sum(len(vectors) for vectors, _ in parts)


def _read_rows(parts: Sequence[Part], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vectors (float32, in memory) and ids at sorted `rows`, numbered across the parts in
    order. Each part gives its own rows, a block at a time (pactl.index.mapped.blocks), into
    one array made up front: the parts are never joined, a memory-mapped one is never resident
    as a whole, and the sample is held once (not once in pieces and again joined)."""
    dim = parts[0][0].shape[1] if parts else 0
    vectors = np.empty((len(rows), dim), dtype=np.float32)
    ids = np.empty(len(rows), dtype=np.int64)
    start = 0
    for part, part_ids in parts:
        low, high = np.searchsorted(rows, [start, start + len(part)])
        ids[low:high] = np.asarray(part_ids, dtype=np.int64)[rows[low:high] - start]
        for first, block in blocks(part):
            low, high = np.searchsorted(rows, [start + first, start + first + len(block)])
            vectors[low:high] = block[rows[low:high] - start - first]
        start += len(part)
    return vectors, ids


def add_vectors(
    index: Any, vectors: np.ndarray, ids: np.ndarray, reporter: Reporter, gpus: int = 0
) -> None:
    """add_parts with one part."""
    add_parts(index, [(vectors, ids)], reporter, gpus)


def add_parts(index: Any, parts: Sequence[Part], reporter: Reporter, gpus: int = 0) -> None:
    """Add the parts' rows in order, a block at a time (pactl.index.mapped.blocks: a memory-
    mapped part is read a block at a time, each block's pages dropped once used); an IVF of the
    kinds in PRESIZED gets its lists at their final size first (_add_presized). With `gpus`, an
    IVF with a brute-force quantiser assigns the rows to lists on the GPUs; the lists, and so
    the saved index, stay on the CPU."""
    swap = _gpu_quantizer(index, gpus)
    if swap is not None:
        ivf, on_gpus = swap
        cpu_quantizer = ivf.quantizer
        ivf.quantizer = on_gpus
    try:
        presizable = _presizable(index)
        if presizable is not None:
            _add_presized(presizable, parts, reporter)
            return
        with reporter.bar("adding vectors", total=_count(parts)) as advance:
            for _, batch, batch_ids in _unit_blocks(parts):
                index.add_with_ids(batch, batch_ids)
                advance(len(batch))
    finally:
        if swap is not None:
            ivf.quantizer = cpu_quantizer  # the one that is saved (and owned by the index)


# IVF kinds whose add is the quantiser's assignment followed by add_core, so that the two can be
# run apart (IndexIVF::add_with_ids); others (fast-scan, dedup, ...) add their own way.
PRESIZED = (faiss.IndexIVFFlat, faiss.IndexIVFPQ, faiss.IndexIVFScalarQuantizer)


def _presizable(index: Any) -> Any | None:
    """The IVF itself (not under a wrapper) when it is of a PRESIZED kind with its lists in
    memory (ArrayInvertedLists), else None."""
    inner = faiss.downcast_index(index)
    if not isinstance(inner, PRESIZED):
        return None
    lists = inner.invlists
    in_memory = lists is not None and isinstance(
        faiss.downcast_InvertedLists(lists), faiss.ArrayInvertedLists
    )
    return inner if in_memory else None


def _add_presized(ivf: Any, parts: Sequence[Part], reporter: Reporter) -> None:
    """Assign every row to its list (one pass), give each list room for its rows at once, then
    add the rows with those assignments (a second pass; FAISS assigns once, as its own add).
    Lists grown a block at a time hold up to twice their entries' memory (vector doubling):
    25% more than the codes, on 200,000 x 512 vectors into 2,048 lists. Same index either way."""
    n = _count(parts)
    lists = np.empty(n, dtype=np.int64)
    with reporter.bar("assigning vectors to lists", total=n) as advance:
        for row, batch, _ in _unit_blocks(parts):
            lists[row : row + len(batch)] = ivf.quantizer.assign(batch, 1).ravel()
            advance(len(batch))
    _reserve(ivf.invlists, np.bincount(lists, minlength=ivf.nlist))
    with reporter.bar("adding vectors", total=n) as advance:
        for row, batch, batch_ids in _unit_blocks(parts):
            where = lists[row : row + len(batch)]
            ivf.add_core(len(batch), *(faiss.swig_ptr(a) for a in (batch, batch_ids, where)))
            advance(len(batch))


def _reserve(invlists: Any, extra: np.ndarray) -> None:
    """Room for extra[l] more entries in each list l, allocated once: a list resized up and back
    down keeps its memory, so the adds that follow fill it without reallocating."""
    for number in np.flatnonzero(extra).tolist():
        size = invlists.list_size(number)
        invlists.resize(number, size + int(extra[number]))
        invlists.resize(number, size)


def _unit_blocks(parts: Sequence[Part]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first row, float32 block, its int64 ids) over the parts' blocks (mapped.blocks), rows
    numbered across the parts, each block checked by _check_unit_rows (float32 rows of a memory
    map are handed on without a copy)."""
    row = 0
    for vectors, ids in parts:
        for start, block in blocks(vectors):
            batch = np.ascontiguousarray(block, dtype=np.float32)
            first = row + start
            _check_unit_rows(batch, np.arange(first, first + len(batch)))
            yield first, batch, np.ascontiguousarray(ids[start : start + len(batch)], np.int64)
        row += len(vectors)


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
    gpus: int = 0,
) -> dict[str, Any]:
    """Find the cheapest search setting reaching Recall@10 >= target and leave it set. With
    `gpus`, exact search (the truth, and a Flat index's own search) runs on the GPUs.

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
    truth = exact_neighbours(parts, queries, own, k, gpus)
    space: Any = faiss.ParameterSpace()  # (its stub types the params string as int)
    searcher = gpu_searcher(index, gpus)

    def measure(params: str) -> float:
        if params:
            space.set_index_parameters(index, params)
        scores, found = searcher.search(queries, k + 1)
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
    parts: Sequence[Part], queries: np.ndarray, own: np.ndarray, k: int, gpus: int = 0
) -> np.ndarray:
    """Ids of the k largest inner products of each query over all parts, its own id `own[i]`
    excluded. Each block of each part (pactl.index.mapped.blocks) is searched on its own and the
    per-block top k+1 merged by score, so only one block is read at a time and the result equals
    a search of the parts joined."""
    scores, ids = [], []
    resources = faiss.StandardGpuResources() if gpus else None
    for vectors, part_ids in parts:
        for first, block in blocks(vectors):
            s, rows = _knn(queries, block, min(k + 1, len(block)), resources)
            scores.append(s)
            ids.append(np.asarray(part_ids, dtype=np.int64)[first + rows])
    all_scores, all_ids = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
    best = np.argsort(-all_scores, axis=1, kind="stable")[:, : k + 1]  # (nq, <= k+1)
    merged = np.take_along_axis(all_scores, best, axis=1), np.take_along_axis(all_ids, best, axis=1)
    return exclude_by_id(*merged, own, k)[1]


def _knn(queries: np.ndarray, vectors: np.ndarray, k: int, resources: Any) -> Any:
    """Brute-force inner-product top k: on the first GPU when `resources` is given."""
    if resources is None:
        return faiss.knn(queries, vectors, k, metric=faiss.METRIC_INNER_PRODUCT)
    base = np.ascontiguousarray(vectors, dtype=np.float32)  # a memory map is read into memory
    return faiss.knn_gpu(resources, queries, base, k, metric=faiss.METRIC_INNER_PRODUCT)


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Share of the true neighbour ids (rows of `truth`, -1 = none) present in the same row of
    `found`: Recall@k in the approximate-search sense, with k = truth.shape[1]."""
    valid = truth >= 0
    hit = (truth[:, :, None] == found[:, None, :]).any(axis=2) & valid
    return float(hit.sum() / max(int(valid.sum()), 1))


def as_matrix(values: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(values, np.ndarray) or values.ndim != 2:
        raise PactlError(f"{what} must be a 2-D float32 array (rows x dimension)")
    if values.dtype != np.float32:
        raise PactlError(f"{what} must be float32, not {values.dtype}")
    return values


def faiss_reason(error: Exception) -> str:
    """The useful tail of a FAISS C++ exception message."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = re.sub(r"^Error in .*? at \S+:\d+: ", "", text)  # the C++ function and source line
    return text.rsplit("Error: ", 1)[-1][:200]
