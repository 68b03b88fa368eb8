"""Vectors in the clip-retrieval Parquet layout: written from a vectors folder, read back by
the index, from pactl or from another tool, and bad metadata refused in one line."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from conftest import unit
from test_api import tiny_run

from pactl.config import ParquetConfig


@pytest.fixture
def vectors(tmp_path: Path) -> Path:
    """A vectors folder of 16 images embedded by a tiny untrained network."""
    import pactl

    pactl.embed_folder(tmp_path / "photos", model=tiny_run(tmp_path), out=tmp_path / "vectors")
    return tmp_path / "vectors"


def test_round_trip_keeps_every_vector_and_column(vectors: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from pactl.interop.parquet import read_parquet, write_parquet
    from pactl.verbs.vector_sources import read_parts

    parts, meta = read_parts(vectors)
    write_parquet(parts, meta, tmp_path / "pq", config=ParquetConfig(5))
    shards = sorted((tmp_path / "pq" / "embeddings").glob("*.npy"))
    assert len(shards) == 4  # 16 rows, 5 a shard
    # The reference: items.csv and vectors.npy as written by embed, read by csv and numpy.
    with open(vectors / "items.csv", newline="") as f:
        expected = [(int(r["id"]), r["path"], r["label"], int(r["size"]), int(r["mtime_ns"]))
                    for r in csv.DictReader(f)]  # fmt: skip
    tables = sorted((tmp_path / "pq" / "metadata").glob("*.parquet"))
    rows = [tuple(r.values()) for t in tables for r in pq.read_table(t).to_pylist()]
    assert rows == expected
    stacked = np.concatenate([np.load(s) for s in shards])
    np.testing.assert_array_equal(stacked, np.load(vectors / "vectors.npy"))
    back, back_meta = read_parquet(tmp_path / "pq")
    np.testing.assert_array_equal(np.concatenate([v for v, _ in back]), stacked)
    assert back_meta["fingerprint"] == meta["fingerprint"] and back_meta["count"] == 16


def test_a_bundle_of_the_parquet_layout_answers_as_one_of_the_vectors(
    vectors: Path, tmp_path: Path
) -> None:
    import pactl
    from pactl.interop.parquet import write_parquet
    from pactl.verbs.vector_sources import read_parts

    write_parquet(*read_parts(vectors), tmp_path / "pq", config=ParquetConfig(7))
    a = pactl.open_index(pactl.build_index(vectors, out=tmp_path / "a", factory="Flat"))
    b = pactl.open_index(pactl.build_index(tmp_path / "pq", out=tmp_path / "b", factory="Flat"))
    queries = sorted((tmp_path / "photos").rglob("*.png"))[:4]
    got = [[(h.id, h.path, round(h.score, 6)) for h in row] for row in b.query(queries, k=5)]
    assert got == [
        [(h.id, h.path, round(h.score, 6)) for h in row] for row in a.query(queries, k=5)
    ]


def clip_retrieval_folder(root: Path, shards: int = 11, rows: int = 3, dim: int = 8) -> np.ndarray:
    """The layout as clip-retrieval writes it: unpadded shard numbers, image_path, no meta.json."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    (root / "embeddings").mkdir(parents=True)
    (root / "metadata").mkdir()
    out = []
    for k in range(shards):
        x = unit(rng.standard_normal((rows, dim))).astype(np.float32)
        np.save(root / "embeddings" / f"img_emb_{k}.npy", x)
        paths = [f"/data/{k}_{i}.jpg" for i in range(rows)]
        pq.write_table(pa.table({"image_path": paths, "caption": ["x"] * rows}),
                       root / "metadata" / f"metadata_{k}.parquet")  # fmt: skip
        out.append(x)
    return np.concatenate(out)


def test_another_tools_layout_is_indexed_in_shard_number_order(tmp_path: Path) -> None:
    from pactl.interop.parquet import read_parquet
    from pactl.verbs.vector_sources import gather_vectors

    expected = clip_retrieval_folder(tmp_path / "clip")
    parts, meta = read_parquet(tmp_path / "clip")
    assert parts[2][1].paths[0] == "/data/2_0.jpg" and parts[10][1].paths[0] == "/data/10_0.jpg"
    vectors, items, _ = gather_vectors(tmp_path / "clip")
    np.testing.assert_array_equal(vectors, expected)  # img_emb_2 before img_emb_10
    assert items.ids.tolist() == list(range(33)) and meta["fingerprint"] is None


def test_metadata_without_a_path_column_is_refused_in_one_line(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pactl.errors import PactlError
    from pactl.interop.parquet import read_parquet

    clip_retrieval_folder(tmp_path / "clip", shards=2)
    bad = tmp_path / "clip" / "metadata" / "metadata_1.parquet"
    pq.write_table(pa.table({"url": ["a", "b", "c"], "caption": ["x"] * 3}), bad)
    with pytest.raises(PactlError, match=r"metadata_1.parquet has no path column \(it has url, "):
        read_parquet(tmp_path / "clip")
    pq.write_table(pa.table({"path": ["a", "b"]}), bad)
    with pytest.raises(PactlError, match="has 2 rows for the 3 vectors"):
        read_parquet(tmp_path / "clip")


def test_vectors_that_are_not_unit_length_are_refused(tmp_path: Path) -> None:
    from pactl.errors import PactlError
    from pactl.interop.parquet import read_parquet

    clip_retrieval_folder(tmp_path / "clip", shards=1)
    np.save(tmp_path / "clip" / "embeddings" / "img_emb_0.npy", np.ones((3, 8), np.float32))
    with pytest.raises(PactlError, match="not L2-normalised"):
        read_parquet(tmp_path / "clip")
