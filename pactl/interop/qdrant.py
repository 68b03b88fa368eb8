"""A bundle (or a vectors folder) handed to a Qdrant collection, and searched there.

Points are the items: the pactl id as the point id, the vector, and a payload of `id`, `path`
and `label`. The collection uses the dot product, which on pactl's unit vectors is the cosine
similarity FAISS's inner-product bundles score, so an exact search there returns the bundle's
hits with the same scores. Writing goes in batches, and each batch first asks which of its ids
the collection holds already: an export stopped half-way, run again, writes only the rest.

The target is a URL (`http://host:6333`, a Qdrant server) or a folder: qdrant-client's local
mode keeps the collection there, with no server (for trials and tests; it is not meant for
more than some tens of thousands of points).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pactl.config import QdrantConfig
from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.interop import require
from pactl.results import Hit

EXTRA = ("qdrant", "qdrant_client")  # extra, module
DISTANCE = "Dot"  # Qdrant's name for the inner product


def connect(target: str) -> Any:
    """A QdrantClient for a server's URL, or for a local-mode folder (made if missing)."""
    require("Qdrant", *EXTRA)
    from qdrant_client import QdrantClient

    if target.startswith(("http://", "https://")):
        return QdrantClient(url=target)
    folder = Path(target)
    if folder.exists() and not folder.is_dir():
        raise PactlError(f"{target} is neither a URL (http://...) nor a folder for Qdrant")
    return QdrantClient(path=str(folder))


def ensure_collection(client: Any, name: str, dimension: int) -> bool:
    """Make collection `name` for `dimension`-d dot-product vectors, or check the one there;
    returns whether it was made. One of another dimension or metric is refused."""
    from qdrant_client import models

    if not client.collection_exists(name):
        params = models.VectorParams(size=dimension, distance=models.Distance.DOT)
        client.create_collection(name, vectors_config=params)
        return True
    vectors = client.get_collection(name).config.params.vectors
    if not isinstance(vectors, models.VectorParams):
        raise PactlError(f"Qdrant collection {name!r} has named vectors; pactl writes one vector")
    have = (int(vectors.size), str(getattr(vectors.distance, "value", vectors.distance)))
    if have != (dimension, DISTANCE):
        raise PactlError(
            f"Qdrant collection {name!r} holds {have[0]}-d vectors by {have[1]}; these are "
            f"{dimension}-d by {DISTANCE}: give another --collection"
        )
    return False


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
) -> dict[str, int]:
    """Write the items as points of `config.collection` at `target`, skipping ids already
    there; returns {"written", "skipped", "count"} (count: the collection's points)."""
    from qdrant_client import models

    client = connect(target)
    try:
        ensure_collection(client, config.collection, int(vectors.shape[1]))
        written = skipped = 0
        with reporter.bar("exporting", total=len(items)) as advance:
            for start in range(0, len(items), config.batch_size):
                stop = min(start + config.batch_size, len(items))
                ids = items.ids[start:stop].tolist()
                there = {p.id for p in client.retrieve(config.collection, ids, with_payload=False)}
                points = [
                    models.PointStruct(
                        id=i,
                        vector=np.asarray(vectors[start + at], dtype=np.float32).tolist(),
                        payload={
                            "id": i,
                            "path": items.paths[start + at],
                            "label": items.labels[start + at],
                        },
                    )  # fmt: skip
                    for at, i in enumerate(ids)
                    if i not in there
                ]
                if points:
                    client.upsert(config.collection, points=points, wait=True)
                written, skipped = written + len(points), skipped + len(there)
                advance(stop - start)
        count = int(client.count(config.collection, exact=True).count)
    finally:
        client.close()
    return {"written": written, "skipped": skipped, "count": count}


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
        # local mode always compares every point (and warns when asked to); a server is told
        remote = target.startswith(("http://", "https://"))
        self.params = _exact() if remote else None

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


def _exact() -> Any:
    from qdrant_client import models

    return models.SearchParams(exact=True)
