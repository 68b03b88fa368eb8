"""The search setting that meets a recall target, measured against exact neighbours."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

from pactl.console import Reporter
from pactl.index.exact import exact_neighbours
from pactl.index.gpus import gpu_searcher
from pactl.index.mapped import Part, count_rows, read_rows
from pactl.index.search import exclude_by_id

TUNING_QUERIES = 1_000  # data points used as held-out queries when tuning nprobe / efSearch


RECALL_K = 10  # the tuned figure is Recall@10 against exact search


PLATEAU = 0.002  # recall gained by doubling a search knob below which more effort is pointless


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
) -> dict[str, Any]:
    """Find the cheapest search setting reaching Recall@10 >= target and leave it set. With
    `gpus`, exact search (the truth, and a Flat index's own search) runs on the GPUs.

    `parts` are the indexed (vectors, ids), one part or one per shard. Queries are a seeded
    sample of the indexed vectors; each query's own id is removed from both the exact and the
    approximate neighbours (as `pactl query` does), so the figure is the recall of the other
    items, the ones a query actually wants.
    """
    n = count_rows(parts)
    k = min(RECALL_K, n - 1)
    record: dict[str, Any] = {"search_params": "", "recall_at_10": None, "target_recall": target}
    if k < 1:
        return {**record, "target_reached": False, "tuning_queries": 0}
    rows = np.sort(rng.choice(n, size=min(TUNING_QUERIES, n), replace=False))
    queries, own = read_rows(parts, rows)
    truth = exact_neighbours(parts, queries, own, k, gpus)
    space: Any = faiss.ParameterSpace()  # (its stub types the params string as int)
    searcher = gpu_searcher(index, gpus)

    def measure(params: str) -> float:
        if params:
            space.set_index_parameters(index, params)
        scores, found = searcher.search(queries, k + 1)
        return ann_recall(exclude_by_id(scores, found, own, k)[1], truth)

    knob = search_knob(index, k)
    if knob is None:
        params, recall = "", measure("")
        reached = recall >= target
    else:
        setting, recall, reached = smallest_setting(knob, measure, target, reporter)
        params = knob.params(setting)
        space.set_index_parameters(index, params)
    if not reached:
        reporter.log(f"recall@10 {recall:.4f} is below the target {target}: best this index gives")
    record.update(search_params=params, recall_at_10=recall, target_reached=reached)
    return {**record, "tuning_queries": len(rows)}


def smallest_setting(
    knob: Knob, measure: Callable[[str], float], target: float, reporter: Reporter
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


def ann_recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Share of the true neighbour ids (rows of `truth`, -1 = none) present in the same row of
    `found`: Recall@k in the approximate-search sense, with k = truth.shape[1]."""
    valid = truth >= 0
    hit = (truth[:, :, None] == found[:, None, :]).any(axis=2) & valid
    return float(hit.sum() / max(int(valid.sum()), 1))
