"""A bundle handed to Qdrant (qdrant-client's local mode in a folder: no server, no network):
the same top-k as the FAISS bundle on exact search, resumable, and a collection of another
dimension or metric refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from test_api import tiny_run

from pactl.console import QUIET


def counts(done: dict[str, Any]) -> dict[str, int]:
    """An export's counts (its tuned search aside: tests/test_qdrant_tuning.py)."""
    return {key: done[key] for key in ("written", "skipped", "count")}


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    import pactl

    pactl.embed_folder(tmp_path / "photos", model=tiny_run(tmp_path), out=tmp_path / "vectors")
    return pactl.build_index(tmp_path / "vectors", out=tmp_path / "bundle", factory="Flat")


def test_exact_search_in_qdrant_gives_the_bundles_top_k(bundle: Path, tmp_path: Path) -> None:
    import pactl
    from pactl.config import QdrantConfig
    from pactl.interop.qdrant import QdrantSearch
    from pactl.verbs.export import export_qdrant

    done = export_qdrant(bundle, str(tmp_path / "qd"), QdrantConfig(), QUIET)
    assert counts(done) == {"written": 16, "skipped": 0, "count": 16}
    index = pactl.open_index(bundle)
    files = sorted((tmp_path / "photos").rglob("*.png"))[:5]
    queries = index.vectors_of([Image.open(p) for p in files])
    want = [[(h.id, h.path, h.label, h.score) for h in row] for row in index.search(queries, k=6)]
    found = QdrantSearch(str(tmp_path / "qd"), "pactl", 16, k=6)
    got = [[(h.id, h.path, h.label, h.score) for h in row] for row in found(["q"] * 5, queries)]
    found.close()
    assert [[r[:3] for r in row] for row in got] == [[r[:3] for r in row] for row in want]
    np.testing.assert_allclose([[r[3] for r in row] for row in got],
                               [[r[3] for r in row] for row in want], atol=1e-5)  # fmt: skip


def test_a_second_export_writes_only_what_is_missing(bundle: Path, tmp_path: Path) -> None:
    from pactl.config import QdrantConfig
    from pactl.index import load_bundle
    from pactl.interop.qdrant import bundle_vectors, export_vectors

    vectors, items = bundle_vectors(load_bundle(bundle))
    config = QdrantConfig(batch_size=4)
    first = export_vectors(vectors[:6], items.take(np.arange(16) < 6), str(tmp_path / "qd"), config)
    assert first["written"] == 6  # a stopped export: 6 of 16 points there
    again = export_vectors(vectors, items, str(tmp_path / "qd"), config)
    assert counts(again) == {"written": 10, "skipped": 6, "count": 16}


def test_deleted_items_are_not_exported(bundle: Path, tmp_path: Path) -> None:
    """Items deleted from the bundle are not in the collection `pactl export --to qdrant`
    writes: it holds the 14 live items, each with its own vector and payload."""
    import pactl
    from pactl.config import QdrantConfig
    from pactl.interop.qdrant import connect
    from pactl.verbs.export import export_qdrant

    index = pactl.open_index(bundle)
    index.delete(ids=[3, 7])
    kept = [i for i in range(16) if i not in (3, 7)]
    done = export_qdrant(bundle, str(tmp_path / "qd"), QdrantConfig(batch_size=5), QUIET)
    assert counts(done) == {"written": 14, "skipped": 0, "count": 14}
    client = connect(str(tmp_path / "qd"))
    try:
        points = client.retrieve("pactl", list(range(16)), with_payload=True, with_vectors=True)
    finally:
        client.close()
    assert sorted(int(p.id) for p in points) == kept
    table = pactl.read_vectors(tmp_path / "vectors")
    row = {int(i): r for r, i in enumerate(table.items.ids.tolist())}
    for p in points:
        assert p.payload == {
            "id": p.id,
            "path": table.items.paths[row[p.id]],
            "label": table.items.labels[row[p.id]],
        }
        np.testing.assert_allclose(p.vector, table.vectors[row[p.id]], atol=1e-6)


def test_a_compacted_ivf_bundle_exports_its_vectors(tmp_path: Path) -> None:
    """An IVF bundle compacted after a delete holds ids that are not 0..n-1: its vectors are
    still read back by id (a hash table, not an array) and exported exactly."""
    import pactl
    from pactl.config import QdrantConfig
    from pactl.interop.qdrant import connect
    from pactl.verbs.export import export_qdrant

    pactl.embed_folder(tmp_path / "photos", model=tiny_run(tmp_path), out=tmp_path / "vectors")
    bundle = pactl.build_index(tmp_path / "vectors", out=tmp_path / "b", factory="IVF2,Flat")
    index = pactl.open_index(bundle)
    index.delete(ids=[0, 9])
    index.compact()
    done = export_qdrant(bundle, str(tmp_path / "qd"), QdrantConfig(), QUIET)
    assert counts(done) == {"written": 14, "skipped": 0, "count": 14}
    client = connect(str(tmp_path / "qd"))
    try:
        points = client.retrieve("pactl", list(range(16)), with_vectors=True)
    finally:
        client.close()
    table = pactl.read_vectors(tmp_path / "vectors")
    row = {int(i): r for r, i in enumerate(table.items.ids.tolist())}
    assert sorted(int(p.id) for p in points) == [i for i in range(16) if i not in (0, 9)]
    for p in points:
        np.testing.assert_allclose(p.vector, table.vectors[row[int(p.id)]], atol=1e-6)


def test_a_collection_of_another_dimension_or_metric_is_refused(tmp_path: Path) -> None:
    from qdrant_client import models

    from pactl.errors import PactlError
    from pactl.interop.qdrant import connect, ensure_collection

    client = connect(str(tmp_path / "qd"))
    client.create_collection("cos", vectors_config=models.VectorParams(size=16, distance="Cosine"))
    assert ensure_collection(client, "new", 16) is True
    assert ensure_collection(client, "new", 16) is False
    with pytest.raises(PactlError, match=r"holds 16-d vectors by Dot; these are 32-d by Dot"):
        ensure_collection(client, "new", 32)
    with pytest.raises(PactlError, match=r"holds 16-d vectors by Cosine; these are 16-d by Dot"):
        ensure_collection(client, "cos", 16)
    client.close()
