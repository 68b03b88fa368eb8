"""Binary bundles (`pactl index --binary`): codes against a NumPy popcount brute force (ties
included), rescoring against exact cosine in float64, the rotation learned on a seeded sample,
the one-line refusals of bits that cannot be, and the verbs on a binary bundle."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pytest
from conftest import one_error, run_cli, unit
from test_ondisk import FINGERPRINT, write_vectors_folder

from pactl.codes.rotation import ROTATION_CHOICES, Rotation, check_bits, learn_rotation
from pactl.config import INDEX_RULES, IndexConfig
from pactl.console import QUIET
from pactl.errors import PactlError
from pactl.index import add_to_bundle, compact_bundle, delete_items, load_bundle, verify_bundle
from pactl.index.binary.metrics import code_metrics
from pactl.index.binary.search import BinaryIndex
from pactl.index.search import search
from pactl.verbs.index import index_vectors


def popcount_top(
    queries: np.ndarray, codes: np.ndarray, ids: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Reference: Hamming distances by NumPy popcount of the XOR of packed codes, every pair,
    ordered by (distance, id); (distances, ids) of the first k."""
    bits = np.unpackbits(queries[:, None, :] ^ codes[None, :, :], axis=2)
    distances = bits.sum(axis=2).astype(np.int64)  # (nq, n)
    order = np.lexsort((np.broadcast_to(ids, distances.shape), distances), axis=1)[:, :k]
    return np.take_along_axis(distances, order, 1), ids[order]


def code_index(
    vectors: np.ndarray, ids: np.ndarray, rotation: Rotation, factory: str = "BFlat"
) -> BinaryIndex:
    from pactl.index.binary.build import new_code_index

    index = new_code_index(factory, rotation.bits)
    codes = rotation.codes(vectors)
    if not index.is_trained:
        index.train(codes)
    index.add_with_ids(codes, ids)
    rows = {int(i): r for r, i in enumerate(ids.tolist())}

    def positions(wanted: np.ndarray) -> np.ndarray:
        flat = [rows.get(int(i), -1) for i in np.ravel(wanted)]
        return np.asarray(flat, dtype=np.int64).reshape(np.shape(wanted))

    return BinaryIndex(index, rotation, vectors, positions, 1)


def none_rotation(dim: int) -> Rotation:
    return Rotation("none", np.eye(dim, dtype=np.float32), np.zeros(dim, dtype=np.float32))


@pytest.mark.parametrize("factory", ["BFlat", "BIVF8"])
def test_hamming_top_k_is_the_popcount_brute_force_ties_broken_by_id(factory: str) -> None:
    rng = np.random.default_rng(0)
    vectors = unit(rng.standard_normal((600, 16))).astype(np.float32)  # 16 bits: many ties
    ids = rng.permutation(600).astype(np.int64) * 3 + 7  # ids in no order of the rows
    binary = code_index(vectors, ids, none_rotation(16), factory)
    if factory != "BFlat":
        faiss.downcast_IndexBinary(binary.codes).nprobe = 8  # every list: exact
    queries = unit(rng.standard_normal((40, 16))).astype(np.float32)
    q = binary.rotation.codes(queries)
    for m in (1, 10, 57):
        want_d, want_i = popcount_top(q, binary.rotation.codes(vectors), ids, m)
        got_d, got_i = binary.candidates(q, m)
        assert (got_d == want_d).all() and (got_i == want_i).all()
    assert (want_d[:, :-1] == want_d[:, 1:]).any()  # the ties were there to break


