"""IVF indexes built shard by shard with their lists merged on disk (index.ivfdata), checked
against the same index built in memory and against exact search done in numpy (float64)."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest
from conftest import clustered, make_class_folder, run_cli, train_tiny, unit

from pactl.config import IndexConfig
from pactl.console import QUIET
from pactl.errors import PactlError
from pactl.index import (
    BUNDLE_FILES,
    IVFDATA_FILE,
    MERGE_DIR,
    PENDING_IVFDATA,
    add_to_bundle,
    build_index,
    build_ondisk_index,
    empty_like,
    exact_neighbours,
    load_bundle,
    save_bundle,
    wants_on_disk,
    write_bundle,
)
from pactl.index.search import search
from pactl.store.generations import current_dir, new_generation
from pactl.verbs.index import index_vectors
from pactl.verbs.vector_sources import gather_vectors

pytestmark = pytest.mark.usefixtures("faiss_one_thread")

SHARDS, PER_SHARD, DIM, CLUSTERS, QUERIES, K = 3, 2_000, 32, 60, 200, 10
FINGERPRINT = "cd" * 32


def exact_top(base: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Row ids of the k largest inner products, best first, in float64."""
    scores = queries.astype(np.float64) @ base.astype(np.float64).T
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def rows_for(ids: np.ndarray) -> list[tuple[int, str, str]]:
    return [(int(i), f"img/{i}.jpg", f"class_{i % 5}") for i in ids]


def at_nprobe(index: Any, nprobe: int, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    faiss.ParameterSpace().set_index_parameters(index, f"nprobe={nprobe}")
    return index.search(queries, K)


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20240601)
    centres = unit(rng.standard_normal((CLUSTERS, DIM)))
    return clustered(rng, SHARDS * PER_SHARD, centres), clustered(rng, QUERIES, centres)


