"""A bundle of another tool's vectors (the clip-retrieval layout, no pactl meta.json), as
docs/cli.md promises it: it records no network, so `pactl query` cannot embed images for it,
and its vectors are searched with the Python API's Index.search (and `pactl query --vectors`).
Every search is checked against float64 brute force and against a bundle of the same vectors
written as pactl's own embed writes them."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import one_error, run_cli, unit
from test_api import tiny_run

pytest.importorskip("pyarrow")

ROWS, DIM, K = 300, 16, 5


def clip_folder(root: Path, vectors: np.ndarray, shards: int = 3) -> Path:
    """The layout as clip-retrieval writes it: unpadded shard numbers, `image_path`, a column
    pactl does not read, no meta.json."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "embeddings").mkdir(parents=True)
    (root / "metadata").mkdir()
    for k, rows in enumerate(np.array_split(np.arange(len(vectors)), shards)):
        np.save(root / "embeddings" / f"img_emb_{k}.npy", vectors[rows])
        paths = [f"/data/{i}.jpg" for i in rows]
        table = pa.table({"image_path": paths, "caption": ["a photo"] * len(rows)})
        pq.write_table(table, root / "metadata" / f"metadata_{k}.parquet")
    return root


def pactl_folder(root: Path, vectors: np.ndarray, checkpoint: Path) -> Path:
    """The same vectors as a vectors folder that `pactl embed` writes with `checkpoint`'s
    network: its writer's items.csv and meta.json (the vectors themselves given, not made)."""
    from pactl.checkpoint import open_network
    from pactl.embed.writing import vectors_meta
    from pactl.store.csv_cells import write_rows
    from pactl.store.vectors_folder import ITEMS_COLUMNS

    _, network = open_network(checkpoint)
    root.mkdir()
    np.save(root / "vectors.npy", vectors)
    rows = [(i, f"/data/{i}.jpg", "", -1, -1) for i in range(len(vectors))]
    write_rows(root / "items.csv", ITEMS_COLUMNS, rows)
    meta = vectors_meta(
        network, len(vectors), embedded=len(vectors), reused=0, resumed=0, skipped=0
    )
    (root / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return root


@pytest.fixture
def bundles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> dict[str, Any]:
    """`pactl index` of the clip-retrieval folder (`foreign`) and of a pactl vectors folder of
    the same vectors (`own`), and the vectors."""
    rng = np.random.default_rng(50)
    vectors = unit(rng.standard_normal((ROWS, DIM))).astype(np.float32)
    checkpoint = tiny_run(tmp_path)  # a TINY network of dimension 16
    clip_folder(tmp_path / "clip", vectors)
    pactl_folder(tmp_path / "vec", vectors, checkpoint)
    for folder, out in (("clip", "foreign"), ("vec", "own")):
        code, _, err = run_cli(["index", folder, "--out", out, "--quiet"], monkeypatch, capsys)
        assert code == 0, err
    queries = unit(rng.standard_normal((7, DIM))).astype(np.float32)
    return {
        "foreign": tmp_path / "foreign",
        "own": tmp_path / "own",
        "vectors": vectors,
        "queries": queries,
        "checkpoint": checkpoint,
        "photos": sorted((tmp_path / "photos").rglob("*.png"))[:3],
    }


def brute_force(vectors: np.ndarray, queries: np.ndarray, k: int) -> list[list[int]]:
    """The top-k ids by float64 cosine, ties to the lower id."""
    scores = queries.astype(np.float64) @ vectors.astype(np.float64).T
    return [sorted(range(len(row)), key=lambda i: (-row[i], i))[:k] for row in scores]


def rows_of(found: list[list[Any]]) -> list[list[tuple[int, str, float]]]:
    return [[(h.id, h.path, round(h.score, 5)) for h in row] for row in found]


def test_a_bundle_of_another_tools_vectors_opens_and_index_search_is_exact(
    bundles: dict[str, Any],
) -> None:
    import pactl

    index = pactl.open_index(bundles["foreign"])
    assert len(index) == ROWS and index.dimension == DIM
    found = index.search(bundles["queries"], k=K)
    assert [[h.id for h in row] for row in found] == brute_force(
        bundles["vectors"], bundles["queries"], K
    )
    assert [h.path for h in found[0]] == [f"/data/{h.id}.jpg" for h in found[0]]
    expected = bundles["queries"][0].astype(np.float64) @ bundles["vectors"][found[0][0].id]
    assert found[0][0].score == pytest.approx(expected, abs=1e-5)


def test_index_search_answers_as_a_bundle_of_the_same_vectors_from_pactl_embed(
    bundles: dict[str, Any],
) -> None:
    import pactl

    foreign = pactl.open_index(bundles["foreign"])
    own = pactl.open_index(bundles["own"])  # loads its network: its fingerprint is recorded
    assert own.meta["fingerprint"] and foreign.meta["fingerprint"] is None
    queries = bundles["queries"]
    assert rows_of(foreign.search(queries, k=K)) == rows_of(own.search(queries, k=K))


def test_index_query_of_images_refuses_in_one_line_naming_what_to_pass(
    bundles: dict[str, Any],
) -> None:
    import pactl
    from pactl.errors import PactlError

    index = pactl.open_index(bundles["foreign"])
    for call in (
        lambda: index.query(bundles["photos"][0]),
        lambda: index.vectors_of([np.zeros((16, 16, 3), np.uint8)]),
        lambda: index.model,
    ):
        with pytest.raises(PactlError) as caught:
            call()
        line = str(caught.value)
        assert "\n" not in line and "records no network" in line
        assert "checkpoint or backbone that made its vectors" in line and "Index.search" in line


def test_a_checkpoint_given_for_it_embeds_queries_as_the_bundle_of_its_own_vectors(
    bundles: dict[str, Any], tmp_path: Path
) -> None:
    import pactl
    from pactl.config import ModelConfig
    from pactl.errors import PactlError

    own = pactl.open_index(bundles["own"])
    foreign = pactl.open_index(bundles["foreign"], checkpoint=bundles["checkpoint"])
    photos = bundles["photos"]
    assert rows_of(foreign.query(photos, k=K)) == rows_of(own.query(photos, k=K))
    wider = ModelConfig(backbone="small", weights="none", embedding_dim=32, image_size=16)
    with pytest.raises(PactlError, match="makes 32-dimensional vectors, .* holds 16"):
        pactl.open_index(bundles["foreign"], checkpoint=wider)


def test_pactl_query_of_images_says_it_cannot_embed_them_and_what_can(
    bundles: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    photo = str(bundles["photos"][0])
    code, out, err = run_cli(["query", photo, "--index", "foreign"], monkeypatch, capsys)
    line = one_error(err)
    assert code == 1 and out == ""
    assert "records no network" in line and "`pactl query` cannot embed images" in line
    assert "--checkpoint" in line and "--vectors FILE.npy" in line


def test_pactl_serve_says_it_cannot_embed_images_and_what_can(
    bundles: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    pytest.importorskip("fastapi")
    args = ["serve", "foreign", "--port", "0", "--quiet"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    line = one_error(err)
    assert code == 1 and out == ""
    assert "records no network" in line and "`pactl serve` cannot embed images" in line
    assert "pactl query --index foreign --vectors FILE.npy" in line


def test_index_add_to_it_says_it_cannot_embed_images_and_what_can(
    bundles: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    args = ["index", "photos", "--add", "foreign", "--quiet"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    line = one_error(err)
    assert code == 1 and "records no network" in line and "pactl index FOLDER --out" in line


def same_rows(out: str, found: list[list[Any]]) -> bool:
    """Whether JSON Lines (scores written to 6 places) hold the hits of `found`, in order."""
    rows: dict[str, list[tuple[int, str, float]]] = {}
    for text in out.splitlines():
        row = json.loads(text)
        rows.setdefault(row["query"], []).append((row["id"], row["path"], row["score"]))
    written = [rows[name] for name in sorted(rows, key=int)]
    expected = [[(h.id, h.path, h.score) for h in row] for row in found]
    ids = [[(i, path) for i, path, _ in row] for row in written]
    scores = np.array([[score for *_, score in row] for row in written])
    return ids == [[(i, path) for i, path, _ in row] for row in expected] and np.allclose(
        scores, [[score for *_, score in row] for row in expected], atol=1e-6
    )


def test_pactl_query_answers_vectors_from_a_npy_file_as_index_search(
    bundles: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    import pactl

    np.save(tmp_path / "q.npy", bundles["queries"] * 3)  # any length: a cosine's direction
    expected = pactl.open_index(bundles["foreign"]).search(bundles["queries"], k=K)
    for bundle in ("foreign", "own"):
        args = ["query", "--vectors", "q.npy", "--index", bundle, "--k", str(K), "-f", "jsonl"]
        code, out, err = run_cli(args, monkeypatch, capsys)
        assert code == 0, err
        assert same_rows(out, expected)


def test_pactl_query_answers_vectors_on_stdin(
    bundles: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    import pactl

    buffer = io.BytesIO()
    np.save(buffer, bundles["queries"][:2].astype(np.float64))  # any float dtype
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(buffer.getvalue())))
    args = ["query", "--vectors", "-", "--index", "foreign", "--k", "3", "-f", "jsonl"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    index = pactl.open_index(bundles["foreign"])
    assert same_rows(out, index.search(bundles["queries"][:2], k=3))


@pytest.mark.parametrize(
    "array, words",
    [
        (np.zeros((2, DIM), np.float32), "query vector 0 is all zeros"),
        (unit(np.ones((2, 8))).astype(np.float32), "must be (N, 16), not (2, 8)"),
        (np.full((1, DIM), np.nan, np.float32), "query vector 0 holds NaN or Inf"),
        (np.zeros((0, DIM), np.float32), "no query vectors"),
        (b"not a npy file", "is not a .npy array"),
    ],
)
def test_pactl_query_refuses_vectors_it_cannot_search_in_one_line(
    bundles: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
    array: Any,
    words: str,
) -> None:
    if isinstance(array, bytes):
        (tmp_path / "q.npy").write_bytes(array)
    else:
        np.save(tmp_path / "q.npy", array)
    code, out, err = run_cli(
        ["query", "--vectors", "q.npy", "--index", "foreign"], monkeypatch, capsys
    )
    assert code in (1, 2) and out == "" and words in one_error(err)


def test_pactl_query_vectors_refuse_what_belongs_to_images(
    bundles: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    np.save(tmp_path / "q.npy", bundles["queries"])
    vectors = ["query", "--vectors", "q.npy", "--index", "foreign"]
    for extra, named in [
        (["x.png"], "drop IMAGES"),
        (["--exclude-self"], "drop --exclude-self"),
        (["--grid", "g.png"], "drop --grid"),
        (["--checkpoint", str(bundles["checkpoint"])], "drop --checkpoint"),
    ]:
        code, _, err = run_cli([*vectors, *extra], monkeypatch, capsys)
        assert code == 2 and named in one_error(err)
    code, _, err = run_cli(["query", "--index", "foreign"], monkeypatch, capsys)
    assert code == 2 and "give query images" in one_error(err) and "--vectors" in err
