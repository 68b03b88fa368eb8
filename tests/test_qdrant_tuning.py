"""`pactl export --to qdrant` for a cluster: what it asks a server for (shards, replicas, int8
codes in RAM with the float vectors on disk, no graph while the points go in, the graph after,
parallel upload streams) and a search tuned to the recall target against brute force.

qdrant-client's local mode takes the layout's arguments and ignores them (it has no shards, no
graph and searches exactly), so a server is stood in for by RecordingQdrant: it records each
call and searches as Qdrant does, an HNSW graph over int8 codes (FAISS's IndexHNSWSQ, built
only once the collection's HNSW m is above 0) whose candidates are rescored by the exact dot
product. The recall each tuned setting gives is checked against a float64 brute force of ours
on queries the tuner never saw."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faiss
import numpy as np
import pytest

from pactl.config import QdrantConfig
from pactl.console import QUIET
from pactl.store.item_table import ItemTable


class RecordingQdrant:
    """One collection on a stand-in server: every call recorded in `calls` as (name, kwargs)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.layout: dict[str, Any] | None = None
        self.points: dict[int, np.ndarray] = {}
        self.hnsw_m = 0
        self.metadata: dict[str, Any] | None = None
        self.graph: Any = None

    def collection_exists(self, name: str) -> bool:
        return self.layout is not None

    def create_collection(self, name: str, **layout: Any) -> None:
        self.calls.append(("create_collection", layout))
        self.layout, self.hnsw_m = layout, layout["hnsw_config"].m

    def get_collection(self, name: str) -> Any:
        from qdrant_client import models

        assert self.layout is not None
        params = SimpleNamespace(
            vectors=self.layout["vectors_config"], shard_number=self.layout["shard_number"]
        )
        config = SimpleNamespace(params=params, metadata=self.metadata)
        return SimpleNamespace(status=models.CollectionStatus.GREEN, config=config)

    def retrieve(self, name: str, ids: list[int], **_: Any) -> list[Any]:
        return [SimpleNamespace(id=i) for i in ids if i in self.points]

    def upload_points(self, name: str, points: Any, **options: Any) -> None:
        for point in points:
            self.points[int(point.id)] = np.asarray(point.vector, dtype=np.float32)
        self.calls.append(("upload_points", {**options, "hnsw_m_then": self.hnsw_m}))

    def update_collection(self, name: str, **changes: Any) -> None:
        self.calls.append(("update_collection", changes))
        if changes.get("hnsw_config") is not None:
            self.hnsw_m, self.graph = changes["hnsw_config"].m, None
        if "metadata" in changes:
            self.metadata = changes["metadata"]

    def count(self, name: str, exact: bool = True) -> Any:
        return SimpleNamespace(count=len(self.points))

    def query_batch_points(self, name: str, requests: list[Any]) -> list[Any]:
        assert self.hnsw_m > 0, "searched before the graph was asked for"
        ids = np.array(sorted(self.points), dtype=np.int64)
        floats = np.stack([self.points[i] for i in ids])
        if self.graph is None:
            graph = faiss.IndexHNSWSQ(
                floats.shape[1], faiss.ScalarQuantizer.QT_8bit, self.hnsw_m,
                faiss.METRIC_INNER_PRODUCT,
            )  # fmt: skip
            graph.hnsw.efConstruction = 40
            graph.train(floats)
            graph.add(floats)
            self.graph = graph
        params, limit = requests[0].params, requests[0].limit  # the tuner's are all alike
        assert all((r.params, r.limit) == (params, limit) for r in requests)
        self.graph.hnsw.efSearch = params.hnsw_ef
        depth = math.ceil(limit * params.quantization.oversampling)
        queries = np.asarray([r.query for r in requests], dtype=np.float32)  # (q, d)
        _, rows = self.graph.search(queries, depth)  # (q, depth) candidates from the codes
        answers = []
        for query, found in zip(queries, rows, strict=True):
            found = found[found >= 0]
            exact = floats[found] @ query  # rescored from the float vectors
            best = np.argsort(-exact, kind="stable")[:limit]
            points = [SimpleNamespace(id=int(ids[found[b]]), score=float(exact[b])) for b in best]
            answers.append(SimpleNamespace(points=points))
        return answers


