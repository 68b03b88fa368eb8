"""A bundle (or a vectors folder) handed to a Qdrant collection, and searched there.

Points are the items: the pactl id as the point id, the vector, and a payload of `id`, `path`
and `label`. The collection uses the dot product, which on pactl's unit vectors is the cosine
similarity FAISS's inner-product bundles score, so an exact search there returns the bundle's
hits with the same scores. Writing goes in batches (in `parallel` streams to a server), and each
batch first asks which of its ids the collection holds already: an export stopped half-way, run
again, writes only the rest.

The collection is laid out for a cluster (shards, replicas, int8 codes in RAM with the float
vectors on disk) and its HNSW graph is built once, after the points are in. Its search
(`hnsw_ef`, the codes' oversampling) is then tuned to a recall target against exact search
(pactl.interop.qdrant_tuning) and kept in the collection's metadata, which QdrantSearch reads.

The target is a URL (`http://host:6333`, a Qdrant server) or a folder: qdrant-client's local
mode keeps the collection there, with no server (for trials and tests; it is not meant for
more than some tens of thousands of points).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pactl.config import QdrantConfig
from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.interop import require
from pactl.interop.qdrant_tuning import METADATA_KEY, search_params, tuned_words
from pactl.results import Hit

EXTRA = ("qdrant", "qdrant_client")  # extra, module
DISTANCE = "Dot"  # Qdrant's name for the inner product
QUANTIZATIONS = ("int8", "none")  # pactl.config.QUANTIZATION_NAMES
QUANTILE = 0.99  # the int8 range leaves out the 1% most extreme components (Qdrant's advice)
INDEXING_THRESHOLD_KB = 20_000  # Qdrant's default: segments past this get an HNSW graph
POLL_S = 2.0  # how often the graph's build is asked after


def connect(target: str) -> Any:
    """A QdrantClient for a server's URL, or for a local-mode folder (made if missing)."""
    require("Qdrant", *EXTRA)
    from qdrant_client import QdrantClient

    if is_remote(target):
        return QdrantClient(url=target)
    folder = Path(target)
    if folder.exists() and not folder.is_dir():
        raise PactlError(f"{target} is neither a URL (http://...) nor a folder for Qdrant")
    return QdrantClient(path=str(folder))


def is_remote(target: str) -> bool:
    """Whether `target` names a server (a URL), not a local-mode folder."""
    return target.startswith(("http://", "https://"))


def ensure_collection(
    client: Any, name: str, dimension: int, config: QdrantConfig | None = None
) -> bool:
    """Make collection `name` for `dimension`-d dot-product vectors laid out as `config` says,
    or check the one there; returns whether it was made. One of another dimension or metric,
    or of other shards than `config.shards`, is refused."""
    from qdrant_client import models

    if not client.collection_exists(name):
        client.create_collection(name, **collection_layout(dimension, config or QdrantConfig()))
        return True
    info = client.get_collection(name).config
    vectors = info.params.vectors
    if not isinstance(vectors, models.VectorParams):
        raise PactlError(f"Qdrant collection {name!r} has named vectors; pactl writes one vector")
    have = (int(vectors.size), str(getattr(vectors.distance, "value", vectors.distance)))
    if have != (dimension, DISTANCE):
        raise PactlError(
            f"Qdrant collection {name!r} holds {have[0]}-d vectors by {have[1]}; these are "
            f"{dimension}-d by {DISTANCE}: give another --collection"
        )
    shards = info.params.shard_number
    if config is not None and config.shards is not None and shards not in (None, config.shards):
        raise PactlError(
            f"Qdrant collection {name!r} has {shards} shards, not --shards {config.shards}: a "
            "collection's shards are fixed when it is made; give another --collection"
        )
    return False


def collection_layout(dimension: int, config: QdrantConfig) -> dict[str, Any]:
    """create_collection's arguments: shards and replicas, the float vectors on disk or in RAM,
    int8 codes kept in RAM, and no HNSW graph while the points go in (build_graph sets it
    after: one graph built once, instead of one rebuilt as segments grow)."""
    from qdrant_client import models

    quantization = None
    if config.quantization == "int8":
        scalar = models.ScalarQuantizationConfig(
            type=models.ScalarType.INT8, quantile=QUANTILE, always_ram=True
        )
        quantization = models.ScalarQuantization(scalar=scalar)
    return {
        "vectors_config": models.VectorParams(
            size=dimension, distance=models.Distance.DOT, on_disk=config.on_disk
        ),
        "shard_number": config.shards,
        "replication_factor": config.replication,
        "quantization_config": quantization,
        "hnsw_config": models.HnswConfigDiff(m=0, ef_construct=config.ef_construct),
        "optimizers_config": models.OptimizersConfigDiff(indexing_threshold=0),
    }


def bundle_vectors(bundle: Any) -> tuple[np.ndarray, Any]:
    """(vectors, ItemTable) of a loaded bundle's live items, from its index: exact for Flat and
    IVF-Flat, the coded ones for lossy kinds (PQ, SQ); a binary bundle's float vectors."""
    live = ~bundle.is_deleted(bundle.items.ids)
    items = bundle.items.take(live)
    floats = getattr(bundle.index, "floats", None)  # a binary bundle's (row i: item row i)
    if floats is not None:
        return np.ascontiguousarray(floats[np.flatnonzero(live)], dtype=np.float32), items
    return _reconstruct(bundle.index, items.ids, bundle.path), items


