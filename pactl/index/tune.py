"""The search setting that meets a recall target, measured against exact neighbours."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

from pactl.console import QUIET, Reporter
from pactl.index.exact import exact_neighbours
from pactl.index.gpus import gpu_searcher
from pactl.index.mapped import Part, count_rows, read_rows
from pactl.index.rescoring import RescoredIndex
from pactl.index.search import exclude_by_id

TUNING_QUERIES = 1_000  # data points used as held-out queries when tuning nprobe / efSearch
RECALL_K = 10  # the tuned figure is Recall@10 against exact search
PLATEAU = 0.002  # recall gained by doubling a search knob below which more effort is pointless
QUERY_BUDGET_MS = 10.0  # time a query may take (batched) at the tuned setting, by default
CODES_GAP = 0.02  # recall this far under the coverage, and flat: the codes cap it, not the lists
DEPTH_MARGIN = 0.01  # the rescoring depth is tuned where the lists hold this much more
MAX_TUNED_RESCORE = 128  # the deepest rescoring tuning tries (x k candidates per query)
TUNING_SHARE = 0.25  # of the build so far: what the climb may take, at least TUNING_FLOOR_S
TUNING_FLOOR_S = 60.0
COVERAGE_DEPTH = 4_096  # lists ranked per tuning query for the coverage (at most nlist)
# (queries, their own ids, k) -> the ids of their k exact neighbours, their own excluded
Exact = Callable[[np.ndarray, np.ndarray, int], np.ndarray]


@dataclass(frozen=True)
class Knob:
    name: str  # what the log calls it
    low: int  # the cheapest setting worth trying
    high: int  # the most expensive (exhaustive for IVF)
    params: Callable[[int], str]  # setting -> ParameterSpace string


def search_knob(index: Any, k: int) -> Knob | None:
    """The search-time setting that trades speed for recall, or None for exact/fixed kinds."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        graph = hasattr(faiss.downcast_index(ivf.quantizer), "hnsw")

        def ivf_params(p: int) -> str:
            # The HNSW quantiser must look at least as wide as the lists it returns.
            return f"nprobe={p},quantizer_efSearch={max(64, 2 * p)}" if graph else f"nprobe={p}"

        return Knob("nprobe", 1, int(ivf.nlist), ivf_params)
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if hasattr(inner, "hnsw"):
        return Knob("efSearch", max(16, k + 1), max(4096, k + 1), lambda e: f"efSearch={e}")
    return None