def test_hamming_order_through_a_bundle_search_with_rescore_0(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    vectors = unit(rng.standard_normal((300, 16))).astype(np.float32)
    write_vectors_folder(tmp_path / "v", vectors, np.arange(300))
    config = IndexConfig(binary=True, rotation="none", factory="BFlat", rescore=4)
    index_vectors(tmp_path / "v", tmp_path / "b", config, QUIET)
    bundle = load_bundle(tmp_path / "b")
    queries = unit(rng.standard_normal((20, 16))).astype(np.float32)
    scores, found = search(bundle, queries, 12, rescore=0)
    codes = np.packbits(vectors > 0, axis=1)
    want_d, want_i = popcount_top(np.packbits(queries > 0, axis=1), codes, np.arange(300), 12)
    assert (found == want_i).all()
    assert np.allclose(scores, 1 - 2 * want_d / 16)


@pytest.mark.parametrize("block_bytes", [32 * 2**20, 4096])  # one block; a block a query
def test_rescoring_equals_exact_cosine_on_the_candidates(
    block_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pactl.index.rescoring.RESCORE_BYTES", block_bytes)
    rng = np.random.default_rng(2)
    vectors = unit(rng.standard_normal((800, 32))).astype(np.float32)
    ids = np.arange(800, dtype=np.int64) + 1000
    rotation = learn_rotation(vectors, 32, "itq", seed=0)
    binary = code_index(vectors, ids, rotation).with_rescore(5)
    queries = unit(rng.standard_normal((25, 32))).astype(np.float32)
    scores, found = binary.search(queries, 8)
    _, candidates = binary.candidates(rotation.codes(queries), 40)  # 8 hits x 5
    for row in range(len(queries)):
        cosines = vectors[candidates[row] - 1000].astype(np.float64) @ queries[row].astype(
            np.float64
        )
        best = np.argsort(-cosines, kind="stable")[:8]
        assert (found[row] == candidates[row][best]).all()
        assert np.allclose(scores[row], cosines[best], atol=1e-6)


def test_the_rotation_learned_on_a_seeded_sample_reproduces() -> None:
    rng = np.random.default_rng(3)
    sample = unit(rng.standard_normal((2000, 48)) * np.linspace(3, 0.2, 48)).astype(np.float32)
    for kind in ("itq", "lsh"):
        a, b = (learn_rotation(sample, 24, kind, seed=5) for _ in range(2))
        assert a.to_array().tobytes() == b.to_array().tobytes()
        other = learn_rotation(sample, 24, kind, seed=6)
        assert not np.array_equal(a.matrix, other.matrix)
    # ITQ's rotation quantises the projected sample better than its random start (seed 5's)
    itq = learn_rotation(sample, 24, "itq", seed=5)
    centred = sample.astype(np.float64) - sample.mean(axis=0)
    turned = centred @ itq.matrix.astype(np.float64)
    start = np.linalg.qr(np.random.default_rng(5).standard_normal((24, 24)))[0]
    pca = np.linalg.eigh(np.cov(centred.T))[1][:, ::-1][:, :24]
    first = centred @ pca @ start

    def loss(v: np.ndarray) -> float:
        return float(((np.sign(v) - v) ** 2).sum())

    scale = np.linalg.norm(turned) / np.linalg.norm(first)  # the same orthogonal norm
    assert np.isclose(scale, 1.0, atol=1e-4) and loss(turned) < loss(first)


def test_a_binary_bundle_built_twice_is_the_same(tmp_path: Path) -> None:
    vectors = unit(np.random.default_rng(4).standard_normal((500, 32))).astype(np.float32)
    write_vectors_folder(tmp_path / "v", vectors, np.arange(500))
    for name in ("a", "b"):
        config = IndexConfig(binary=True, bits=16, rescore=4)
        index_vectors(tmp_path / "v", tmp_path / name, config, QUIET)
    for file in ("rotation.npy", "index.faiss", "floats.npy"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["version"] == 3 and meta["binary"]["bits"] == 16
    assert set(meta["binary"]["rotation_recall_at_10"]) == {"itq", "lsh"}
    assert meta["binary"]["rotation"] in ("itq", "lsh") and meta["binary"]["rescore"] == 4


@pytest.mark.parametrize(
    ("bits", "dim", "kind", "says"),
    [
        (12, 64, "auto", "multiple of 8"),
        (0, 64, "itq", "multiple of 8"),
        (128, 64, "auto", "--rotation lsh"),
        (128, 64, "itq", "--rotation lsh"),
        (32, 64, "none", "--bits 64"),
        (64, 64, "pca", "--rotation"),
    ],
)
def test_bits_that_cannot_be_are_one_line(bits: int, dim: int, kind: str, says: str) -> None:
    with pytest.raises(PactlError, match=says) as e:
        check_bits(bits, dim, kind)
    assert "\n" not in str(e.value)
    check_bits(128, 64, "lsh")  # a projection makes more bits than dimensions


def test_the_cli_refuses_bits_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    vectors = unit(np.random.default_rng(5).standard_normal((50, 16))).astype(np.float32)
    write_vectors_folder(tmp_path / "v", vectors, np.arange(50))
    base = ["index", str(tmp_path / "v"), "--out", str(tmp_path / "b")]
    for extra, code_wanted, says in (
        (["--binary", "--bits", "12"], 2, "multiple of 8"),
        (["--binary", "--bits", "32"], 1, "more than the vectors' 16 dimensions"),
        (["--bits", "8"], 1, "give --binary too"),
        (["--binary", "--rotation", "none", "--bits", "8"], 1, "--bits 16"),
        (["--factory", "BFlat"], 1, "give --binary too"),
        (["--binary", "--factory", "BIVFx"], 2, "cannot parse the binary factory"),
        (["--binary", "--factory", "IVF8,Flat"], 1, "a binary bundle takes BFlat"),
    ):
        code, out, err = run_cli([*base, *extra], monkeypatch, capsys)
        assert code == code_wanted and out == "" and says in one_error(err), err
    assert not (tmp_path / "b").exists()
    lsh = ["--binary", "--bits", "32", "--rotation", "lsh", "--factory", "BIVF4"]
    code, out, _ = run_cli([*base, *lsh], monkeypatch, capsys)
    assert code == 0 and "(BIVF4, 32-bit codes)" in out


def test_the_rotation_choices_are_the_codes_module_ones() -> None:
    assert INDEX_RULES["rotation"].names == ROTATION_CHOICES


def test_a_network_that_makes_codes_is_indexed_by_its_signs(tmp_path: Path) -> None:
    vectors = unit(np.random.default_rng(6).standard_normal((200, 16))).astype(np.float32)
    write_vectors_folder(tmp_path / "v", vectors, np.arange(200))
    meta_file = tmp_path / "v" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta["model_config"] = {"bits": 16, "embedding_dim": 16}
    meta_file.write_text(json.dumps(meta))
    _, made = index_vectors(tmp_path / "v", tmp_path / "b", IndexConfig(), QUIET)
    assert made["binary"]["bits"] == 16 and made["binary"]["rotation"] == "none"
    bundle = load_bundle(tmp_path / "b")
    codes = faiss.downcast_IndexBinary(bundle.index.codes.index)
    stored = faiss.rev_swig_ptr(codes.xb.data(), 200 * 2).reshape(200, 2)
    assert (stored == np.packbits(vectors > 0, axis=1)).all()
    _, floats = index_vectors(tmp_path / "v", tmp_path / "f", IndexConfig(binary=False), QUIET)
    assert "binary" not in floats and not (tmp_path / "f" / "floats.npy").exists()


def clustered_bundle(tmp_path: Path, factory: str | None = None, n: int = 400) -> Path:
    rng = np.random.default_rng(7)
    centres = unit(rng.standard_normal((60, 32)))
    vectors = unit(centres[rng.integers(0, 60, n)] + 0.3 * rng.standard_normal((n, 32)))
    write_vectors_folder(tmp_path / "v", vectors.astype(np.float32), np.arange(n))
    config = IndexConfig(binary=True, bits=32, factory=factory)
    index_vectors(tmp_path / "v", tmp_path / "b", config, QUIET)
    return tmp_path / "b"


@pytest.mark.parametrize("factory", ["BFlat", "BHNSW8"])
def test_add_delete_compact_keep_codes_and_float_vectors_in_step(
    tmp_path: Path, factory: str
) -> None:
    bundle_dir = clustered_bundle(tmp_path, factory, n=200)
    fresh = unit(np.random.default_rng(8).standard_normal((5, 32))).astype(np.float32)
    rows = [(200 + i, f"new/{i}.png", "") for i in range(5)]
    add_to_bundle(bundle_dir, fresh, rows, {"fingerprint": FINGERPRINT, "dimension": 32})
    delete_items(bundle_dir, ids=[3, 201])
    bundle = load_bundle(bundle_dir)
    scores, found = search(bundle, fresh, 1, rescore=200)  # every code rescored: exact
    assert found[:, 0].tolist() == [200, 202, 203, 204, 200] or found[0, 0] == 200
    assert 201 not in found and np.isclose(scores[0, 0], 1.0, atol=1e-5)
    done = compact_bundle(bundle_dir)
    assert done["method"] == ("remove_ids" if factory == "BFlat" else "rebuilt")
    bundle = load_bundle(bundle_dir)
    assert bundle.index.ntotal == len(bundle.items) == 203 == bundle.index.floats.shape[0]
    at = bundle.items.positions(np.array([200, 204]))
    assert np.allclose(bundle.index.floats[at], fresh[[0, 4]])
    scores, found = search(bundle, fresh[[4]], 1, rescore=300)
    assert found[0, 0] == 204 and verify_bundle(bundle_dir) is not None


def test_rescoring_reaches_the_target_it_was_tuned_for(tmp_path: Path) -> None:
    bundle_dir = clustered_bundle(tmp_path, n=600)
    bundle = load_bundle(bundle_dir)
    meta = bundle.meta
    assert meta["target_reached"] and meta["recall_at_10"] >= 0.95
    assert meta["binary"]["hamming_recall_at_10"] < meta["recall_at_10"]
    vectors = np.load(tmp_path / "v" / "vectors.npy")
    queries = vectors[:100]
    exact = np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, 1:11]
    _, found = search(bundle, queries, 10, np.arange(100))
    recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, exact, strict=True)])
    assert recall >= 0.9
    with pytest.raises(PactlError, match="is for bundles of lossy codes"):
        float_dir = tmp_path / "f"
        index_vectors(tmp_path / "v", float_dir, IndexConfig(), QUIET)
        search(load_bundle(float_dir), queries, 10, rescore=4)


