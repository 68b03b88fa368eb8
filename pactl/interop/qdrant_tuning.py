"""A Qdrant collection's search settings tuned to a recall target against pactl's exact
neighbours, as pactl.index.tune tunes a bundle's nprobe.

The queries are a seeded sample of the exported vectors, each one's own id left out of both the
exact and Qdrant's neighbours (as `pactl query --exclude-self` does), and the figure is
Recall@10 against brute force (pactl.index.exact). With int8 codes, first the fewest candidates
rescored from the float vectors (Qdrant's `oversampling`) that meet the target on a wide graph
search, then the smallest `hnsw_ef` that meets it with them. The choice is kept in the
collection's metadata (METADATA_KEY), where `pactl query --qdrant` reads it back, so the
collection carries its own operating point wherever it is served from.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.index.exact import exact_neighbours
from pactl.index.mapped import read_rows
from pactl.index.search import exclude_by_id
from pactl.index.tune import RECALL_K, Climb, Knob, ann_recall, tuning_rows

METADATA_KEY = "pactl_search"  # the collection metadata's key for the tuned search
SEARCH_FORMAT, SEARCH_VERSION = "pactl.qdrant_search", 1
EF_LOW, EF_HIGH = 16, 4_096  # hnsw_ef tried: from about k to far past Qdrant's default (128)
WIDE_EF = 512  # a graph search wide enough that the int8 codes, not the graph, limit recall
MAX_OVERSAMPLING = 16  # the most candidates per hit rescored (x k)
OVERSAMPLING_MARGIN = 0.01  # the depth is tuned where the wide graph search gives this much more
QUERY_BATCH = 64  # queries per query_batch_points request


def tune_collection(
    client: Any,
    collection: str,
    vectors: np.ndarray,
    ids: np.ndarray,
    target: float,
    quantized: bool,
    rng: np.random.Generator,
    reporter: Reporter = QUIET,
    send_params: bool = True,
) -> dict[str, Any]:
    """The cheapest (oversampling, hnsw_ef) giving Recall@10 >= `target` on `collection`, which
    holds `vectors` (row i: point `ids[i]`), as a record for the collection's metadata.
    `send_params` False: qdrant-client's local mode, which compares every point whatever it is
    told (the recall measured is then that of exact search). A `target` of 0: not tuned."""
    record: dict[str, Any] = {
        "format": SEARCH_FORMAT, "version": SEARCH_VERSION, "target_recall": target,
        "hnsw_ef": None, "oversampling": None, "rescore": quantized, "exact": not send_params,
        "recall_at_10": None, "target_reached": False, "tuning_queries": 0,
    }  # fmt: skip
    parts = [(vectors, np.asarray(ids, dtype=np.int64))]
    k = min(RECALL_K, len(ids) - 1)
    if k < 1 or target <= 0:
        return record
    queries, own = read_rows(parts, tuning_rows(len(ids), rng))
    truth = exact_neighbours(parts, queries, own, k)
    search = searcher(client, collection, queries, own, k, send_params, quantized)

    def measure(ef: int, oversampling: int) -> tuple[float, float]:
        start = time.perf_counter()
        found = search(ef, oversampling)
        ms = 1000 * (time.perf_counter() - start) / len(queries)
        return ann_recall(found, truth), ms

    oversampling = 1
    if quantized:  # the depth first, where the graph is searched wide: the codes alone limit
        depths = Knob("oversampling", 1, MAX_OVERSAMPLING, str)
        wide = min(1.0, target + OVERSAMPLING_MARGIN)
        deep = Climb(depths, lambda o: measure(WIDE_EF, int(o)), wide, math.inf, QUIET, None).run()
        oversampling = deep.point.setting if deep.point is not None else MAX_OVERSAMPLING
    efs = Knob("hnsw_ef", EF_LOW, EF_HIGH, str)
    climb = Climb(efs, lambda e: measure(int(e), oversampling), target, math.inf, reporter, None)
    choice = climb.run()
    ef = choice.point.setting if choice.point is not None else EF_HIGH
    if choice.limited_by:
        reporter.warn(
            f"Qdrant's recall@10 {choice.recall:.4f} is below the target {target} at hnsw_ef "
            f"{ef}: a larger --hnsw-m or --ef-construct, or --quantization none, reaches further"
        )
    record.update(
        hnsw_ef=ef,
        oversampling=oversampling if quantized else None,
        recall_at_10=round(choice.recall, 4),
        target_reached=choice.limited_by is None,
        tuning_queries=len(queries),
        operating_points=[point.record() for point in climb.points],
    )
    return record


def searcher(
    client: Any,
    collection: str,
    queries: np.ndarray,
    own: np.ndarray,
    k: int,
    send_params: bool,
    quantized: bool,
) -> Callable[[int, int], np.ndarray]:
    """(hnsw_ef, oversampling) -> the ids of each query's k hits from Qdrant, its own left out
    (-1 where fewer)."""

    def search(ef: int, oversampling: int) -> np.ndarray:
        tuned = {"hnsw_ef": ef, "oversampling": oversampling, "rescore": quantized}
        params = search_params(tuned) if send_params else None
        return searched_ids(client, collection, queries, own, k, params)

    return search


def searched_ids(
    client: Any, collection: str, queries: np.ndarray, own: np.ndarray, k: int, params: Any
) -> np.ndarray:
    """The ids of each query's k hits from Qdrant searched with `params` (SearchParams, or None:
    the collection's defaults), QUERY_BATCH queries a request, its own id left out (-1 where
    fewer)."""
    from qdrant_client import models

    scores = np.full((len(queries), k + 1), -np.inf, dtype=np.float32)
    ids = np.full((len(queries), k + 1), -1, dtype=np.int64)
    for start in range(0, len(queries), QUERY_BATCH):
        requests = [
            models.QueryRequest(query=row.tolist(), limit=k + 1, params=params)
            for row in queries[start : start + QUERY_BATCH]
        ]
        answers = client.query_batch_points(collection, requests=requests)
        for row, answer in enumerate(answers, start=start):
            got = answer.points[: k + 1]
            ids[row, : len(got)] = [int(p.id) for p in got]
            scores[row, : len(got)] = [float(p.score) for p in got]
    return exclude_by_id(scores, ids, own, k)[1]


def measure_search(
    client: Any,
    collection: str,
    vectors: np.ndarray,
    ids: np.ndarray,
    params: Any,
    rng: np.random.Generator,
) -> dict[str, float]:
    """Recall@10 of `collection`'s search with `params` against pactl's exact neighbours over
    `vectors` (row i: point `ids[i]`, every point it holds), on a seeded sample of them as
    queries, each one's own id left out (as the tuning measures it), and the ms a query
    (QUERY_BATCH queries a request): `pactl eval --qdrant`'s figures."""
    parts = [(np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64))]
    k = min(RECALL_K, len(ids) - 1)
    if k < 1:
        raise PactlError(f"Qdrant collection {collection!r} holds {len(ids)} points: too few")
    queries, own = read_rows(parts, tuning_rows(len(ids), rng))
    truth = exact_neighbours(parts, queries, own, k)
    start = time.perf_counter()
    found = searched_ids(client, collection, queries, own, k, params)
    ms = 1000 * (time.perf_counter() - start) / len(queries)
    return {f"qdrant_recall@{k}": ann_recall(found, truth), "qdrant_ms_per_query": ms}


def search_params(tuned: dict[str, Any] | None) -> Any:
    """Qdrant's SearchParams for a tuned record (tune_collection's, or the collection's
    metadata), or None where there is none or it was not tuned (search exactly then)."""
    from qdrant_client import models

    if not tuned or tuned.get("hnsw_ef") is None:
        return None
    quantization = None
    if tuned.get("rescore"):
        quantization = models.QuantizationSearchParams(
            rescore=True, oversampling=float(tuned.get("oversampling") or 1)
        )
    return models.SearchParams(hnsw_ef=int(tuned["hnsw_ef"]), quantization=quantization)


def tuned_words(tuned: dict[str, Any] | None) -> str:
    """The search a collection is answered with, in words (for stderr)."""
    if not tuned or tuned.get("hnsw_ef") is None:
        return "Qdrant searches exactly (no tuned search in the collection's metadata)"
    over = f", oversampling {tuned['oversampling']} rescored" if tuned.get("rescore") else ""
    reached = "" if tuned.get("target_reached") else ", below the target"
    return (
        f"Qdrant searches with hnsw_ef {tuned['hnsw_ef']}{over}: recall@10 "
        f"{tuned['recall_at_10']} measured at export against exact search (target "
        f"{tuned['target_recall']}{reached})"
    )