def tune_search(
    index: Any,
    parts: Sequence[Part],
    target: float,
    rng: np.random.Generator,
    reporter: Reporter,
    gpus: int = 0,
    query_budget_ms: float = QUERY_BUDGET_MS,
    depth: int | None = None,
    exact: Exact | None = None,
    tuning_seconds: float = math.inf,
) -> dict[str, Any]:
    """Find the cheapest search setting reaching Recall@10 >= target within `query_budget_ms` a
    query (batched) and leave it set. With `gpus`, exact search (the truth, and a Flat index's
    own search) runs on the GPUs.

    `parts` are the indexed (vectors, ids), one part or one per shard. Queries are a seeded
    sample of the indexed vectors; each query's own id is removed from both the exact and the
    approximate neighbours (as `pactl query` does), so the figure is the recall of the other
    items, the ones a query actually wants. A RescoredIndex whose `depth` is not given gets the
    fewest candidates per hit that meet the target first (tuned_depth). The record keeps every
    operating point measured and, where the target is out of reach, what limits it
    (`limited_by`: coverage, codes, query time, or tuning time past `tuning_seconds`). `exact`
    gives the true neighbours where they were found elsewhere (the shard tasks of
    pactl.engines.indexing), else they are searched here.
    """
    n = count_rows(parts)
    k = min(RECALL_K, n - 1)
    record: dict[str, Any] = {"search_params": "", "recall_at_10": None, "target_recall": target}
    if k < 1:
        return {**record, "target_reached": False, "tuning_queries": 0}
    rows = tuning_rows(n, rng)
    queries, own = read_rows(parts, rows)
    started = time.perf_counter()
    truth = exact(queries, own, k) if exact else exact_neighbours(parts, queries, own, k, gpus)
    truth_done = time.perf_counter()
    space: Any = faiss.ParameterSpace()  # (its stub types the params string as int)
    rescored = isinstance(index, RescoredIndex)
    codes = index.index if rescored else index  # what the search setting is set on
    searcher = index if rescored else gpu_searcher(index, gpus)

    def measure(params: str) -> tuple[float, float]:
        if params:
            space.set_index_parameters(codes, params)
        start = time.perf_counter()
        scores, found = searcher.search(queries, k + 1)
        ms = 1000 * (time.perf_counter() - start) / len(queries)
        return ann_recall(exclude_by_id(scores, found, own, k)[1], truth), ms

    knob = search_knob(codes, k)
    coverage = list_coverage(codes, parts, queries, truth)
    if rescored and depth is None:
        wide = Climb(knob, measure, min(1.0, target + DEPTH_MARGIN), math.inf, QUIET, coverage)
        start = wide.start(knob) if knob is not None else 0
        index.rescore = tuned_depth(index, knob, start, measure, target, reporter)
    climb = Climb(knob, measure, target, query_budget_ms, reporter, coverage, tuning_seconds)
    choice = climb.run()
    space.set_index_parameters(codes, choice.params) if choice.params else None
    if choice.limited_by:
        reporter.warn(shortfall_words(choice, target, query_budget_ms))
    record.update(
        search_params=choice.params,
        recall_at_10=choice.recall,
        target_reached=choice.limited_by is None,
        limited_by=choice.limited_by,
        query_budget_ms=query_budget_ms,
        operating_points=[point.record() for point in climb.points],
        **({"rescore": index.rescore} if rescored else {}),
        truth_seconds=round(truth_done - started, 3),  # the exact neighbours of the queries
        tuning_seconds=round(time.perf_counter() - truth_done, 3),  # the settings measured
    )
    return {**record, "tuning_queries": len(rows)}


def tuned_depth(
    index: RescoredIndex,
    knob: Knob | None,
    setting: int,
    measure: Callable[[str], tuple[float, float]],
    target: float,
    reporter: Reporter,
) -> int:
    """The fewest candidates per hit whose rescoring meets `target` at the search `setting`
    (where the probed lists hold the true neighbours: the codes alone then limit recall)."""
    params = knob.params(setting) if knob is not None else ""

    def at_depth(depth: str) -> tuple[float, float]:
        index.rescore = int(depth.partition("=")[2])
        return measure(params)

    depths = Knob("rescore", 1, MAX_TUNED_RESCORE, lambda f: f"rescore={f}")
    choice = Climb(depths, at_depth, target, math.inf, reporter, None).run()
    return choice.point.setting if choice.point is not None else MAX_TUNED_RESCORE


def tuning_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    """The rows tune_search takes as its queries, drawn from `rng` (sorted: a memory map is
    read front to back)."""
    return np.sort(rng.choice(n, size=min(TUNING_QUERIES, n), replace=False))


@dataclass(frozen=True)
class Point:
    """One search setting as measured: its recall, the recall exact codes could give there (the
    coverage of the true neighbours by the probed lists; None where there are no lists), and
    its time a query, batched."""

    knob: str
    setting: int
    recall: float
    coverage: float | None
    ms: float

    def record(self) -> dict[str, Any]:
        cover = None if self.coverage is None else round(self.coverage, 4)
        return {
            self.knob or "setting": self.setting,
            "recall_at_10": round(self.recall, 4),
            "coverage": cover,
            "ms_per_query": round(self.ms, 4),
        }


@dataclass(frozen=True)
class Choice:
    params: str
    recall: float
    limited_by: str | None  # None: the target is reached
    point: Point | None