def parts_of(base: np.ndarray, shards: int = SHARDS) -> list[tuple[np.ndarray, np.ndarray]]:
    bounds = np.linspace(0, len(base), shards + 1).astype(int)
    ids = np.arange(len(base), dtype=np.int64)
    return [(base[a:b], ids[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def ondisk_bundle(base: np.ndarray, out: Path, factory: str = "IVF64,Flat") -> dict[str, Any]:
    """As `pactl index` builds one: merged straight into a new generation of the folder."""
    with new_generation(out, BUNDLE_FILES) as gen:
        config = IndexConfig(factory=factory)
        index, record = build_ondisk_index(parts_of(base), config, QUIET, gen)
        rows = rows_for(np.arange(len(base)))
        write_bundle(gen, index, rows, {"fingerprint": FINGERPRINT, **record})
    return record


# ------------------------------------------------------------------------- the merged index


@pytest.mark.parametrize("factory", ["IVF64,Flat", "IVF64_HNSW32,SQ8"])
def test_merged_index_equals_in_memory_and_brute_force(
    factory: str, tmp_path: Path, data: Any
) -> None:
    base, queries = data
    config = IndexConfig(factory=factory)
    ondisk, record = build_ondisk_index(parts_of(base), config, QUIET, tmp_path / "b")
    memory, memory_record = build_index(base, config, QUIET)
    ivf, memory_ivf = faiss.extract_index_ivf(ondisk), faiss.extract_index_ivf(memory)
    assert isinstance(faiss.downcast_InvertedLists(ivf.invlists), faiss.OnDiskInvertedLists)
    assert record["on_disk"] and record["shards"] == SHARDS and ondisk.ntotal == len(base)
    # The same seeded sample across the shards trains the same quantiser...
    np.testing.assert_array_equal(
        ivf.quantizer.reconstruct_n(0, ivf.nlist), memory_ivf.quantizer.reconstruct_n(0, ivf.nlist)
    )
    # ...and the shard-by-shard exact neighbours tune it to the same setting.
    assert record["search_params"] == memory_record["search_params"]
    assert record["recall_at_10"] == memory_record["recall_at_10"]
    nprobe = int(memory_ivf.nprobe)
    assert 1 <= nprobe < ivf.nlist
    for probe in (nprobe, int(ivf.nlist)):
        scores, ids = at_nprobe(ondisk, probe, queries)
        memory_scores, memory_ids = at_nprobe(memory, probe, queries)
        np.testing.assert_array_equal(ids, memory_ids)
        np.testing.assert_allclose(scores, memory_scores, rtol=0, atol=1e-6)
    if "Flat" in factory:  # every list scanned: exact search
        np.testing.assert_array_equal(ids, exact_top(base, queries, K))


def test_exact_neighbours_by_shard_equal_the_whole(data: Any) -> None:
    base, _ = data
    rows = np.arange(0, len(base), 37)
    queries, own = base[rows], rows.astype(np.int64)
    whole = exact_neighbours([(base, np.arange(len(base)))], queries, own, K)
    by_shard = exact_neighbours(parts_of(base, 4), queries, own, K)
    np.testing.assert_array_equal(by_shard, whole)
    # Independently: float64 brute force, each query's own row dropped.
    truth = exact_top(base, queries, K + 1)
    truth = np.array([[i for i in t if i != r][:K] for t, r in zip(truth, rows, strict=True)])
    np.testing.assert_array_equal(by_shard, truth)


def test_on_disk_needs_an_ivf_factory(tmp_path: Path, data: Any) -> None:
    base, _ = data
    for factory in ("Flat", "HNSW32,Flat", "IVF64,Flat,Refine(Flat)", "IVF64,PQ8x4fs"):
        with pytest.raises(PactlError, match="on-disk merging needs an IVF factory"):
            build_ondisk_index(parts_of(base), IndexConfig(factory=factory), QUIET, tmp_path)
    assert not (tmp_path / MERGE_DIR).exists()


def test_when_on_disk_is_chosen() -> None:
    n, dim, tiny = 100_000, 32, 1e-3  # 12.8 MB of vectors against a 1 MB budget
    ivf = IndexConfig(factory="IVF64,Flat", memory_budget_gb=tiny)
    assert wants_on_disk(ivf, n, dim, sharded=True)
    assert not wants_on_disk(ivf, n, dim, sharded=False)
    assert not wants_on_disk(IndexConfig(factory="IVF64,Flat"), n, dim, sharded=True)  # fits
    assert not wants_on_disk(IndexConfig(factory="HNSW32", memory_budget_gb=tiny), n, dim, True)
    assert wants_on_disk(IndexConfig(factory="Flat", on_disk="yes"), 10, dim, sharded=False)
    assert not wants_on_disk(IndexConfig(on_disk="no", memory_budget_gb=tiny), n, dim, True)
    with pytest.raises(PactlError, match="auto, yes, no"):
        wants_on_disk(IndexConfig(on_disk="maybe"), n, dim, True)


# ------------------------------------------------------------------------- bundles


def test_bundle_loads_searches_and_moves(
    tmp_path: Path, data: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    base, queries = data
    out = tmp_path / "bundle"
    record = ondisk_bundle(base, out)
    visible = ["index.faiss", IVFDATA_FILE, "items.bin", "items.csv", "meta.json"]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(visible)
    gen = current_dir(out)
    assert sorted(p.name for p in gen.iterdir()) == sorted(visible)  # no scratch, no pending
    meta = json.loads((out / "meta.json").read_text())
    assert meta["on_disk"] is True and meta["count"] == len(base)
    assert meta["ivfdata_bytes"] == (out / IVFDATA_FILE).stat().st_size > 0
    # index.faiss names the final lists file, not the one the merge wrote
    raw = (out / "index.faiss").read_bytes()
    assert str(gen / IVFDATA_FILE).encode() in raw and PENDING_IVFDATA.encode() not in raw
    capfd.readouterr()
    bundle = load_bundle(out, mmap=False)  # on-disk lists are read in place whatever mmap says
    assert capfd.readouterr().out == ""  # FAISS's chatter kept off stdout (results go there)
    assert bundle.mmapped and bundle.meta["search_params"] == record["search_params"]
    ivf = faiss.extract_index_ivf(bundle.index)
    assert isinstance(faiss.downcast_InvertedLists(ivf.invlists), faiss.OnDiskInvertedLists)
    scores, ids = search(bundle, queries, K)
    memory, _ = build_index(base, IndexConfig(factory="IVF64,Flat"), QUIET)
    memory_scores, memory_ids = memory.search(queries, K)  # same quantiser, same nprobe
    np.testing.assert_array_equal(ids, memory_ids)
    np.testing.assert_allclose(scores, memory_scores, rtol=0, atol=1e-6)
    del bundle, ivf

    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(out, moved)
    assert not out.exists()
    again = load_bundle(moved)
    np.testing.assert_array_equal(search(again, queries, K)[1], ids)
    np.testing.assert_array_equal(search(again, base[[4_321]], 1)[1], [[4_321]])
    # Saved under another folder, a loaded bundle's lists are copied, never taken from it.
    save_bundle(tmp_path / "copy", again.index, again.items, again.meta)
    assert (moved / IVFDATA_FILE).stat().st_size == (
        tmp_path / "copy" / IVFDATA_FILE
    ).stat().st_size
    for folder in (moved, tmp_path / "copy"):
        np.testing.assert_array_equal(search(load_bundle(folder), queries, K)[1], ids)


@pytest.mark.parametrize("damage", ["missing", "truncated", "truncated, size not recorded"])
def test_broken_ivfdata_is_refused(damage: str, tmp_path: Path, data: Any) -> None:
    base, _ = data
    out = tmp_path / "bundle"
    ondisk_bundle(base, out)
    ivfdata = current_dir(out) / IVFDATA_FILE
    if damage == "missing":
        ivfdata.unlink()
        with pytest.raises(PactlError, match=f"lacks {IVFDATA_FILE}.*pactl index"):
            load_bundle(out)
        return
    whole = ivfdata.read_bytes()
    ivfdata.write_bytes(whole[: len(whole) // 2])
    if "not recorded" in damage:  # index.faiss's own list offsets must catch it (not SIGBUS)
        meta = json.loads((out / "meta.json").read_text())
        del meta["ivfdata_bytes"]
        (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(PactlError, match="truncated or corrupt.*pactl index"):
        load_bundle(out)


def test_add_to_an_on_disk_bundle(
    tmp_path: Path, data: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, queries = data
    first = 2 * PER_SHARD
    out = tmp_path / "bundle"
    record = ondisk_bundle(base[:first], out)
    new_ids = np.arange(first, len(base))
    meta_check = {"dimension": DIM, "fingerprint": FINGERPRINT}

    def broken(*args: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr("pactl.index.ondisk.merge_lists", broken)
    with pytest.raises(RuntimeError):
        add_to_bundle(out, base[first:], rows_for(new_ids), meta_check)
    assert load_bundle(out).index.ntotal == first  # a failed add leaves the bundle as it was
    monkeypatch.undo()

    add_to_bundle(out, base[first:], rows_for(new_ids), meta_check)
    bundle = load_bundle(out)
    meta = json.loads((out / "meta.json").read_text())
    assert bundle.index.ntotal == len(bundle.items) == meta["count"] == len(base)
    assert meta["on_disk"] and meta["ivfdata_bytes"] == (out / IVFDATA_FILE).stat().st_size
    assert meta["search_params"] == record["search_params"]  # the tuned setting is kept
    assert not (out / PENDING_IVFDATA).exists()
    assert not (current_dir(out) / PENDING_IVFDATA).exists()
    # The same as one in-memory index of everything under the bundle's trained quantiser.
    memory = empty_like(bundle.index)
    memory.add_with_ids(base, np.arange(len(base), dtype=np.int64))
    nlist = int(faiss.extract_index_ivf(memory).nlist)
    for probe in (int(faiss.extract_index_ivf(bundle.index).nprobe), nlist):
        np.testing.assert_array_equal(
            at_nprobe(bundle.index, probe, queries)[1], at_nprobe(memory, probe, queries)[1]
        )
    np.testing.assert_array_equal(
        at_nprobe(bundle.index, nlist, queries)[1], exact_top(base, queries, K)
    )


# ------------------------------------------------------------------------- memory


def write_vectors_folder(folder: Path, vectors: np.ndarray, ids: np.ndarray) -> None:
    """A folder as `pactl embed` writes it (vectors.npy, items.csv, meta.json)."""
    folder.mkdir(parents=True)
    np.save(folder / "vectors.npy", vectors)
    lines = [f"{i},s/{i},,0,0" for i in ids.tolist()]
    (folder / "items.csv").write_text("id,path,label,size,mtime_ns\n" + "\n".join(lines) + "\n")
    meta = {
        "format": "pactl.vectors",
        "version": 1,
        "dimension": vectors.shape[1],
        "count": len(vectors),
        "metric": "ip",
        "checkpoint": str(folder / "none.pt"),
        "fingerprint": FINGERPRINT,
        "model_config": {},
    }
    (folder / "meta.json").write_text(json.dumps(meta))


def test_neither_build_path_joins_the_shards(tmp_path: Path) -> None:
    shards, per_shard, dim = 4, 10_000, 256
    rng = np.random.default_rng(3)
    centres = unit(rng.standard_normal((40, dim)))
    for i in range(shards):
        ids = np.arange(i * per_shard, (i + 1) * per_shard)
        vectors = clustered(rng, per_shard, centres)
        write_vectors_folder(tmp_path / "v" / "shards" / f"{i:05d}-of-{shards:05d}", vectors, ids)
    total = shards * per_shard * dim * 4  # 41 MB

    peaks = {}
    for choice in ("yes", "no"):
        config = IndexConfig(factory="IVF64,Flat", on_disk=choice)
        # tracemalloc sees numpy's buffers (not FAISS's own): where a joined matrix would show
        tracemalloc.start()
        try:
            index_vectors(tmp_path / "v", tmp_path / f"b-{choice}", config, QUIET)
            peaks[choice] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    tracemalloc.start()
    try:
        gather_vectors(tmp_path / "v")  # joins the shards in memory
        joined = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert joined > total  # the measure sees a join
    for choice in ("yes", "no"):  # neither build joins: a block's rows at a time, plus the items
        assert peaks[choice] < 0.5 * total, peaks
    assert json.loads((tmp_path / "b-yes" / "meta.json").read_text())["on_disk"] is True


# ------------------------------------------------------------------------- command line


@pytest.fixture
def trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    return train_tiny(tmp_path, monkeypatch, capsys, epochs=1)


def test_cli_sharded_embed_index_on_disk_query_add(
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def cli(*args: str) -> str:
        code, out, err = run_cli(list(args), monkeypatch, capsys)
        assert code == 0, err
        return out

    best, imgs = str(trained / "best.pt"), str(tmp_path / "imgs")
    for i in (1, 0):
        cli("embed", imgs, "--checkpoint", best, "--out", "parts", "--shard", f"{i}/2", "--quiet")
    for choice, bundle in (("yes", "disk"), ("no", "memory")):
        out = cli("index", "parts", "--on-disk", choice, "--factory", "IVF4,Flat", "--out", bundle)
        assert "indexed 30 items (IVF4,Flat)" in out
    assert (tmp_path / "disk" / IVFDATA_FILE).is_file()
    assert not (tmp_path / "memory" / IVFDATA_FILE).exists()
    assert json.loads((tmp_path / "disk" / "meta.json").read_text())["on_disk"] is True
    image = str(next((tmp_path / "imgs").glob("class_2/*.png")))
    answers = [
        [
            (r["id"], r["path"])
            for r in map(json.loads, cli("query", image, "--index", b, "--k", "5").splitlines())
        ]
        for b in ("disk", "memory")
    ]
    assert len(answers[0]) == 5 and answers[0] == answers[1]

    make_class_folder(tmp_path / "more", classes=1, per_class=3, seed=1)
    more = sorted((tmp_path / "more").rglob("*.png"))
    assert "added 3 items to disk (33 in all)" in cli(
        "index", str(tmp_path / "more"), "--add", "disk", "--quiet"
    )
    hit = json.loads(cli("query", str(more[1]), "--index", "disk", "--k", "1"))
    assert hit["path"] == str(more[1])
    code, _, err = run_cli(
        ["index", "parts", "--on-disk", "yes", "--factory", "Flat", "--out", "x"],
        monkeypatch,
        capsys,
    )
    assert code == 1 and "needs an IVF factory" in err