def _reconstruct(index: Any, ids: np.ndarray, source: Path) -> np.ndarray:
    import faiss

    ivf = faiss.try_extract_index_ivf(index)
    try:
        if ivf is not None:  # a hash table takes any ids (an array only 0..n-1: not compacted)
            hashtable = faiss.DirectMap.Hashtable  # type: ignore[attr-defined]  # not in the stub
            ivf.set_direct_map_type(hashtable)
        return np.asarray(index.reconstruct_batch(ids), dtype=np.float32)
    except RuntimeError:
        raise PactlError(
            f"the index of {source} cannot give back its vectors: export the vectors folder "
            "it was built from instead"
        ) from None


def export_vectors(
    vectors: np.ndarray,
    items: Any,
    target: str,
    config: QdrantConfig = QdrantConfig(),
    reporter: Reporter = QUIET,
) -> dict[str, Any]:
    """Write the items as points of `config.collection` at `target` (export_to_client) and
    close the connection."""
    client = connect(target)
    try:
        return export_to_client(client, vectors, items, config, reporter, is_remote(target))
    finally:
        client.close()


def export_to_client(
    client: Any,
    vectors: np.ndarray,
    items: Any,
    config: QdrantConfig,
    reporter: Reporter,
    remote: bool,
) -> dict[str, Any]:
    """Write the items as points of `config.collection`, skipping ids already there, with no
    HNSW graph while they go in; then build the graph (config.hnsw_m, config.ef_construct) and
    tune the search to config.target_recall, kept in the collection's metadata. Returns
    {"written", "skipped", "count" (the collection's points), "search" (the tuned record)}."""
    from pactl.interop.qdrant_tuning import tune_collection

    name = config.collection
    ensure_collection(client, name, int(vectors.shape[1]), config)
    streams = config.parallel if remote else 1
    if config.parallel > 1 and not remote:
        reporter.log("qdrant-client's local mode writes in one stream: --parallel is a server's")
    done = {"written": 0, "skipped": 0}
    with reporter.bar("exporting", total=len(items)) as advance:
        points = missing_points(client, name, vectors, items, config.batch_size, done, advance)
        client.upload_points(
            name, points, batch_size=config.batch_size, parallel=streams, wait=True
        )  # fmt: skip
    build_graph(client, name, config, reporter)
    rng = np.random.default_rng(0)  # the same queries for every export of the same items
    reporter.log(f"tuning Qdrant's search to recall@10 {config.target_recall}")
    quantized = config.quantization != "none"
    tuned = tune_collection(
        client, name, vectors, items.ids, config.target_recall, quantized, rng, reporter, remote
    )  # fmt: skip
    keep_tuned(client, name, tuned, reporter)
    count = int(client.count(name, exact=True).count)
    return {**done, "count": count, "search": tuned}


def missing_points(
    client: Any,
    name: str,
    vectors: np.ndarray,
    items: Any,
    batch_size: int,
    done: dict[str, int],
    advance: Any,
) -> Iterator[Any]:
    """The items' points that `name` does not hold yet, asked a batch at a time (so an export
    stopped half-way goes on where it stopped); counts them into `done`."""
    from qdrant_client import models

    for start in range(0, len(items), batch_size):
        stop = min(start + batch_size, len(items))
        ids = items.ids[start:stop].tolist()
        there = {p.id for p in client.retrieve(name, ids, with_payload=False)}
        for at, i in enumerate(ids):
            if i in there:
                continue
            payload = {"id": i, "path": items.paths[start + at], "label": items.labels[start + at]}
            vector = np.asarray(vectors[start + at], dtype=np.float32).tolist()
            yield models.PointStruct(id=i, vector=vector, payload=payload)
        done["written"] += len(ids) - len(there)
        done["skipped"] += len(there)
        advance(stop - start)


def keep_tuned(client: Any, name: str, tuned: dict[str, Any], reporter: Reporter) -> None:
    """The tuned search into the collection's metadata; a server too old to keep collection
    metadata is said in one line, and its queries then search exactly."""
    from qdrant_client.http.exceptions import UnexpectedResponse

    try:
        client.update_collection(name, metadata={METADATA_KEY: tuned})
    except UnexpectedResponse as e:
        reporter.warn(
            f"Qdrant kept no metadata for {name!r} ({e.status_code}: a server too old for "
            f"collection metadata): pactl query --qdrant will search exactly, not as tuned"
        )


