"""A binary bundle's index built: the float vectors placed beside it, the rotation learned and
chosen on a seeded sample, every vector coded a block at a time, the FAISS binary index trained
and filled, and the rescoring depth (then nprobe / efSearch) tuned for Recall@10 against exact
float search. Appending and compacting keep the same parts in step."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl.codes.rotation import Rotation, check_bits, learn_rotation
from pactl.config import IndexConfig
from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.index.binary.search import BinaryIndex, hnsw_of
from pactl.index.build import (
    ADD_BATCH,
    TRAIN_POINTS_PER_LIST,
    check_factory,
    check_parts,
    choose_binary_factory,
    faiss_reason,
)
from pactl.index.exact import exact_neighbours
from pactl.index.mapped import (
    Part,
    blocks,
    check_unit_rows,
    count_rows,
    read_rows,
    unit_blocks,
)
from pactl.index.rescoring import FLOATS_FILE, place_floats, rescore, rows_of, write_floats
from pactl.index.search import exclude_by_id
from pactl.index.tune import (
    MAX_TUNED_RESCORE,
    RECALL_K,
    TUNING_QUERIES,
    Climb,
    Knob,
    ann_recall,
    shortfall_words,
)

ROTATION_FILE = "rotation.npy"  # the map before the signs (pactl.codes.rotation.Rotation)
BINARY_FILES = (ROTATION_FILE, FLOATS_FILE)  # what a binary bundle holds beside a float one's
ROTATION_SAMPLE = 65_536  # vectors a rotation is learned and chosen on
CHOICE_QUERIES = 1_000  # of them, the queries that measure each rotation
RESCORE_MARGIN = 0.01  # an approximate code index gets this much recall to spend
# recall tuned for above the target: the smallest setting that reaches it on 1,000 tuning items
# sits at the target, and fresh queries of bench_binary's 1M set landed up to 1.5 points below
TUNING_MARGIN = 0.01


def build_binary(
    parts: Sequence[Part],
    config: IndexConfig,
    reporter: Reporter,
    gen: Path,
    positions: Callable[[np.ndarray], np.ndarray],
    seed: int = 0,
) -> tuple[BinaryIndex, dict[str, Any]]:
    """A BinaryIndex over the parts' vectors with their float copy in gen/floats.npy (a clone
    of the vectors file where the file system can make one), and the record meta.json keeps
    (build_codes)."""
    n, dim = check_parts(parts)
    check_bits(config.bits or dim, dim, config.rotation)  # before the copy
    started = time.perf_counter()
    floats = place_floats(parts, gen / FLOATS_FILE, reporter)
    binary, record = build_codes(parts, config, reporter, floats, positions, seed)
    record["build_seconds"] = round(time.perf_counter() - started, 3)
    return binary, record


def build_codes(
    parts: Sequence[Part],
    config: IndexConfig,
    reporter: Reporter,
    floats: np.ndarray,
    positions: Callable[[np.ndarray], np.ndarray],
    seed: int = 0,
    rotation: Rotation | None = None,
) -> tuple[BinaryIndex, dict[str, Any]]:
    """A BinaryIndex over the parts' vectors (`floats`: the same rows, read when rescoring,
    `positions`: ids -> rows): the rotation learned and chosen on a seeded sample unless given,
    every vector coded, the code index trained and filled, the rescoring depth and search
    setting tuned. Returns it and the record meta.json keeps: factory, the tuned setting and
    depth, and the binary record (bits, rotation, rescore, what each rotation tried reached)."""
    n, dim = check_parts(parts)
    bits = rotation.bits if rotation is not None else config.bits or dim
    factory = config.factory or choose_binary_factory(n, bits)
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    trials: dict[str, Any] = {}
    if rotation is None:
        rows = np.sort(rng.choice(n, min(n, ROTATION_SAMPLE), replace=False))
        sample, _ = read_rows(parts, rows)
        check_unit_rows(sample, rows)
        rotation, trials = choose_rotation(sample, bits, config.rotation, seed, reporter)
        del sample
    codes, ids = code_parts(parts, rotation, reporter)
    index = new_code_index(factory, bits)
    trained_on = _train_codes(index, codes, rng, seed, reporter, factory)
    for start in range(0, n, ADD_BATCH):
        index.add_with_ids(codes[start : start + ADD_BATCH], ids[start : start + ADD_BATCH])
    del codes, ids
    binary = BinaryIndex(index, rotation, floats, positions, config.rescore or 1)
    binary, tuning = tune_binary(binary, parts, config, rng, reporter)
    seconds = time.perf_counter() - started
    reporter.log(
        f"built {factory} over {counted(n, 'code')} of {bits} bits ({rotation.kind}) in "
        f"{seconds:.1f} s, rescoring {binary.rescore} candidates a hit"
    )
    record = {"bits": bits, "rotation": rotation.kind, "rescore": binary.rescore, **trials}
    tuning["binary"] = {**record, **tuning.pop("binary")}
    return binary, {
        "factory": factory,
        **tuning,
        "ntotal": n,
        "train_points": trained_on,
        "seed": seed,
        "build_seconds": round(seconds, 3),
    }


# ---------------------------------------------------------------------------- the float copy


# ---------------------------------------------------------------------------- rotation, codes


def choose_rotation(
    sample: np.ndarray, bits: int, kind: str, seed: int, reporter: Reporter
) -> tuple[Rotation, dict[str, Any]]:
    """The rotation `kind` learned on `sample`; for "auto", each that applies (none and itq at
    as many bits as dimensions, itq and lsh at fewer) learned and measured: Recall@10 of the
    codes' Hamming top 10 against exact cosine, CHOICE_QUERIES sample rows querying the
    sample. The best is kept; its figure and the others' go to meta.json."""
    dim = sample.shape[1]
    check_bits(bits, dim, kind)
    kinds = [kind] if kind != "auto" else ["none", "itq"] if bits == dim else ["itq", "lsh"]
    if len(kinds) == 1 or len(sample) < 2:
        return learn_rotation(sample, bits, kinds[0], seed), {}
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(sample), min(CHOICE_QUERIES, len(sample)), replace=False))
    k = min(RECALL_K, len(sample) - 1)
    _, truth = faiss.knn(sample[rows], sample, k + 1, metric=faiss.METRIC_INNER_PRODUCT)
    truth = exclude_by_id(np.zeros(truth.shape, np.float32), truth, rows, k)[1]
    reached: dict[str, float] = {}
    learned: dict[str, Rotation] = {}
    for name in kinds:
        learned[name] = learn_rotation(sample, bits, name, seed)
        codes = learned[name].codes(sample)
        flat = faiss.IndexBinaryFlat(bits)
        flat.add(codes)
        distances, found = flat.search(codes[rows], k + 1)
        found = exclude_by_id(distances.astype(np.float32), found, rows, k)[1]
        reached[name] = round(ann_recall(found, truth), 4)
        reporter.log(f"  rotation {name}: codes' recall@10 {reached[name]:.4f} on the sample")
    best = max(kinds, key=lambda name: reached[name])  # the first of equals
    return learned[best], {"rotation_recall_at_10": reached, "rotation_sample": len(sample)}