def test_floats_are_the_bundles_own_copy_of_the_vectors(tmp_path: Path) -> None:
    """Guards against floats.npy being a hard link to the vectors file, which a write to the
    vectors folder would change under the bundle: the same rows in a file of its own."""
    bundle_dir = clustered_bundle(tmp_path, n=100)
    source = tmp_path / "v" / "vectors.npy"
    floats = (bundle_dir / "floats.npy").resolve()
    assert floats.stat().st_ino != source.stat().st_ino and floats.stat().st_nlink == 1
    np.testing.assert_array_equal(np.load(floats), np.load(source))


def test_code_metrics_are_those_of_the_brute_force_tables() -> None:
    rng = np.random.default_rng(9)
    centres = unit(rng.standard_normal((6, 24)))
    labels = rng.integers(0, 6, 240)
    vectors = unit(centres[labels] + 0.9 * rng.standard_normal((240, 24))).astype(np.float32)
    binary = code_index(vectors, np.arange(240, dtype=np.int64), none_rotation(24))
    got = code_metrics(binary.with_rescore(1000), vectors, labels, labels, [1, 4], True)
    # codes: Hamming neighbours ordered by (distance, id), the query itself left out
    codes = np.packbits(vectors > 0, axis=1)
    distances = np.unpackbits(codes[:, None] ^ codes[None], axis=2).sum(axis=2)
    np.fill_diagonal(distances, 10**6)
    order = np.lexsort((np.broadcast_to(np.arange(240), distances.shape), distances), axis=1)
    same = labels[order] == labels[:, None]  # (240, 240) the last column is the query itself
    assert got["codes_recall@1"] == pytest.approx(same[:, 0].mean())
    assert got["codes_recall@4"] == pytest.approx(same[:, :4].any(axis=1).mean())
    # rescored with every code a candidate: the float vectors' own order
    cosines = vectors.astype(np.float64) @ vectors.T.astype(np.float64)
    np.fill_diagonal(cosines, -np.inf)
    first = labels[np.argmax(cosines, axis=1)] == labels
    assert got["rescored_recall@1"] == pytest.approx(first.mean())


