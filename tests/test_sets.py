"""Bundle sets (`pactl index VECTORS --keep-shards`): shard bundles of one trained index,
answered as one bundle over the same items would answer (ids and scores equal), and refused in
one line when their shards were trained apart, are missing or damaged, differ in dimension or
metric, or overlap."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest
from conftest import clustered, one_error, run_cli, unit

import pactl
from pactl.config import IndexConfig
from pactl.console import QUIET
from pactl.errors import PactlError
from pactl.index import (
    Bundle,
    ItemTable,
    exact_neighbours,
    load_bundle,
    load_bundle_or_set,
    save_bundle,
)
from pactl.index.rescoring import RescoredIndex
from pactl.index.search import hits, search
from pactl.store import checksums
from pactl.store.generations import current_dir
from pactl.verbs.index import index_set

DIM, PER_SHARD, SHARDS, K = 16, 600, 3, 10


def write_vectors(folder: Path, vectors: np.ndarray, ids: np.ndarray) -> None:
    """One vectors folder as `pactl embed` writes it (of another tool's network: none named)."""
    folder.mkdir(parents=True)
    np.save(folder / "vectors.npy", vectors)
    rows = [f"{i},/photos/{i}.png,c{i % 7},0,0" for i in ids.tolist()]
    (folder / "items.csv").write_text("id,path,label,size,mtime_ns\n" + "\n".join(rows) + "\n")
    meta = {"format": "pactl.vectors", "version": 1, "dimension": vectors.shape[1]}
    meta |= {"count": len(vectors), "metric": "ip", "fingerprint": "f" * 64, "model_config": {}}
    (folder / "meta.json").write_text(json.dumps({**meta, "checkpoint": None}))


def sharded_vectors(root: Path, seed: int = 1, dim: int = DIM, overlap: int = 0) -> np.ndarray:
    """root/shards/<i>-of-<n>/: SHARDS shards of clustered unit vectors, ids 0..n-1 in order
    (`overlap`: the first ids of each shard after the first repeat the previous one's last)."""
    rng = np.random.default_rng(seed)
    vectors = clustered(rng, SHARDS * PER_SHARD, unit(rng.standard_normal((30, dim))))
    for i in range(SHARDS):
        ids = np.arange(i * PER_SHARD, (i + 1) * PER_SHARD)
        ids[:overlap] -= overlap if i else 0
        rows = slice(i * PER_SHARD, (i + 1) * PER_SHARD)
        write_vectors(root / "shards" / f"{i:05d}-of-{SHARDS:05d}", vectors[rows], ids)
    return vectors


def one_bundle(set_dir: Path, vectors: np.ndarray) -> Bundle:
    """The reference: one index over all the set's items, filled from a copy of the trained
    index the set's shards share (a shard's, emptied), searched with the set's setting and
    rescoring depth, its floats in memory."""
    shard = load_bundle(set_dir / "shards" / f"00000-of-{SHARDS:05d}", mmap=False)
    codes = shard.index.index if isinstance(shard.index, RescoredIndex) else shard.index
    index = faiss.clone_index(codes)
    index.reset()
    index.add_with_ids(vectors, np.arange(len(vectors)))
    meta = json.loads((set_dir / "meta.json").read_text())
    faiss.ParameterSpace().set_index_parameters(index, meta["search_params"])
    rows = [(i, f"/photos/{i}.png", f"c{i % 7}") for i in range(len(vectors))]
    items = ItemTable.from_rows(rows)
    if meta.get("rescore"):
        index = RescoredIndex(index, vectors, items.positions, meta["rescore"])
    return Bundle(set_dir, index, items, meta)


@pytest.fixture(scope="module")
def ivf_set(tmp_path_factory: pytest.TempPathFactory, faiss_one_thread: None) -> Any:
    root = tmp_path_factory.mktemp("ivf-set")
    vectors = sharded_vectors(root / "vectors")
    config = IndexConfig(factory="IVF16,Flat")
    index_set(root / "vectors", root / "set", config, QUIET)
    return root, vectors


def queries_of(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Items as queries, each its own hit left out, and new vectors near them."""
    rng = np.random.default_rng(7)
    own = rng.choice(len(vectors), 60, replace=False)
    near = unit(vectors[own] + 0.3 * rng.standard_normal(vectors[own].shape)).astype(np.float32)
    return np.concatenate([vectors[own], near]), np.concatenate([own, np.full(60, -1)])


@pytest.mark.parametrize("rescore", [None, 4])
def test_an_ivf_flat_set_answers_exactly_as_one_bundle(ivf_set: Any, rescore: Any) -> None:
    root, vectors = ivf_set
    meta = json.loads((root / "set" / "meta.json").read_text())
    assert meta["format"] == "pactl.bundle_set" and meta["count"] == len(vectors)
    nprobe = int(meta["search_params"].split("=")[1].split(",")[0])
    assert 1 <= nprobe < 16  # approximate: a shard probing other lists would answer otherwise
    whole = load_bundle_or_set(root / "set")
    reference = one_bundle(root / "set", vectors)
    queries, own = queries_of(vectors)
    if rescore is not None:  # a float set has nothing to rescore, as a float bundle
        with pytest.raises(PactlError, match="--rescore is for bundles of lossy codes"):
            search(whole, queries, K, own, rescore=rescore)
        return
    got, want = search(whole, queries, K, own), search(reference, queries, K, own)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    named = hits(whole, [str(i) for i in range(len(queries))], *got)
    assert [h.path for h in named[0]] == [f"/photos/{i}.png" for i in want[1][0]]


def test_a_rescored_set_answers_exactly_as_one_rescored_bundle(
    tmp_path: Path, faiss_one_thread: None
) -> None:
    vectors = sharded_vectors(tmp_path / "vectors", seed=2)
    index_set(tmp_path / "vectors", tmp_path / "set", IndexConfig(factory="IVF16,SQ4"), QUIET)
    meta = json.loads((tmp_path / "set" / "meta.json").read_text())
    assert meta["rescore"] >= 1
    whole = load_bundle_or_set(tmp_path / "set")
    reference = one_bundle(tmp_path / "set", vectors)
    queries, own = queries_of(vectors)
    for depth in (None, 1, 5):  # the set's own depth, and others asked for
        got = search(whole, queries, K, own, rescore=depth)
        want = search(reference, queries, K, own, rescore=depth)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])


def test_the_set_is_tuned_once_on_the_union(ivf_set: Any) -> None:
    """Its setting is measured over all items (1,000 tuning queries, more than a shard holds),
    every shard records it, and the recall it records is what the set gives against brute
    force (float64) at that setting."""
    root, vectors = ivf_set
    meta = json.loads((root / "set" / "meta.json").read_text())
    assert meta["tuning_queries"] == 1000 > PER_SHARD and meta["target_reached"]
    for entry in meta["shards"]:
        shard = json.loads((root / "set" / entry["folder"] / "meta.json").read_text())
        assert shard["search_params"] == meta["search_params"]
        assert shard["trained_digest"] == meta["trained_digest"]
    whole = load_bundle_or_set(root / "set")
    own = np.arange(len(vectors))
    _, found = search(whole, vectors, K, own)
    x = vectors.astype(np.float64)
    scores = x @ x.T
    np.fill_diagonal(scores, -np.inf)
    truth = np.argsort(-scores, axis=1)[:, :K]
    recall = np.mean([len(set(f) & set(t)) / K for f, t in zip(found, truth, strict=True)])
    assert recall >= meta["target_recall"] - 0.02
    exact = exact_neighbours([(vectors, own)], vectors[:50], own[:50], K)
    np.testing.assert_array_equal(np.sort(exact, axis=1), np.sort(truth[:50], axis=1))


def test_query_prints_for_a_set_what_it_prints_for_the_bundle_of_its_items(
    ivf_set: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """`pactl index VECTORS` (one bundle: the same seeded training sample, so the same
    trained index, and the same tuning) prints what the set prints."""
    root, vectors = ivf_set
    code, _, err = run_cli(
        ["index", str(root / "vectors"), "--out", str(tmp_path / "one"), "--factory", "IVF16,Flat"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    np.save(tmp_path / "q.npy", queries_of(vectors)[0])
    printed = {}
    for name, folder in (("set", root / "set"), ("one", tmp_path / "one")):
        args = ["query", "--vectors", str(tmp_path / "q.npy"), "--index", str(folder)]
        code, printed[name], err = run_cli([*args, "--format", "csv"], monkeypatch, capsys)
        assert code == 0, err
    assert printed["set"] == printed["one"] and len(printed["set"].splitlines()) == 1 + 120 * 4


def test_the_api_searches_a_set_as_the_bundle_of_its_items(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """Another tool's vectors (the clip-retrieval layout: its shards, no network recorded):
    Index.search of their set gives the hits of their one bundle, paths and scores alike."""
    pytest.importorskip("pyarrow")
    from test_foreign_bundle import clip_folder

    rng = np.random.default_rng(4)
    vectors = clustered(rng, 900, unit(rng.standard_normal((20, DIM))))
    clip_folder(tmp_path / "clip", vectors)
    for out, keep in (("set", ["--keep-shards"]), ("one", [])):
        args = ["index", str(tmp_path / "clip"), "--out", str(tmp_path / out), *keep]
        code, _, err = run_cli([*args, "--factory", "IVF8,Flat"], monkeypatch, capsys)
        assert code == 0, err
    whole = pactl.open_index(tmp_path / "set")
    assert len(whole.bundle.meta["shards"]) == 3 and len(whole) == 900
    found = whole.search(vectors[:40], k=5)
    want = pactl.open_index(tmp_path / "one").search(vectors[:40], k=5)
    assert [[(h.id, h.path, h.score) for h in row] for row in found] == [
        [(h.id, h.path, h.score) for h in row] for row in want
    ]


def test_the_cli_builds_a_set_per_n_items_and_verifies_it(
    ivf_set: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    root, _ = ivf_set
    args = ["index", str(root / "vectors"), "--out", str(tmp_path / "set"), "--factory", "Flat"]
    code, out, err = run_cli([*args, "--shard-items", "250"], monkeypatch, capsys)
    assert code == 0, err
    assert "1,800 items (Flat)" in out and "9 shard bundles" in out  # 600 = 250 + 250 + 100
    code, out, err = run_cli(["index", "--verify", str(tmp_path / "set")], monkeypatch, capsys)
    assert code == 0 and "verified" in out, err
    # a set is changed by a rebuild, never in place
    code, _, err = run_cli(["index", str(tmp_path / "set"), "--delete", "3"], monkeypatch, capsys)
    assert code != 0 and "is a bundle set" in one_error(err)


def refused(folder: Path, monkeypatch: Any, capsys: Any, tmp_path: Path) -> str:
    """`pactl query --vectors` on `folder`: its one error line (non-zero exit)."""
    np.save(tmp_path / "q.npy", np.eye(1, DIM, dtype=np.float32))
    args = ["query", "--vectors", str(tmp_path / "q.npy"), "--index", str(folder)]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code != 0 and out == ""
    return one_error(err)


@pytest.fixture
def copied_set(ivf_set: Any, tmp_path: Path) -> Path:
    shutil.copytree(ivf_set[0] / "set", tmp_path / "set", symlinks=True)
    return tmp_path / "set"


SHARD_1 = f"shards/00001-of-{SHARDS:05d}"


def replace_shard(set_dir: Path, other: Path) -> None:
    shutil.rmtree(set_dir / SHARD_1)
    shutil.copytree(other, set_dir / SHARD_1, symlinks=True)


def test_a_shard_trained_apart_is_refused(
    copied_set: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    sharded_vectors(tmp_path / "other", seed=5)
    index_set(tmp_path / "other", tmp_path / "other-set", IndexConfig(factory="IVF16,Flat"), QUIET)
    replace_shard(copied_set, tmp_path / "other-set" / SHARD_1)
    assert "was trained apart" in refused(copied_set, monkeypatch, capsys, tmp_path)


def test_a_shard_of_another_dimension_or_metric_is_refused(
    copied_set: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    sharded_vectors(tmp_path / "narrow", dim=8)
    index_set(tmp_path / "narrow", tmp_path / "narrow-set", IndexConfig(factory="Flat"), QUIET)
    replace_shard(copied_set, tmp_path / "narrow-set" / SHARD_1)
    line = refused(copied_set, monkeypatch, capsys, tmp_path)
    assert "dimension 8" in line and "different dimension or metric" in line
    l2 = faiss.IndexIDMap2(faiss.IndexFlatL2(DIM))
    l2.add_with_ids(unit(np.ones((2, DIM))).astype(np.float32), np.array([600, 601]))
    shutil.rmtree(copied_set / SHARD_1)
    save_bundle(copied_set / SHARD_1, l2, [(600, "a", ""), (601, "b", "")], {})
    line = refused(copied_set, monkeypatch, capsys, tmp_path)
    assert "metric l2" in line and "different dimension or metric" in line


def test_a_missing_or_damaged_shard_is_refused(
    copied_set: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    index_file = current_dir(copied_set / SHARD_1) / "index.faiss"
    index_file.write_bytes(index_file.read_bytes()[:100])
    line = refused(copied_set, monkeypatch, capsys, tmp_path)
    assert f"shard bundle {SHARD_1} is damaged" in line and "index.faiss" in line
    shutil.rmtree(copied_set / SHARD_1)
    line = refused(copied_set, monkeypatch, capsys, tmp_path)
    assert f"shard bundle {SHARD_1} is missing" in line


def test_overlapping_shards_are_refused(
    copied_set: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """Vectors shards that share items make no set (nothing is written); a set that names one
    shard twice (its record sealed again, as a careless writer would) is refused on loading."""
    sharded_vectors(tmp_path / "overlapping", overlap=3)
    out = tmp_path / "never"
    args = ["index", str(tmp_path / "overlapping"), "--keep-shards", "--out", str(out)]
    code, _, err = run_cli([*args, "--factory", "Flat"], monkeypatch, capsys)
    assert code != 0 and "shards overlap: id 597 is in shard 0 and shard 1" in one_error(err)
    assert not out.exists() and not list(tmp_path.glob(".pactl-new-*"))
    gen = current_dir(copied_set)
    meta = json.loads((gen / "meta.json").read_text())
    meta["shards"][1] = meta["shards"][0]
    del meta["checksums"]["meta"]
    (gen / "meta.json").write_text(json.dumps(checksums.seal(meta)))
    assert "its shards overlap (item id 0 is in two)" in refused(
        copied_set, monkeypatch, capsys, tmp_path
    )
    meta["search_params"] = "nprobe=16"  # edited without sealing it again
    (gen / "meta.json").write_text(json.dumps(meta))
    assert "damaged or was edited" in refused(copied_set, monkeypatch, capsys, tmp_path)


SET_FIX = "rebuild the set with `pactl index VECTORS --keep-shards`"


def test_a_shard_damaged_in_place_is_refused_with_the_sets_advice(
    copied_set: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """A byte of a shard's index.faiss changed, its size kept: `pactl index --verify SET` names
    the shard in one line and says to rebuild the set (a shard rebuilt alone would be trained
    apart from the others)."""
    index_file = current_dir(copied_set / SHARD_1) / "index.faiss"
    data = bytearray(index_file.read_bytes())
    data[-8] ^= 0xFF
    index_file.write_bytes(bytes(data))
    code, out, err = run_cli(["index", "--verify", str(copied_set)], monkeypatch, capsys)
    line = one_error(err)
    assert code != 0 and out == ""
    assert f"shard bundle {SHARD_1} is damaged" in line and "checksum" in line, line
    assert line.endswith(SET_FIX) and "rebuild the bundle" not in line, line


def test_a_shard_changed_after_the_set_was_written_is_refused(
    copied_set: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """pactl changes no shard bundle alone: --delete, --compact and --add on one say to rebuild
    the set, and the set answers on. A shard changed anyway (its meta.json sealed again with
    another setting, as another writer might) makes the set refuse to answer, in one line."""
    shard = str(copied_set / SHARD_1)
    np.save(tmp_path / "q.npy", np.eye(1, DIM, dtype=np.float32))
    query = ["query", "--vectors", str(tmp_path / "q.npy"), "--index", str(copied_set)]
    before = run_cli(query, monkeypatch, capsys)
    assert before[0] == 0, before[2]
    (tmp_path / "new").mkdir()
    for args in (["--delete", "700"], ["--compact"], [str(tmp_path / "new"), "--add"]):
        code, out, err = run_cli(["index", *args, shard], monkeypatch, capsys)
        assert code != 0 and out == ""
        line = one_error(err)
        assert "is a shard bundle of a bundle set" in line and SET_FIX in line, line
    assert run_cli(query, monkeypatch, capsys) == before
    gen = current_dir(copied_set / SHARD_1)
    meta = json.loads((gen / "meta.json").read_text())
    meta["search_params"] = "nprobe=16"
    del meta["checksums"]["meta"]
    (gen / "meta.json").write_text(json.dumps(checksums.seal(meta)))
    line = refused(copied_set, monkeypatch, capsys, tmp_path)
    assert f"shard bundle {SHARD_1} changed since the set was made" in line and SET_FIX in line


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--engine", "ray"], "none writes a shard bundle; build the set here"),
        (["--compact"], "--compact does not go with --keep-shards"),
        (["--factory", "HNSW32"], "an HNSW graph is built anew per shard"),
        (["--binary"], "a bundle set holds float bundles"),
        (["--on-disk", "yes"], "a set keeps one per shard"),
    ],
)
def test_what_a_set_is_not_built_with_is_one_line(
    ivf_set: Any, tmp_path: Path, monkeypatch: Any, capsys: Any, extra: list[str], said: str
) -> None:
    root, _ = ivf_set
    out = tmp_path / "never"
    args = ["index", str(root / "vectors"), "--keep-shards", "--out", str(out), *extra]
    code, printed, err = run_cli(args, monkeypatch, capsys)
    assert code != 0 and printed == "" and said in one_error(err)
    assert not out.exists()