def clustered(n: int, dim: int, seed: int) -> np.ndarray:
    """Unit vectors in 40 tight clusters (close neighbours that a sparse graph misses)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, dim))
    x = centres[rng.integers(0, 40, n)] + 0.6 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def items_of(n: int) -> ItemTable:
    ids = np.arange(100, 100 + n)  # not row numbers: a mix-up of rows and ids shows
    return ItemTable(ids, [f"img/{i}.png" for i in ids], [str(i % 7) for i in ids])


def brute_force_recall(
    vectors: np.ndarray, ids: np.ndarray, rows: np.ndarray, found: list[list[int]]
) -> float:
    """Recall@10 of `found` (ids per query row) against a float64 brute force, each query's own
    id left out."""
    x = vectors.astype(np.float64)
    hit = 0
    for row, got in zip(rows, found, strict=True):
        sims = x @ x[row]
        sims[row] = -np.inf
        truth = set(ids[np.argsort(-sims, kind="stable")[:10]].tolist())
        hit += len(truth & set([i for i in got if i != ids[row]][:10]))
    return hit / (10 * len(rows))


def searched(client: RecordingQdrant, vectors: np.ndarray, rows: np.ndarray, tuned: Any) -> Any:
    from qdrant_client import models

    from pactl.interop.qdrant_tuning import search_params

    params = search_params(tuned)
    requests = [
        models.QueryRequest(query=vectors[r].tolist(), limit=11, params=params) for r in rows
    ]
    return [[int(p.id) for p in a.points] for a in client.query_batch_points("c", requests)]


@pytest.fixture(scope="module")
def exported() -> tuple[RecordingQdrant, np.ndarray, ItemTable, dict[str, Any]]:
    from pactl.interop.qdrant import export_to_client

    vectors, items = clustered(3_000, 24, seed=1), items_of(3_000)
    client = RecordingQdrant()
    config = QdrantConfig(
        collection="c", batch_size=500, shards=6, replication=2, hnsw_m=4, ef_construct=40,
        parallel=4, target_recall=0.95,
    )  # fmt: skip
    done = export_to_client(client, vectors, items, config, QUIET, remote=True)
    return client, vectors, items, done


def test_the_collection_is_laid_out_for_a_cluster_and_its_graph_built_after_upload(
    exported: Any,
) -> None:
    from qdrant_client import models

    client, _, _, done = exported
    assert (done["written"], done["skipped"], done["count"]) == (3_000, 0, 3_000)
    names = [name for name, _ in client.calls]
    assert names[:3] == ["create_collection", "upload_points", "update_collection"]
    assert names[-1] == "update_collection" and "metadata" in client.calls[-1][1]
    layout = client.calls[0][1]
    assert (layout["shard_number"], layout["replication_factor"]) == (6, 2)
    assert layout["vectors_config"] == models.VectorParams(
        size=24, distance=models.Distance.DOT, on_disk=True
    )
    scalar = layout["quantization_config"].scalar
    assert (scalar.type, scalar.always_ram) == (models.ScalarType.INT8, True)
    assert layout["hnsw_config"].m == 0  # no graph while the points go in
    assert layout["optimizers_config"].indexing_threshold == 0
    upload = client.calls[1][1]
    assert (upload["parallel"], upload["batch_size"], upload["hnsw_m_then"]) == (4, 500, 0)
    graph = client.calls[2][1]
    assert (graph["hnsw_config"].m, graph["hnsw_config"].ef_construct) == (4, 40)
    assert graph["optimizers_config"].indexing_threshold > 0


def test_the_tuned_search_meets_the_target_on_queries_it_never_saw(exported: Any) -> None:
    """The tuned hnsw_ef and oversampling, read back from the collection's metadata, reach
    Recall@10 0.95 (within the sampling error of 400 queries) against a float64 brute force
    on rows that were not tuning queries; the cheapest hnsw_ef does not, so the tuner had to
    climb."""
    from pactl.index.tune import tuning_rows
    from pactl.interop.qdrant_tuning import EF_LOW, METADATA_KEY

    client, vectors, items, done = exported
    tuned = client.metadata[METADATA_KEY]
    assert tuned == done["search"] and tuned["target_reached"] is True
    assert tuned["tuning_queries"] == 1_000 and tuned["exact"] is False
    assert tuned["hnsw_ef"] > EF_LOW and tuned["recall_at_10"] >= 0.95
    seen = tuning_rows(len(items), np.random.default_rng(0))
    fresh = np.setdiff1d(np.arange(len(items)), seen)[::4][:400]
    recall = brute_force_recall(vectors, items.ids, fresh, searched(client, vectors, fresh, tuned))
    assert recall >= 0.95 - 0.015
    cheapest = {**tuned, "hnsw_ef": EF_LOW, "oversampling": 1}
    low = brute_force_recall(vectors, items.ids, fresh, searched(client, vectors, fresh, cheapest))
    assert low < 0.95


def test_a_server_is_searched_as_tuned_and_exactly_without_a_tuned_record(
    exported: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qdrant_client import models

    import pactl.interop.qdrant as qdrant

    client, _, _, done = exported
    monkeypatch.setattr(qdrant, "connect", lambda target: client)
    monkeypatch.setattr(client, "close", lambda: None, raising=False)
    found = qdrant.QdrantSearch("http://qdrant:6333", "c", 24, k=10)
    over = float(done["search"]["oversampling"])
    assert found.params == models.SearchParams(
        hnsw_ef=done["search"]["hnsw_ef"],
        quantization=models.QuantizationSearchParams(rescore=True, oversampling=over),
    )
    assert f"hnsw_ef {done['search']['hnsw_ef']}" in found.describe()
    monkeypatch.setattr(client, "metadata", None)
    assert qdrant.QdrantSearch("http://qdrant:6333", "c", 24, k=10).params.exact is True


def test_a_collection_of_other_shards_is_refused(exported: Any) -> None:
    from pactl.errors import PactlError
    from pactl.interop.qdrant import ensure_collection

    client = exported[0]
    assert ensure_collection(client, "c", 24, QdrantConfig(shards=6)) is False
    with pytest.raises(PactlError, match=r"has 6 shards, not --shards 3: .* fixed when"):
        ensure_collection(client, "c", 24, QdrantConfig(shards=3))


def test_local_mode_takes_the_layout_and_searches_exactly(tmp_path: Path) -> None:
    """qdrant-client's local mode accepts the cluster layout without keeping it (it has no
    shards), writes in one stream whatever --parallel says, and its exact search measures
    recall 1 at the cheapest setting; the record is in the collection's metadata."""
    from pactl.interop.qdrant import QdrantSearch, connect, export_vectors
    from pactl.interop.qdrant_tuning import EF_LOW, METADATA_KEY

    vectors, items = clustered(200, 8, seed=2), items_of(200)
    config = QdrantConfig(shards=4, replication=2, parallel=8, batch_size=64)
    done = export_vectors(vectors, items, str(tmp_path / "qd"), config)
    assert (done["written"], done["count"]) == (200, 200)
    assert (done["search"]["hnsw_ef"], done["search"]["recall_at_10"]) == (EF_LOW, 1.0)
    client = connect(str(tmp_path / "qd"))
    try:
        assert client.get_collection("pactl").config.metadata[METADATA_KEY] == done["search"]
    finally:
        client.close()
    found = QdrantSearch(str(tmp_path / "qd"), "pactl", 8, k=10)
    assert found.params is None and "exact" in found.describe()
    found.close()
