"""Choosing a FAISS factory and building an index over vectors: training, adding, and the
search setting tuned for a target Recall@10 (pactl.index.tune)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl.config import IndexConfig
from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.index.coarse import train_coarse
from pactl.index.gpus import clustering_on_gpus, faiss_gpus, gpu_quantizer
from pactl.index.mapped import Part, check_unit_rows, count_rows, read_rows, unit_blocks
from pactl.index.rescoring import RescoredIndex, lossy, place_floats
from pactl.index.tune import TUNING_FLOOR_S, TUNING_SHARE, tune_search

FLAT_MAX_ITEMS = 50_000  # below this exact search takes a few ms a query: nothing to approximate
# where a float bundle keeps its floats.npy, and item ids -> its rows (rescoring)
FloatsAt = tuple[Path, Callable[[np.ndarray], np.ndarray]]
TRAIN_POINTS_PER_LIST = 64  # k-means sample per list: FAISS asks for >= 39; more costs minutes
TRAIN_POINTS_OTHER = 65_536  # sample cap for trainable indexes without inverted lists
ADD_BATCH = 65_536  # vectors per add() call where a bundle is filled again (bundle.py)


# ---------------------------------------------------------------------------- FAISS on GPUs


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
    until measured at 10,000,000 512-bit codes (docs/benchmarks.md, tools/binary_probe.py): a
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
    parts: Sequence[Part],
    config: IndexConfig,
    reporter: Reporter,
    seed: int = 0,
    floats: FloatsAt | None = None,
) -> tuple[Any, dict[str, Any]]:
    """build_index over the (vectors, ids) of several parts in order (the shards of a set), as
    over the parts joined, without joining them: no copy of the whole set is made. With
    `floats` (where a bundle's floats.npy goes, and ids -> its rows), lossy codes (PQ, SQ) are
    searched rescored by exact cosine on that copy of the vectors (a RescoredIndex) unless
    config.rescore is 0; the depth is tuned unless the config gives it."""
    n, dim = check_parts(parts)
    factory = config.factory or choose_factory(n, dim, config.memory_budget_gb)
    gpus = faiss_gpus(config.faiss_device)
    started = time.perf_counter()
    index = new_index(factory, dim)
    rng = np.random.default_rng(seed)
    trained_on = train_index(index, parts, rng, seed, reporter, factory, gpus)
    trained = time.perf_counter()
    add_parts(index, parts, reporter, gpus)
    added = time.perf_counter()
    if floats is not None and config.rescore != 0 and lossy(index):
        copy = place_floats(parts, floats[0], reporter)
        index = RescoredIndex(index, copy, floats[1], config.rescore or 1)
    phases = {"train_seconds": trained - started, "add_seconds": added - trained}
    phases["floats_seconds"] = time.perf_counter() - added
    budget, depth = config.query_budget_ms, config.rescore
    share = max(TUNING_FLOOR_S, TUNING_SHARE * (time.perf_counter() - started))
    tuning = tune_search(
        index, parts, config.target_recall, rng, reporter, gpus, budget, depth,
        tuning_seconds=share,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    where = f" on {gpus} GPU(s)" if gpus else ""
    reporter.log(f"built {factory} over {counted(n, 'vector')} in {seconds:.1f} s{where}")
    record = {"factory": factory, **tuning, "ntotal": int(index.ntotal)}
    return index, {
        **record,
        "train_points": trained_on,
        "seed": seed,
        "build_seconds": round(seconds, 3),
        **{name: round(value, 3) for name, value in phases.items()},
        "faiss_gpus": gpus,
    }


def check_parts(parts: Sequence[Part]) -> tuple[int, int]:
    """(total rows, dimension) of the parts, which must hold float32 vectors of one dimension
    and distinct ids, one per vector."""
    dims = {as_matrix(vectors, "vectors").shape[1] for vectors, _ in parts}
    n = count_rows(parts)
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
        least, most = FACTORY_RANGES.get(name.upper(), (1, 2**31 - 1))
        if not least <= number <= most:
            raise PactlError(
                f"factory {factory!r}: {name}{number} is out of range "
                f"({name or 'the number'} must be from {least} to {most:,})"
            )


# Numbers FAISS takes but then crashes on (SIGSEGV, SIGFPE or abort: no message, no cleanup)
# or cannot allocate: a graph of degree 1 (HNSW1, BHNSW1, IVF16_HNSW1), bits per code 0 or
# past 16 (PQ4x0, RQ4x30: 2**30 centroids), a list count of billions (IVF2147483647).
FACTORY_RANGES = {
    "HNSW": (2, 2**16),
    "BHNSW": (2, 2**16),
    "NSG": (3, 2**16),
    "X": (1, 16),  # bits per sub-code: PQ<m>x<nbits>, RQ, LSQ, IMI<k>x<nbits>
    "IVF": (1, 2**26),
    "BIVF": (1, 2**26),
}


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
    except MemoryError:
        raise PactlError(
            f"FAISS cannot allocate the index {factory!r}: give smaller numbers"
        ) from None
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
    except (RuntimeError, MemoryError) as e:
        raise PactlError(
            f"FAISS cannot make {factory!r} for dimension {dim}: {faiss_reason(e)}"
        ) from e
    has_ids = faiss.try_extract_index_ivf(index) is not None or isinstance(index, faiss.IndexIDMap)
    return index if has_ids else faiss.IndexIDMap2(index)


def train_index(
    index: Any,
    parts: Sequence[Part],
    rng: np.random.Generator,
    seed: int,
    reporter: Reporter,
    name: str,
    gpus: int = 0,
) -> int:
    """Train on a seeded sample of the rows of all parts; returns its size (0 when nothing needs
    training). With `gpus`, an IVF's k-means assigns points on the GPUs; without, an IVF of
    TWO_LEVEL_FROM lists or more gets its lists by two-level k-means (pactl.index.coarse)."""
    if index.is_trained:
        return 0
    ivf = faiss.try_extract_index_ivf(index)
    cap = TRAIN_POINTS_PER_LIST * ivf.nlist if ivf is not None else TRAIN_POINTS_OTHER
    n = count_rows(parts)
    m = min(n, cap)
    # Sorted rows read each memory-mapped part front to back.
    rows = np.sort(rng.choice(n, size=m, replace=False))
    sample, _ = read_rows(parts, rows)
    check_unit_rows(sample, rows)
    if ivf is not None:
        ivf.cp.seed = seed
        inner = faiss.downcast_index(ivf)
        if hasattr(inner, "pq"):
            inner.pq.cp.seed = seed
        if hasattr(inner, "do_polysemous_training"):
            # Codes ordered for Hamming filtering, which pactl never searches by: 80 of the 83 s
            # of an IVF8192,PQ16's training on 524,288 x 64 went to it.
            inner.do_polysemous_training = False
    reporter.log(f"training {name} on {m:,} of {n:,} vectors")
    on_gpus: Any = ivf if gpus else None  # (the stubs type clustering_index as never None)
    clustering = clustering_on_gpus(on_gpus) if on_gpus is not None else None
    if on_gpus is not None:
        on_gpus.clustering_index = clustering  # `clustering` keeps it alive until training ends
    try:
        if on_gpus is None:
            train_coarse(index, sample, seed, reporter)  # large IVFs: two-level k-means
        index.train(sample)
    except RuntimeError as e:
        raise PactlError(f"training {name} failed: {faiss_reason(e)}") from e
    finally:
        if on_gpus is not None:
            on_gpus.clustering_index = None  # not saved; the GPU copy goes with `clustering`
    return m


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
    swap = gpu_quantizer(index, gpus)
    if swap is not None:
        ivf, on_gpus = swap
        cpu_quantizer = ivf.quantizer
        ivf.quantizer = on_gpus
    try:
        presizable = _presizable(index)
        if presizable is not None:
            _add_presized(presizable, parts, reporter)
            return
        with reporter.bar("adding vectors", total=count_rows(parts)) as advance:
            for _, batch, batch_ids in unit_blocks(parts):
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
    n = count_rows(parts)
    lists = np.empty(n, dtype=np.int64)
    with reporter.bar("assigning vectors to lists", total=n) as advance:
        for row, batch, _ in unit_blocks(parts):
            lists[row : row + len(batch)] = ivf.quantizer.assign(batch, 1).ravel()
            advance(len(batch))
    _reserve(ivf.invlists, np.bincount(lists, minlength=ivf.nlist))
    with reporter.bar("adding vectors", total=n) as advance:
        for row, batch, batch_ids in unit_blocks(parts):
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