def build_graph(client: Any, name: str, config: QdrantConfig, reporter: Reporter) -> None:
    """Set the collection's real HNSW settings once its points are in, and wait while the
    server builds the graph (a local-mode collection is ready at once: it has none)."""
    import time

    from qdrant_client import models

    reporter.log(f"building the HNSW graph of {name!r} (m {config.hnsw_m}, ef_construct "
                 f"{config.ef_construct})")  # fmt: skip
    client.update_collection(
        name,
        hnsw_config=models.HnswConfigDiff(m=config.hnsw_m, ef_construct=config.ef_construct),
        optimizers_config=models.OptimizersConfigDiff(indexing_threshold=INDEXING_THRESHOLD_KB),
    )
    while (status := client.get_collection(name).status) != models.CollectionStatus.GREEN:
        if status == models.CollectionStatus.RED:
            raise PactlError(f"Qdrant collection {name!r} is red (its optimiser failed): see "
                             "the server's log")  # fmt: skip
        if status == models.CollectionStatus.GREY:  # optimisations wait to be triggered
            client.update_collection(name, optimizers_config=models.OptimizersConfigDiff())
        time.sleep(POLL_S)


class QdrantSearch:
    """Top-k hits from a Qdrant collection instead of a bundle's index: what `pactl query
    --qdrant` and pactl.api.Index.query(qdrant=...) search. The collection must hold vectors of
    the bundle's dimension by the dot product (one that pactl export wrote)."""

    def __init__(self, target: str, collection: str, dimension: int, k: int) -> None:
        self.client = connect(target)
        if not self.client.collection_exists(collection):
            self.client.close()
            raise PactlError(f"{target} has no Qdrant collection {collection!r}")
        ensure_collection(self.client, collection, dimension)
        self.collection, self.k = collection, k
        self.remote = is_remote(target)
        self.tuned, self.params = tuned_search(self.client, collection, self.remote)

    def describe(self) -> str:
        """How the collection is searched, in words (for stderr)."""
        return searched_as(self.tuned, self.remote)

    def __call__(
        self, names: list[str], vectors: np.ndarray, own: np.ndarray | None = None
    ) -> list[list[Hit]]:
        """Per query row, its hits best first; `own[i]` (an id, or -1) is left out of row i."""
        out = []
        for i, row in enumerate(np.asarray(vectors, dtype=np.float32)):
            skip = int(own[i]) if own is not None else -1
            found = self.client.query_points(
                self.collection, query=row.tolist(), limit=self.k + (skip >= 0),
                search_params=self.params, with_payload=True,
            ).points  # fmt: skip
            kept = [p for p in found if int(p.id) != skip][: self.k]
            out.append(
                [
                    Hit(
                        names[i],
                        rank,
                        int(p.id),
                        str(p.payload["path"]),
                        str(p.payload["label"]),
                        float(p.score),
                    )  # fmt: skip
                    for rank, p in enumerate(kept, start=1)
                ]
            )
        return out

    def close(self) -> None:
        self.client.close()


def tuned_search(client: Any, collection: str, remote: bool) -> tuple[dict[str, Any] | None, Any]:
    """(the tuned record in the collection's metadata or None, the SearchParams to send): local
    mode always compares every point (and warns when asked otherwise), so it is sent none; a
    server is told the tuned search, else to search exactly."""
    from qdrant_client import models

    metadata = client.get_collection(collection).config.metadata or {}
    tuned: dict[str, Any] | None = metadata.get(METADATA_KEY)
    if not remote:
        return tuned, None
    return tuned, search_params(tuned) or models.SearchParams(exact=True)


def searched_as(tuned: dict[str, Any] | None, remote: bool) -> str:
    """How a collection is searched, in words (for stderr)."""
    if not remote:
        return "Qdrant's local mode compares every point: an exact search"
    return tuned_words(tuned)


def collection_points(client: Any, collection: str, batch: int = 1_024) -> tuple[Any, Any]:
    """(ids int64, vectors float32 (n, d)) of every point of `collection`, in id order, read
    `batch` points a request (all of them in memory: n x d floats)."""
    ids: list[int] = []
    rows: list[list[float]] = []
    offset = None
    while True:
        points, offset = client.scroll(
            collection, limit=batch, offset=offset, with_payload=False, with_vectors=True
        )
        ids += [int(p.id) for p in points]
        rows += [p.vector for p in points]
        if offset is None:
            break
    if not ids:
        raise PactlError(f"Qdrant collection {collection!r} holds no points")
    return np.asarray(ids, dtype=np.int64), np.asarray(rows, dtype=np.float32)


def eval_collection(target: str, collection: str, reporter: Reporter = QUIET) -> dict[str, float]:
    """`pactl eval --qdrant`: Recall@10 of `collection`'s search as `pactl query --qdrant`
    searches it (the tuned hnsw_ef and oversampling of its metadata) against pactl's exact
    neighbours over the vectors the collection holds, and its ms a query
    (pactl.interop.qdrant_tuning.measure_search)."""
    from pactl.interop.qdrant_tuning import measure_search

    client = connect(target)
    try:
        if not client.collection_exists(collection):
            raise PactlError(f"{target} has no Qdrant collection {collection!r}")
        remote = is_remote(target)
        tuned, params = tuned_search(client, collection, remote)
        reporter.log(searched_as(tuned, remote))
        ids, vectors = collection_points(client, collection)
        reporter.log(f"measuring Qdrant's search of {collection!r} ({len(ids):,} points)")
        return measure_search(client, collection, vectors, ids, params, np.random.default_rng(0))
    finally:
        client.close()