class Climb:
    """The search for the smallest setting that meets the target: from the setting whose
    coverage first reaches it (IVF), else from the knob's cheapest, doubling while recall is
    below the target and time allows, then bisecting down. It stops early only for a reason it
    can name: the codes (recall flat, well under a coverage that already reaches the target),
    the query-time budget, or the time given to tuning (`seconds`)."""

    def __init__(
        self,
        knob: Knob | None,
        measure: Callable[[str], tuple[float, float]],
        target: float,
        budget_ms: float,
        reporter: Reporter,
        coverage: Callable[[int], float] | None,
        seconds: float = math.inf,
    ) -> None:
        self.knob, self.measure, self.target = knob, measure, target
        self.budget_ms, self.reporter, self.coverage = budget_ms, reporter, coverage
        self.seen: dict[int, Point] = {}
        self.until = time.perf_counter() + seconds  # the climb stops past this (tuning time)

    @property
    def points(self) -> list[Point]:
        return [self.seen[s] for s in sorted(self.seen)]

    def at(self, setting: int) -> Point:
        if setting not in self.seen:
            knob = self.knob
            recall, ms = self.measure(knob.params(setting) if knob else "")
            cover = self.coverage(setting) if self.coverage else None
            point = Point(knob.name if knob else "", setting, recall, cover, ms)
            self.seen[setting] = point
            covered = "" if cover is None else f", coverage {cover:.4f}"
            name = f"{knob.name}={setting}" if knob else "exact setting"
            self.reporter.log(f"  {name}: recall@10 {recall:.4f}{covered}, {ms:.3f} ms a query")
        return self.seen[setting]

    def run(self) -> Choice:
        knob = self.knob
        if knob is None:
            point = self.at(0)
            reached = point.recall >= self.target
            return Choice("", point.recall, None if reached else "codes", point)
        failed, setting = 0, self.start(knob)
        while (point := self.at(setting)).recall < self.target:
            reason = self.stop_reason(point, failed)
            if reason is not None or setting >= knob.high:
                return self.best_short(reason or self.ceiling(point))
            failed, setting = setting, min(2 * setting, knob.high)
        while setting - failed > 1 and setting > knob.low:
            middle = max((failed + setting) // 2, knob.low)
            if middle in (failed, setting):
                break
            ok = self.at(middle).recall >= self.target
            failed, setting = (failed, middle) if ok else (middle, setting)
        point = self.seen[setting]
        if point.ms > self.budget_ms:  # the target is met, but only past the budget
            return self.best_short("query time")
        return Choice(knob.params(setting), point.recall, None, point)

    def start(self, knob: Knob) -> int:
        """Where the climb starts: the smallest setting whose coverage reaches the target (no
        setting below it can: recall with exact codes is at most the coverage)."""
        if self.coverage is None:
            return knob.low
        low, high = knob.low, knob.high
        if self.coverage(high) < self.target:
            return high
        while low < high:
            middle = (low + high) // 2
            low, high = (middle + 1, high) if self.coverage(middle) < self.target else (low, middle)
        return max(knob.low, low)

    def stop_reason(self, point: Point, failed: int) -> str | None:
        """Why climbing further is pointless, or None to go on."""
        if point.ms > self.budget_ms:
            return "query time"
        if time.perf_counter() > self.until:
            return "tuning time"
        if failed == 0:
            return None
        gained = point.recall - self.seen[failed].recall
        cover = point.coverage
        if cover is not None and cover >= self.target and cover - point.recall > CODES_GAP:
            return "codes" if gained < PLATEAU else None
        # Without lists to tell a ceiling from a slow climb: two flat doublings in a row.
        earlier = [s for s in self.seen if s < failed]
        if gained < PLATEAU and earlier:
            return (
                "codes"
                if self.seen[failed].recall - self.seen[max(earlier)].recall < PLATEAU
                else None
            )
        return None

    def ceiling(self, point: Point) -> str:
        if point.coverage is not None and point.coverage < self.target:
            return "coverage"
        return "codes"

    def best_short(self, reason: str) -> Choice:
        """The cheapest setting within PLATEAU of the best recall seen within the budget."""
        within = [p for p in self.seen.values() if p.ms <= self.budget_ms] or list(
            self.seen.values()
        )
        best = max(p.recall for p in within)
        cheapest = min((p for p in within if p.recall >= best - PLATEAU), key=lambda p: p.setting)
        assert self.knob is not None
        return Choice(self.knob.params(cheapest.setting), cheapest.recall, reason, cheapest)


def shortfall_words(choice: Choice, target: float, budget_ms: float) -> str:
    """The one line `pactl index` prints when the target is out of reach: why, and what would
    reach it."""
    point = choice.point
    where = f" at {point.knob}={point.setting}" if point is not None and point.knob else ""
    head = f"recall@10 {choice.recall:.4f} is below the target {target}{where}"
    if choice.limited_by == "query time":
        ms = point.ms if point is not None else float("nan")
        return (
            f"{head}: limited by query time ({ms:.2f} ms a query, over the budget of "
            f"{budget_ms:g} ms); a higher --query-budget-ms searches wider"
        )
    if choice.limited_by == "tuning time":
        return (
            f"{head}: limited by tuning time (the climb stopped at its share of the build, "
            "the best setting measured kept); a --factory with fewer lists tunes sooner"
        )
    if choice.limited_by == "coverage":
        return (
            f"{head}: limited by coverage (the lists probed hold too few true neighbours); a "
            "--factory with fewer lists, or Flat, reaches it"
        )
    cover = point.coverage if point is not None else None
    held = (
        f" (the lists probed hold {cover:.4f} of the true neighbours)" if cover is not None else ""
    )
    return (
        f"{head}: limited by the codes{held}; rescoring by cosine reaches it (pactl index "
        "without --rescore 0 keeps the float vectors for it), as do exact codes with no "
        "reducing transform before them (--factory IVF<lists>,Flat)"
    )


def list_coverage(
    index: Any, parts: Sequence[Part], queries: np.ndarray, truth: np.ndarray
) -> Callable[[int], float] | None:
    """nprobe -> the share of the true neighbours (ids in `truth`, -1 none) whose inverted list
    is among the nprobe lists nearest each query: the recall exact codes would give, from the
    coarse quantiser alone. None for an index without inverted lists."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return None
    valid = truth >= 0
    rows, where = np.unique(rows_of_ids(parts, truth[valid]), return_inverse=True)
    vectors, _ = read_rows(parts, rows)
    lists = ivf.quantizer.assign(transformed(index, vectors), 1).ravel()[where]  # (valid,)
    nlist = int(ivf.nlist)
    depth = min(nlist, COVERAGE_DEPTH)
    centroids = ivf.quantizer.reconstruct_n(0, nlist)  # (nlist, d')
    _, order = faiss.knn(
        transformed(index, queries), centroids, depth, metric=ivf.quantizer.metric_type
    )
    rank = np.full((len(queries), nlist), depth, dtype=np.int32)  # depth: not within the depth
    np.put_along_axis(rank, order, np.arange(depth, dtype=np.int32)[None, :], axis=1)
    query_of = np.nonzero(valid)[0]
    ranks = np.sort(rank[query_of, lists])  # each true neighbour's list, ranked for its query
    total = max(int(valid.sum()), 1)

    def coverage(nprobe: int) -> float:
        if nprobe >= nlist:
            return 1.0
        return float(np.searchsorted(ranks, nprobe, side="left") / total)

    return coverage


def rows_of_ids(parts: Sequence[Part], ids: np.ndarray) -> np.ndarray:
    """The row (numbered across the parts in order) that holds each of `ids`."""
    all_ids = np.concatenate([np.asarray(part_ids, dtype=np.int64) for _, part_ids in parts])
    order = np.argsort(all_ids, kind="stable")
    return order[np.searchsorted(all_ids, ids, sorter=order)]


def transformed(index: Any, x: np.ndarray) -> np.ndarray:
    """`x` through an IndexPreTransform's chain (OPQ, PCA), as the coarse quantiser sees it."""
    inner = faiss.downcast_index(index)
    if not isinstance(inner, faiss.IndexPreTransform):
        return np.ascontiguousarray(x, dtype=np.float32)
    chain: Any = inner.chain  # a SWIG vector (its stub types it as a list)
    for i in range(chain.size()):
        x = faiss.downcast_VectorTransform(chain.at(i)).apply_py(x)
    return np.ascontiguousarray(x, dtype=np.float32)


def ann_recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Share of the true neighbour ids (rows of `truth`, -1 = none) present in the same row of
    `found`: Recall@k in the approximate-search sense, with k = truth.shape[1]."""
    valid = truth >= 0
    hit = (truth[:, :, None] == found[:, None, :]).any(axis=2) & valid
    return float(hit.sum() / max(int(valid.sum()), 1))