def code_parts(
    parts: Sequence[Part], rotation: Rotation, reporter: Reporter
) -> tuple[np.ndarray, np.ndarray]:
    """(codes (n, bits / 8) uint8, ids (n,) int64) of every row of the parts, in order, a
    block at a time (each block checked to be unit vectors, pactl.index.build)."""
    n = count_rows(parts)
    codes = np.empty((n, rotation.bits // 8), dtype=np.uint8)
    ids = np.empty(n, dtype=np.int64)
    with reporter.bar("coding vectors", total=n) as advance:
        for row, batch, batch_ids in unit_blocks(parts):
            codes[row : row + len(batch)] = rotation.codes(batch)
            ids[row : row + len(batch)] = batch_ids
            advance(len(batch))
    return codes, ids


def new_code_index(factory: str, bits: int) -> Any:
    """An empty FAISS binary index of `factory` (BFlat, BIVF<nlist>[_HNSW<m>], BHNSW<m>) whose
    ids are the items' ids (an id map around the kinds without ids of their own)."""
    if not factory.startswith("B"):
        raise PactlError(
            f"--factory {factory!r}: a binary index takes BFlat, BIVF4096, BHNSW32 ..."
        )
    check_factory(factory)  # numbers FAISS would crash on, before it sees them
    try:
        index = faiss.index_binary_factory(bits, factory)
    except (RuntimeError, MemoryError) as e:
        raise PactlError(f"FAISS cannot make {factory!r} for {bits} bits: {faiss_reason(e)}") from e
    if isinstance(faiss.downcast_IndexBinary(index), faiss.IndexBinaryIVF):
        return index
    return faiss.IndexBinaryIDMap2(index)


def _train_codes(
    index: Any,
    codes: np.ndarray,
    rng: np.random.Generator,
    seed: int,
    reporter: Reporter,
    name: str,
) -> int:
    """Train an IVF's lists on a seeded sample of the codes; returns its size (0: none)."""
    if index.is_trained:
        return 0
    ivf: Any = faiss.downcast_IndexBinary(index)
    m = min(len(codes), TRAIN_POINTS_PER_LIST * int(ivf.nlist))
    sample = codes[np.sort(rng.choice(len(codes), size=m, replace=False))]
    ivf.cp.seed = seed
    reporter.log(f"training {name} on {m:,} of {len(codes):,} codes")
    try:
        index.train(sample)
    except RuntimeError as e:
        raise PactlError(f"training {name} failed: {faiss_reason(e)}") from e
    return m


# ---------------------------------------------------------------------------- tuning


def tune_binary(
    binary: BinaryIndex,
    parts: Sequence[Part],
    config: IndexConfig,
    rng: np.random.Generator,
    reporter: Reporter,
) -> tuple[BinaryIndex, dict[str, Any]]:
    """The rescoring depth, then the code index's search setting, reaching Recall@10 >=
    target + TUNING_MARGIN against exact float search (each query's own id left out, as
    pactl.index.build's tune does). The depth is tuned with the codes searched exhaustively
    (for an approximate index to RESCORE_MARGIN more, which its setting then spends), unless
    the config gives it; the record goes to meta.json ("target_reached": the target itself)."""
    n, target = count_rows(parts), config.target_recall
    aim = min(1.0, target + TUNING_MARGIN)  # what the last setting tuned is tuned for
    k = min(RECALL_K, n - 1)
    record: dict[str, Any] = {"search_params": "", "recall_at_10": None, "target_recall": target}
    if k < 1:
        return binary, {**record, "target_reached": False, "tuning_queries": 0, "binary": {}}
    rows = np.sort(rng.choice(n, size=min(TUNING_QUERIES, n), replace=False))
    queries, own = read_rows(parts, rows)
    truth = exact_neighbours(parts, queries, own, k)

    def measure(candidates: int, params: str) -> float:
        apply_search_params(binary.codes, params)
        return _recall(binary, (queries, own, truth), k, candidates)

    knob = code_knob(binary.codes, k)
    depth = config.rescore
    if depth is None:
        widest = knob.params(knob.high) if knob is not None else ""
        more = RESCORE_MARGIN if knob is not None else 0.0
        tried = (queries, own, truth)
        depth = _tuned_depth(binary, tried, k, widest, min(1.0, aim + more), reporter)

    def timed(params: str) -> tuple[float, float]:
        start = time.perf_counter()
        recall = measure(depth, params)
        return recall, 1000 * (time.perf_counter() - start) / len(queries)

    climb = Climb(knob, timed, aim, config.query_budget_ms, reporter, None)
    choice = climb.run()
    params, recall = choice.params, choice.recall
    reached = recall >= target
    hamming = measure(0, params)
    apply_search_params(binary.codes, params)
    if not reached:
        reporter.warn(shortfall_words(choice, target, config.query_budget_ms))
    record.update(
        search_params=params,
        recall_at_10=recall,
        target_reached=reached,
        limited_by=None if reached else (choice.limited_by or "codes"),
        query_budget_ms=config.query_budget_ms,
        operating_points=[point.record() for point in climb.points],
    )
    facts = {"hamming_recall_at_10": round(hamming, 4)}
    return binary.with_rescore(depth), {**record, "tuning_queries": len(rows), "binary": facts}


def _tuned_depth(
    binary: BinaryIndex,
    tried: tuple[np.ndarray, np.ndarray, np.ndarray],
    k: int,
    params: str,
    aim: float,
    reporter: Reporter,
) -> int:
    """The fewest candidates per hit whose rescoring reaches Recall@k `aim` for the `tried`
    (queries, their own ids, their true neighbours). The codes are searched once (with
    `params`), as deep as the deepest rescoring tried: a shallower one's candidates are the
    first of those, ordered by (distance, id) as every search orders them."""
    apply_search_params(binary.codes, params)
    depth = min(binary.ntotal, k * MAX_TUNED_RESCORE + 1)
    _, pool = binary.candidates(binary.rotation.codes(tried[0]), depth)

    def measure(setting: str) -> float:
        return _recall(binary, tried, k, int(setting.partition("=")[2]), pool)

    knob = Knob("rescore", 1, MAX_TUNED_RESCORE, lambda f: f"rescore={f}")
    choice = Climb(knob, lambda s: (measure(s), 0.0), aim, math.inf, reporter, None).run()
    return choice.point.setting if choice.point is not None else MAX_TUNED_RESCORE


def _recall(
    binary: BinaryIndex,
    tried: tuple[np.ndarray, np.ndarray, np.ndarray],
    k: int,
    depth: int,
    pool: np.ndarray | None = None,
) -> float:
    """Recall@k of the `tried` (queries, own ids, true neighbours) as a query that is not an
    item sees it: its k x depth nearest codes but its own (depth 0: its k nearest, in Hamming
    order), rescored by cosine. `pool`: the queries' candidates found already, deep enough."""
    queries, own, truth = tried
    wanted = min(binary.ntotal, k * max(depth, 1) + 1)
    if pool is None:
        _, pool = binary.candidates(binary.rotation.codes(queries), wanted)
    mine = pool[:, :wanted]
    found = exclude_by_id(np.zeros(mine.shape, np.float32), mine, own, wanted - 1)[1]
    if depth:
        found = rescore(binary.floats, binary.positions, queries, found, k)[1]
    return ann_recall(found[:, :k], truth)


def code_knob(codes: Any, k: int) -> Knob | None:
    """The code index's search setting that trades speed for recall (nprobe of an IVF,
    efSearch of a graph), or None for exact search."""
    inner = faiss.downcast_IndexBinary(codes)
    if isinstance(inner, faiss.IndexBinaryIVF):
        return Knob("nprobe", 1, int(inner.nlist), lambda p: f"nprobe={p}")
    if hnsw_of(codes) is not None:
        return Knob("efSearch", max(16, k + 1), max(4096, k + 1), lambda e: f"efSearch={e}")
    return None


def apply_search_params(codes: Any, params: str) -> None:
    """Set `name=value,...` (nprobe, efSearch) on the code index; "" sets nothing. An IVF's
    graph quantiser looks at least twice as wide as the lists it returns."""
    for pair in filter(None, params.split(",")):
        name, _, value = pair.partition("=")
        setting = int(value)
        inner = faiss.downcast_IndexBinary(codes)
        if name == "nprobe" and isinstance(inner, faiss.IndexBinaryIVF):
            inner.nprobe = setting
            graph = hnsw_of(inner.quantizer)
            if graph is not None:
                graph.hnsw.efSearch = max(64, 2 * setting)
        elif name == "efSearch" and (graph := hnsw_of(codes)) is not None:
            graph.hnsw.efSearch = setting
        else:
            raise PactlError(f"search_params {params!r}: {name} is not a setting of this index")


# ---------------------------------------------------------------------------- upkeep


def add_codes(
    binary: BinaryIndex,
    vectors: np.ndarray,
    ids: np.ndarray,
    positions: Callable[[np.ndarray], np.ndarray],
    gen: Path,
) -> BinaryIndex:
    """`binary` with `vectors` appended: coded into its code index (same rotation, same lists)
    and written after its float vectors into gen/floats.npy, which rows `positions` (the
    joined item table's) map ids to."""
    check_unit_rows(vectors, np.arange(len(vectors)))
    shape = (binary.ntotal + len(vectors), binary.d)
    chunks = itertools.chain((b for _, b in blocks(binary.floats)), [vectors])
    floats = write_floats(gen / FLOATS_FILE, shape, chunks)
    binary.codes.add_with_ids(binary.rotation.codes(vectors), np.asarray(ids, dtype=np.int64))
    return dataclasses.replace(binary, floats=floats, positions=positions)


def codes_without(
    binary: BinaryIndex,
    dead: np.ndarray,
    keep: np.ndarray,
    items: Any,
    gen: Path,
    reporter: Reporter,
) -> tuple[BinaryIndex, str]:
    """`binary` less the `dead` ids: the float rows at `keep` (sorted positions) written to
    gen/floats.npy for `items` (the table left), the codes removed with FAISS's remove_ids, or
    (a graph, which cannot remove) coded again from those rows into the emptied index.
    Returns it and how: "remove_ids" or "rebuilt"."""
    floats = write_floats(gen / FLOATS_FILE, (len(keep), binary.d), rows_of(binary.floats, keep))
    left = dataclasses.replace(binary, floats=floats, positions=items.positions)
    try:
        binary.codes.remove_ids(faiss.IDSelectorBatch(dead))
        return left, "remove_ids"
    except RuntimeError:
        pass  # a graph cannot remove: its codes are made again from the vectors kept
    reporter.log(f"coding the {len(keep):,} live vectors again into an emptied index")
    binary.codes.reset()
    for start in range(0, len(keep), ADD_BATCH):
        rows = slice(start, start + ADD_BATCH)
        block = np.ascontiguousarray(floats[rows])
        binary.codes.add_with_ids(binary.rotation.codes(block), items.ids[rows])
    return left, "rebuilt"
