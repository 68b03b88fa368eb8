"""pactl.index.rescoring: a float bundle of lossy codes (IVF-PQ) keeps a copy of its vectors
and rescores its candidates by exact cosine, at a depth tuned to the target; its answers are
checked against brute force, through add, delete and compaction, and without rescoring the
codes are named as the limit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import unit
from test_ondisk import FINGERPRINT, write_vectors_folder

from pactl.config import IndexConfig
from pactl.console import QUIET
from pactl.errors import PactlError
from pactl.index import add_to_bundle, compact_bundle, delete_items, load_bundle, verify_bundle
from pactl.index.rescoring import RescoredIndex, lossy
from pactl.index.search import search
from pactl.verbs.index import index_vectors

N, DIM = 3_000, 32
LOSSY = "IVF16,PQ4x4"  # 2 bytes a vector: its codes alone stay far below Recall@10 0.95


@pytest.fixture(scope="module")
def vectors(faiss_one_thread: None) -> np.ndarray:
    rng = np.random.default_rng(11)
    centres = unit(rng.standard_normal((40, DIM)))
    x = centres[rng.integers(0, 40, N)] + 0.35 * rng.standard_normal((N, DIM))
    return unit(x).astype(np.float32)


def exact_top(base: np.ndarray, queries: np.ndarray, k: int, skip: set[int]) -> np.ndarray:
    """Brute force in float64: the k best ids of each query, `skip` left out."""
    scores = queries.astype(np.float64) @ base.astype(np.float64).T
    scores[:, sorted(skip)] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    pairs = zip(found, truth, strict=True)
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in pairs]))


def bundle_of(tmp_path: Path, vectors: np.ndarray, config: IndexConfig) -> Path:
    write_vectors_folder(tmp_path / "v", vectors, np.arange(len(vectors)))
    index_vectors(tmp_path / "v", tmp_path / "b", config, QUIET)
    return tmp_path / "b"


def test_a_rescored_pq_bundle_meets_the_target_its_codes_cannot(
    tmp_path: Path, vectors: np.ndarray
) -> None:
    bundle_dir = bundle_of(tmp_path, vectors, IndexConfig(factory=LOSSY, target_recall=0.95))
    bundle = load_bundle(bundle_dir)
    assert isinstance(bundle.index, RescoredIndex) and lossy(bundle.index.index)
    assert (bundle_dir / "floats.npy").is_file() and bundle.meta["rescore"] >= 1
    assert bundle.meta["target_reached"] is True and bundle.meta["limited_by"] is None
    fresh = unit(vectors[:200] + 0.05 * np.random.default_rng(3).standard_normal((200, DIM)))
    truth = exact_top(vectors, fresh.astype(np.float32), 10, set())
    _, found = search(bundle, fresh.astype(np.float32), 10)
    assert recall(found, truth) >= 0.93  # fresh queries, 1,000 tuning ones: a little slack
    _, codes_only = search(bundle, fresh.astype(np.float32), 10, rescore=0)
    assert recall(codes_only, truth) < recall(found, truth) - 0.1
    assert verify_bundle(bundle_dir) is not None


def test_every_candidate_rescored_is_the_exact_top_k(tmp_path: Path, vectors: np.ndarray) -> None:
    bundle_dir = bundle_of(tmp_path, vectors, IndexConfig(factory=LOSSY, rescore=4))
    bundle = load_bundle(bundle_dir)
    assert bundle.meta["rescore"] == 4  # given, not tuned
    queries = vectors[:50]
    # Every list probed and every code a candidate: the rescored order is the exact one.
    bundle.index.index.nprobe = 16
    scores, found = search(bundle, queries, 5, rescore=N // 5)
    truth = exact_top(vectors, queries, 5, set())
    assert (found == truth).all()
    expected = np.take_along_axis(queries @ vectors.T, truth, axis=1)
    assert np.allclose(scores, expected, atol=1e-5)


def test_add_delete_compact_keep_codes_and_floats_in_step(
    tmp_path: Path, vectors: np.ndarray
) -> None:
    base = vectors[:2_000]
    bundle_dir = bundle_of(tmp_path, base, IndexConfig(factory=LOSSY, rescore=8))
    fresh = unit(np.random.default_rng(8).standard_normal((5, DIM))).astype(np.float32)
    rows = [(2_000 + i, f"new/{i}.png", "") for i in range(5)]
    add_to_bundle(bundle_dir, fresh, rows, {"fingerprint": FINGERPRINT, "dimension": DIM})
    delete_items(bundle_dir, ids=[3, 2_001])
    every = np.concatenate([base, fresh])
    probe = every[[0, 10, 2_000, 2_004]]
    for step in ("deleted", "compacted"):
        bundle = load_bundle(bundle_dir)
        bundle.index.index.nprobe = 16
        _, found = search(bundle, probe, 3, rescore=len(every) // 3)
        assert (found == exact_top(every, probe, 3, {3, 2_001})).all(), step
        assert bundle.index.floats.shape[0] == bundle.index.ntotal
        if step == "deleted":
            compact_bundle(bundle_dir)
    assert verify_bundle(bundle_dir) is not None


def test_without_rescoring_the_codes_are_named_as_the_limit(
    tmp_path: Path, vectors: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    from pactl.console import Reporter, err

    write_vectors_folder(tmp_path / "v", vectors, np.arange(N))
    config = IndexConfig(factory=LOSSY, rescore=0, target_recall=0.95)
    index_vectors(tmp_path / "v", tmp_path / "b", config, Reporter(err, quiet=True))
    bundle = load_bundle(tmp_path / "b")
    assert not isinstance(bundle.index, RescoredIndex)
    assert not (tmp_path / "b" / "floats.npy").exists()
    assert bundle.meta["target_reached"] is False and bundle.meta["limited_by"] == "codes"
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "limited by the codes" in lines[0]


def test_a_bundle_of_exact_codes_keeps_no_floats(tmp_path: Path, vectors: np.ndarray) -> None:
    bundle_dir = bundle_of(tmp_path, vectors, IndexConfig(factory="IVF16,Flat"))
    assert not (bundle_dir / "floats.npy").exists()
    with pytest.raises(PactlError, match="--rescore is for bundles of lossy codes"):
        search(load_bundle(bundle_dir), vectors[:2], 3, rescore=4)


@pytest.mark.parametrize("factory", ["PCAR8,Flat", "PCA8,IVF16,Flat", "OPQ4_8,IVF16,Flat"])
def test_a_dimension_cutting_pre_transform_before_exact_lists_is_rescored(
    tmp_path: Path, vectors: np.ndarray, factory: str
) -> None:
    # 32-d vectors in 40 clusters with noise in every axis: 8 dimensions lose neighbours.
    bundle_dir = bundle_of(tmp_path, vectors, IndexConfig(factory=factory, target_recall=0.95))
    bundle = load_bundle(bundle_dir)
    assert isinstance(bundle.index, RescoredIndex) and lossy(bundle.index.index)
    assert (bundle_dir / "floats.npy").is_file() and bundle.meta["rescore"] >= 1
    assert bundle.meta["target_reached"] is True
    fresh = unit(vectors[:200] + 0.05 * np.random.default_rng(4).standard_normal((200, DIM)))
    queries = fresh.astype(np.float32)
    truth = exact_top(vectors, queries, 10, set())
    _, found = search(bundle, queries, 10)
    _, reduced = search(bundle, queries, 10, rescore=0)  # the pre-transform's own order
    assert recall(found, truth) >= 0.93
    assert recall(reduced, truth) < recall(found, truth) - 0.1


def test_rescore_0_keeps_a_pca_reduced_flat_unrescored_and_names_the_codes(
    tmp_path: Path, vectors: np.ndarray
) -> None:
    config = IndexConfig(factory="PCAR8,Flat", rescore=0, target_recall=0.95)
    bundle_dir = bundle_of(tmp_path, vectors, config)
    bundle = load_bundle(bundle_dir)
    assert not isinstance(bundle.index, RescoredIndex)
    assert not (bundle_dir / "floats.npy").exists() and "rescore" not in bundle.meta
    assert bundle.meta["target_reached"] is False


def test_a_rotation_that_keeps_every_cosine_is_not_lossy() -> None:
    import faiss

    x = unit(np.random.default_rng(2).standard_normal((500, 16))).astype(np.float32)
    for factory, cut in [("RR16,Flat", False), ("PCA16,Flat", True), ("L2norm,Flat", False)]:
        index = faiss.index_factory(16, factory, faiss.METRIC_INNER_PRODUCT)
        index.train(x)
        assert lossy(index) is cut, factory


def _vm_flags(path: Path) -> list[str]:
    """The VmFlags of each mapping of `path` in this process (/proc/self/smaps)."""
    flags, current = [], False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef" and "-" in line.split()[0]:
            current = line.rstrip().endswith(str(path))
        elif current and line.startswith("VmFlags:"):
            flags.append(line)
    return flags


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc")
def test_rescoring_reads_the_floats_at_random_without_read_around(tmp_path: Path) -> None:
    """A page fault in floats.npy must read that page alone (MADV_RANDOM: "rr" in VmFlags),
    not the kernel's read-around of up to read_ahead_kb: scattered candidate rows from a file
    larger than memory otherwise read megabytes each."""
    from pactl.index.rescoring import rescore

    rng = np.random.default_rng(0)
    path = tmp_path / "floats.npy"
    np.save(path, unit(rng.standard_normal((2_000, 16))).astype(np.float32))
    floats = np.load(path, mmap_mode="r")
    assert _vm_flags(path) and not any(" rr" in f for f in _vm_flags(path))
    queries = unit(rng.standard_normal((3, 16))).astype(np.float32)
    found = rng.integers(0, 2_000, (3, 8))
    scores, ids = rescore(floats, lambda x: x, queries, found, 4)
    assert any(" rr" in f for f in _vm_flags(path))
    expected = np.sort(np.einsum("bmd,bd->bm", np.asarray(floats)[found], queries), axis=1)
    np.testing.assert_allclose(scores, expected[:, ::-1][:, :4], rtol=1e-6)