def test_query_on_a_binary_bundle_has_the_float_bundles_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import TINY, make_class_folder  # noqa: F401  (TINY: the tiny network's)

    imgs = make_class_folder(tmp_path / "imgs", classes=3, per_class=4)
    model = ["--backbone", "small", "--weights", "none", "--image-size", "16"]
    for name, extra in (("f", []), ("c", ["--binary", "--bits", "64"])):
        code, out, err = run_cli(
            ["index", str(imgs), *model, "--out", str(tmp_path / name), *extra, "--quiet"],
            monkeypatch,
            capsys,
        )
        assert code == 0, err
    image = str(imgs / "class_0" / "0.png")
    answers = {}
    for name in ("f", "c"):
        args = ["query", image, "--index", str(tmp_path / name), "--k", "3", "-f", "jsonl"]
        code, out, err = run_cli(args, monkeypatch, capsys)
        assert code == 0, err
        answers[name] = [json.loads(line) for line in out.splitlines()]
    assert [sorted(r) for r in answers["f"]] == [sorted(r) for r in answers["c"]]
    assert answers["c"][0]["path"].endswith("class_0/0.png")
    args = ["query", image, "--index", str(tmp_path / "f"), "--rescore", "0"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 1 and out == "" and "is for bundles of lossy codes" in one_error(err)
    code, out, err = run_cli(["index", "--verify", str(tmp_path / "c")], monkeypatch, capsys)
    assert code == 0 and "5 files" in out, err


def test_dedup_and_export_read_a_binary_bundles_float_vectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pactl.interop.qdrant import bundle_vectors

    rng = np.random.default_rng(10)
    base = unit(rng.standard_normal((60, 32)))
    near = unit(base[:20] + 0.02 * rng.standard_normal((20, 32)))  # 20 near copies
    vectors = np.vstack([base, near]).astype(np.float32)
    write_vectors_folder(tmp_path / "v", vectors, np.arange(80))
    config = IndexConfig(binary=True, bits=16, rescore=4)
    index_vectors(tmp_path / "v", tmp_path / "b", config, QUIET)
    delete_items(tmp_path / "b", ids=[5])
    found = []
    for folder in (tmp_path / "v", tmp_path / "b"):
        args = ["dedup", str(folder), "--threshold", "0.99", "--format", "csv"]
        code, out, err = run_cli(args, monkeypatch, capsys)
        assert code == 0, err
        rows = [line.split(",") for line in out.splitlines()]
        assert rows[0] == ["group", "id", "path", "score"]
        groups: dict[str, set[tuple[int, str]]] = {}
        for group, item, _, score in rows[1:]:
            groups.setdefault(group, set()).add((int(item), score))
        found.append({frozenset(members) for members in groups.values()})
    assert len(found[0]) == 20 and {i for g in found[0] for i, _ in g} == set(range(80)) - set(
        range(20, 60)
    )
    assert found[1] == {g for g in found[0] if (5, "1.0") not in g}  # id 5 deleted
    exported, items = bundle_vectors(load_bundle(tmp_path / "b"))
    assert 5 not in items.ids.tolist() and len(items) == 79
    assert np.array_equal(exported, vectors[items.ids])


def test_eval_reports_codes_and_rescored_beside_the_float_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import make_class_folder

    imgs = make_class_folder(tmp_path / "imgs", classes=6, per_class=8, seed=2)
    model = ["--backbone", "small", "--weights", "none", "--image-size", "16"]
    report = ["--report", str(tmp_path / "e.csv"), "--overwrite"]
    code, plain, err = run_cli(["eval", str(imgs), *model, *report], monkeypatch, capsys)
    assert code == 0, err
    args = ["eval", str(imgs), *model, *report, "--binary", "--bits", "32", "--rescore", "1000"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    values = {line.split()[0]: float(line.split()[1]) for line in out.splitlines()}
    floats = {line.split()[0]: float(line.split()[1]) for line in plain.splitlines()}
    assert {k: values[k] for k in floats} == floats  # the float rows as pactl eval gives them
    assert {"codes_recall@1", "codes_map@r", "rescored_recall@1", "rescored_map@r"} <= set(values)
    # every code a candidate: the rescored order is the float vectors' own
    assert values["rescored_recall@1"] == floats["recall@1"]
    assert values["rescored_map@r"] == pytest.approx(floats["map@r"], abs=1e-4)
    code, out, err = run_cli(["eval", str(imgs), *model, "--bits", "32"], monkeypatch, capsys)
    assert code == 2 and "--bits goes with --binary" in one_error(err)


def test_eval_of_a_binary_bundle_uses_its_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import make_class_folder
    from test_hostile_cli import tiny_checkpoint

    imgs = make_class_folder(tmp_path / "imgs", classes=6, per_class=6, seed=3)
    tiny_checkpoint(tmp_path / "best.pt")
    index = ["index", str(imgs), "--checkpoint", str(tmp_path / "best.pt"), "--quiet"]
    code, _, err = run_cli([*index, "--out", str(tmp_path / "b"), "--binary"], monkeypatch, capsys)
    assert code == 0, err
    args = ["eval", str(imgs), "--index", str(tmp_path / "b"), "--report", str(tmp_path / "e")]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())["binary"]
    assert f"codes: {meta['bits']} bits, rotation {meta['rotation']}, rescoring " in err
    assert "codes_recall@1" in out and "rescored_map@r" in out


def test_audit_reads_a_binary_bundles_float_vectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import make_class_folder

    from pactl.index.dedup import BundleSearcher

    imgs = make_class_folder(tmp_path / "imgs", classes=3, per_class=4)
    model = ["--backbone", "small", "--weights", "none", "--image-size", "16"]
    args = ["index", str(imgs), *model, "--out", str(tmp_path / "c"), "--binary", "--quiet"]
    assert run_cli(args, monkeypatch, capsys)[0] == 0
    bundle = load_bundle(tmp_path / "c")
    rows = np.array([3, 0, 7])
    floats = np.load(tmp_path / "c" / "floats.npy")
    assert np.array_equal(BundleSearcher(bundle).vectors(rows), floats[rows])
    code, out, err = run_cli(["audit", str(tmp_path / "c"), "-f", "csv"], monkeypatch, capsys)
    assert code == 0 and "12 items" in err + out, err


def test_a_sharded_vectors_folder_makes_one_binary_bundle(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    vectors = unit(rng.standard_normal((300, 32))).astype(np.float32)
    for i in range(3):
        rows = np.arange(i * 100, (i + 1) * 100)
        shard = tmp_path / "v" / "shards" / f"{i:05d}-of-00003"
        write_vectors_folder(shard, vectors[rows], rows)
    config = IndexConfig(binary=True, bits=32, rescore=300)
    index_vectors(tmp_path / "v", tmp_path / "b", config, QUIET)
    bundle = load_bundle(tmp_path / "b")
    assert np.array_equal(bundle.index.floats, vectors)  # copied in shard order
    assert (tmp_path / "b" / "floats.npy").stat().st_nlink == 1  # a copy, not a link
    scores, found = search(bundle, vectors[[5, 150, 299]], 1)
    assert found[:, 0].tolist() == [5, 150, 299] and np.allclose(scores[:, 0], 1.0, atol=1e-5)


def test_index_of_a_bits_network_makes_its_own_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import TINY, make_class_folder

    imgs = make_class_folder(tmp_path / "imgs", classes=6, per_class=6)
    monkeypatch.setenv("PACTL_RUNS", str(tmp_path / "runs"))
    train = ["train", str(imgs), *TINY, "--bits", "16", "--epochs", "1", "--name", "b", "-q"]
    code, _, err = run_cli(train, monkeypatch, capsys)
    assert code == 0, err
    best = str(tmp_path / "runs" / "b" / "best.pt")
    args = ["index", str(imgs), "--checkpoint", best, "--out", str(tmp_path / "c"), "-q"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0 and "(BFlat, 16-bit codes)" in out, err
    bundle = load_bundle(tmp_path / "c")
    assert bundle.meta["binary"]["rotation"] == "none" and bundle.index.bits == 16
    floats = np.load(tmp_path / "c" / "floats.npy")
    stored = faiss.downcast_IndexBinary(bundle.index.codes.index)
    codes = faiss.rev_swig_ptr(stored.xb.data(), len(floats) * 2).reshape(len(floats), 2)
    assert (codes == np.packbits(floats > 0, axis=1)).all()  # the network's own signs


def test_the_binary_default_is_exact_hamming_at_every_size() -> None:
    """Guards against an IVF of binary k-means lists coming back as the default past some size:
    at 10,000,000 512-bit codes it reached Recall@10 0.55 rescored where exact Hamming search over
    the same codes reached 0.97 (docs/benchmarks.md, bench/binary_probe.py)."""
    from pactl.index.build import choose_binary_factory

    for n in (1, 50_000, 2_000_000, 10_000_000, 1_000_000_000):
        assert choose_binary_factory(n, 512) == "BFlat"
    with pytest.raises(PactlError):
        choose_binary_factory(0, 512)
