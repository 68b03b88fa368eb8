"""What building an index holds in memory: no torch for a vectors folder, memory-mapped vectors
read a block at a time with each block's pages dropped, and the same index as from memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest
from conftest import clustered, unit

import pactl.index.build as build
import pactl.index.mapped as mapped
from pactl.config import IndexConfig
from pactl.console import QUIET
from pactl.index import build_index, build_parts, exact_neighbours
from pactl.index.mapped import blocks, drop_pages

MIB = 2**20
STATUS = Path("/proc/self/status")
needs_proc = pytest.mark.skipif(not STATUS.is_file(), reason="reads /proc/self/status (Linux)")


def rss_file() -> int:
    """Bytes of file-backed pages this process has resident (RssFile)."""
    for line in STATUS.read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def vectors_file(
    tmp_path: Path, rows: int, dim: int, seed: int = 0, clusters: bool = True
) -> tuple[Path, np.ndarray]:
    """A .npy of clustered unit vectors (or, for page counting, plain random floats)."""
    rng = np.random.default_rng(seed)
    if clusters:
        vectors = clustered(rng, rows, unit(rng.standard_normal((20, dim))))
    else:
        vectors = rng.random((rows, dim), dtype=np.float32)
    path = tmp_path / f"vectors-{seed}.npy"
    np.save(path, vectors)
    return path, vectors


def serialized(index: faiss.Index) -> bytes:
    return bytes(faiss.serialize_index(index))


# ------------------------------------------------------------------------- no torch


def test_index_of_a_vectors_folder_imports_no_torch(tmp_path: Path) -> None:
    folder = tmp_path / "vectors"
    folder.mkdir()
    rng = np.random.default_rng(1)
    np.save(folder / "vectors.npy", unit(rng.standard_normal((50, 8))).astype(np.float32))
    lines = [f"{i},img/{i}.jpg,,0,0" for i in range(50)]
    (folder / "items.csv").write_text("id,path,label,size,mtime_ns\n" + "\n".join(lines) + "\n")
    meta = {"format": "pactl.vectors", "version": 1, "dimension": 8, "count": 50}
    meta |= {"metric": "ip", "checkpoint": None, "fingerprint": "ab" * 32, "model_config": {}}
    (folder / "meta.json").write_text(json.dumps(meta))
    code = (
        "import sys\n"
        f"sys.argv = ['pactl', 'index', {str(folder)!r}, '--out', {str(tmp_path / 'b')!r}]\n"
        "from pactl.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code)\n"
        "print('HEAVY', [m for m in ('torch', 'torchvision', 'timm') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "indexed 50 items" in done.stdout, done.stdout + done.stderr
    assert "HEAVY []" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "b" / "meta.json").is_file()


# ------------------------------------------------------------------------- dropping pages


@needs_proc
def test_drop_pages_gives_back_a_mapped_file_and_keeps_its_content(tmp_path: Path) -> None:
    path, vectors = vectors_file(tmp_path, 32_768, 256, clusters=False)  # 32 MiB
    mm = np.load(path, mmap_mode="r")
    before = rss_file()
    assert mm.sum(dtype=np.float64) == vectors.sum(dtype=np.float64)
    touched = rss_file()
    assert touched - before > 28 * MIB  # the whole file is resident now
    assert drop_pages(mm[:16_384])  # the first half
    half = rss_file()
    assert 12 * MIB < touched - half < 20 * MIB
    assert drop_pages(mm)
    assert rss_file() - before < 2 * MIB
    np.testing.assert_array_equal(np.asarray(mm), vectors)  # read back from the file


def test_drop_pages_leaves_memory_private_maps_and_strided_views_alone(tmp_path: Path) -> None:
    path, vectors = vectors_file(tmp_path, 2_000, 16)
    in_memory = vectors.copy()
    assert not drop_pages(in_memory)
    np.testing.assert_array_equal(in_memory, vectors)
    private = np.load(path, mmap_mode="c")
    private[0] = 7.0  # a private page: dropping it would lose this
    assert not drop_pages(private)
    assert (private[0] == 7.0).all()
    assert not drop_pages(np.load(path, mmap_mode="r")[::2])
    assert not drop_pages(np.load(path, mmap_mode="r")[:0])


@needs_proc
def test_blocks_read_every_row_with_one_block_resident(tmp_path: Path) -> None:
    path, vectors = vectors_file(tmp_path, 32_768, 256, clusters=False)  # 32 MiB, blocks of 1 MiB
    mm = np.load(path, mmap_mode="r")
    before, most, got = rss_file(), 0, []
    for first, block in blocks(mm, 1_024):
        got.append((first, block.sum(axis=1, dtype=np.float64)))
        most = max(most, rss_file() - before)
    assert [first for first, _ in got] == list(range(0, 32_768, 1_024))
    np.testing.assert_allclose(
        np.concatenate([s for _, s in got]), vectors.sum(axis=1, dtype=np.float64), rtol=1e-5
    )
    assert most < 8 * MIB  # one 1 MiB block, and some code pages mapped on first use
    most = 0  # the same pass without dropping: the measure sees the file pile up
    for start in range(0, 32_768, 1_024):
        float(mm[start : start + 1_024].sum())
        most = max(most, rss_file() - before)
    assert most > 28 * MIB


# ------------------------------------------------------------------------- same results


def test_exact_neighbours_over_blocks_against_brute_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mapped, "BLOCK_BYTES", 128 * 16 * 4)  # 128 rows: many blocks a part
    (a, va), (b, vb) = vectors_file(tmp_path, 700, 16, 1), vectors_file(tmp_path, 500, 16, 2)
    ids_a, ids_b = np.arange(700) * 3, np.arange(500) * 3 + 1  # ids, not row numbers
    parts = [(np.load(a, mmap_mode="r"), ids_a), (np.load(b, mmap_mode="r"), ids_b)]
    base, ids = np.concatenate([va, vb]), np.concatenate([ids_a, ids_b])
    rows = np.sort(np.random.default_rng(3).choice(1_200, 60, replace=False))
    queries, own = mapped.read_rows(parts, rows)
    np.testing.assert_array_equal(queries, base[rows])
    np.testing.assert_array_equal(own, ids[rows])
    k = 10
    found = exact_neighbours(parts, queries, own, k)
    scores = queries.astype(np.float64) @ base.astype(np.float64).T  # (60, 1200)
    scores[np.arange(60), rows] = -np.inf  # a query is not its own neighbour
    expected = ids[np.argsort(-scores, axis=1, kind="stable")[:, :k]]
    np.testing.assert_array_equal(found, expected)


@pytest.mark.usefixtures("faiss_one_thread")
def test_index_from_mapped_blocks_equals_index_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, vectors = vectors_file(tmp_path, 3_000, 16)
    config = IndexConfig(factory="IVF16_HNSW32,Flat", target_recall=0.95)
    from_memory, record = build_index(vectors, config, QUIET)
    monkeypatch.setattr(mapped, "BLOCK_BYTES", 300 * 16 * 4)  # 300 rows a block
    from_map, mapped_record = build_index(np.load(path, mmap_mode="r"), config, QUIET)
    assert serialized(from_map) == serialized(from_memory)
    for key in ("search_params", "recall_at_10", "train_points", "ntotal"):
        assert mapped_record[key] == record[key]


@pytest.mark.parametrize("factory", ["IVF16,Flat", "IVF16_HNSW32,Flat", "IVF16,PQ4x4", "IVF16,SQ8"])
def test_presized_lists_hold_what_a_plain_add_gives(
    factory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(5)
    vectors = clustered(rng, 3_000, unit(rng.standard_normal((30, 16))))
    ids = np.arange(3_000, dtype=np.int64) * 2 + 5  # ids, not row numbers
    trained = faiss.index_factory(16, factory, faiss.METRIC_INNER_PRODUCT)
    trained.train(vectors)
    plain = faiss.clone_index(trained)
    for start in range(0, 3_000, 700):  # FAISS's own add, a block at a time
        plain.add_with_ids(vectors[start : start + 700], ids[start : start + 700])
    presized = faiss.clone_index(trained)
    assert build._presizable(presized) is not None
    monkeypatch.setattr(mapped, "BLOCK_BYTES", 700 * 16 * 4)  # 700 rows a block
    build.add_vectors(presized, vectors[:1_000], ids[:1_000], QUIET)
    build.add_vectors(presized, vectors[1_000:], ids[1_000:], QUIET)  # onto non-empty lists
    assert presized.ntotal == 3_000
    assert serialized(presized) == serialized(plain)


@pytest.mark.parametrize("factory", ["PCA8,IVF16,Flat", "IVF16,PQ4x4fs", "HNSW8,Flat", "Flat"])
def test_other_kinds_add_their_own_way(factory: str) -> None:
    assert build._presizable(faiss.index_factory(16, factory, faiss.METRIC_INNER_PRODUCT)) is None


@pytest.mark.usefixtures("faiss_one_thread")
def test_parts_build_the_index_of_the_parts_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mapped, "BLOCK_BYTES", 500 * 16 * 4)  # 500 rows a block
    (a, va), (b, vb) = vectors_file(tmp_path, 1_700, 16, 1), vectors_file(tmp_path, 1_300, 16, 2)
    ids_a, ids_b = np.arange(1_700) + 10_000, np.arange(1_300)  # ids, not row numbers
    config = IndexConfig(factory="IVF16_HNSW32,Flat", target_recall=0.95)
    parts = [(np.load(a, mmap_mode="r"), ids_a), (np.load(b, mmap_mode="r"), ids_b)]
    from_parts, record = build_parts(parts, config, QUIET)
    joined = np.concatenate([va, vb])
    from_joined, joined_record = build_index(joined, config, QUIET, ids=np.r_[ids_a, ids_b])
    assert serialized(from_parts) == serialized(from_joined)
    for key in ("search_params", "recall_at_10", "train_points", "ntotal"):
        assert record[key] == joined_record[key]
