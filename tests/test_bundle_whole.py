"""A bundle is whole in itself: meta.json's own fields (the settings that steer every answer)
are covered by a digest its checksum record holds, so a same-size edit of one is found by
`pactl index --verify` and by `pactl serve` at start; a binary bundle's floats.npy is its own
file, so writing the vectors folder it was built from never changes its answers; and a bundle
whose file is a hard link to one outside it (an older pactl's floats.npy) is refused by
--verify, naming the file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import one_error, run_cli, unit
from test_ondisk import write_vectors_folder

from pactl.errors import PactlError
from pactl.index import load_bundle, verify_bundle
from pactl.index.search import search

EDITED = "meta.json is damaged or was edited"


def float_bundle(root: Path) -> Path:
    """root/f: an IVF bundle (nprobe=4) of 64 unit vectors with a calibrated threshold."""
    import faiss

    from pactl.index import save_bundle

    x = unit(np.random.default_rng(0).standard_normal((64, 16))).astype(np.float32)
    index = faiss.index_factory(16, "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add_with_ids(x, np.arange(64, dtype=np.int64))
    rows = [(i, f"/photos/{i}.png", f"c{i % 4}") for i in range(64)]
    meta = {
        "fingerprint": "f" * 64,
        "factory": "IVF4,Flat",
        "search_params": "nprobe=4",
        "calibration": {"threshold": 0.75, "precision": 0.99},
    }
    save_bundle(root / "f", index, rows, meta)
    return root / "f"


def binary_bundle(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    """root/b: a binary bundle (BFlat, 32 bits, itq, rescore 4) of root/v's 60 vectors."""
    x = unit(np.random.default_rng(4).standard_normal((60, 32))).astype(np.float32)
    write_vectors_folder(root / "v", x, np.arange(60))
    args = ["index", str(root / "v"), "--binary", "--bits", "32", "--rotation", "itq"]
    args += ["--rescore", "4", "--out", str(root / "b"), "--quiet"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    return root / "b"


def edit_in_place(file: Path, old: str, new: str) -> None:
    """One field's text replaced by another of the same length: sizes cannot tell."""
    text = file.read_text()
    assert len(old) == len(new) and text.count(old) == 1, old
    file.write_text(text.replace(old, new))


# the fields that steer answers: what is searched, how deep, how codes are made, which model
# a query is embedded by, what counts as the same item
FLOAT_EDITS = [
    ('"search_params": "nprobe=4"', '"search_params": "nprobe=1"'),
    ('"threshold": 0.75', '"threshold": 0.25'),
    ('"metric": "ip"', '"metric": "l2"'),
    ('"fingerprint": "ffff', '"fingerprint": "eeee'),
]
BINARY_EDITS = [
    ('"rescore": 4', '"rescore": 1'),
    ('"rotation": "itq"', '"rotation": "lsh"'),
    ('"fingerprint": "cdcd', '"fingerprint": "abab'),
]


@pytest.mark.parametrize(("old", "new"), FLOAT_EDITS)
def test_a_same_size_edit_of_a_float_bundles_setting_is_found_by_verify(
    tmp_path: Path, old: str, new: str
) -> None:
    bundle = float_bundle(tmp_path)
    assert verify_bundle(bundle).meta  # type: ignore[union-attr]
    edit_in_place(bundle / "meta.json", old, new)
    with pytest.raises(PactlError, match=EDITED):
        verify_bundle(bundle)


@pytest.mark.parametrize(("old", "new"), BINARY_EDITS)
def test_a_same_size_edit_of_a_binary_bundles_setting_is_found_by_verify_and_serve(
    tmp_path: Path,
    old: str,
    new: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bundle = binary_bundle(tmp_path, monkeypatch, capsys)
    edit_in_place(bundle / "meta.json", old, new)
    code, out, err = run_cli(["index", "--verify", str(bundle)], monkeypatch, capsys)
    assert code == 1 and out == "" and EDITED in one_error(err)
    pytest.importorskip("uvicorn")
    code, out, err = run_cli(["serve", str(bundle), "--port", "0"], monkeypatch, capsys)
    assert code == 1 and out == "" and EDITED in one_error(err)


def test_an_edited_file_digest_in_the_record_is_found(tmp_path: Path) -> None:
    """The record's file digests are meta.json fields too: one replaced by another file's
    (so that file's tampering would pass) is found as an edit of meta.json."""
    bundle = float_bundle(tmp_path)
    meta = json.loads((bundle / "meta.json").read_text())
    files = meta["checksums"]["files"]
    edit_in_place(bundle / "meta.json", files["items.csv"], files["index.faiss"])
    with pytest.raises(PactlError, match=EDITED):
        verify_bundle(bundle)


def test_verify_says_meta_is_covered_and_what_an_older_bundle_leaves_unverified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = float_bundle(tmp_path)
    code, out, err = run_cli(["index", "--verify", str(bundle)], monkeypatch, capsys)
    assert code == 0 and out.strip().endswith("and so do meta.json's fields"), err
    meta = json.loads((bundle / "meta.json").read_text())
    del meta["checksums"]["meta"], meta["sealed"]  # as a pactl before the digest wrote it
    meta["search_params"] = "nprobe=2"  # not vouched for: the line says so
    (bundle / "meta.json").write_text(json.dumps(meta))
    assert len(load_bundle(bundle).items) == 64
    checked = verify_bundle(bundle)
    assert checked is not None and not checked.meta and "index.faiss" in checked.files
    code, out, err = run_cli(["index", "--verify", str(bundle)], monkeypatch, capsys)
    assert code == 0, err
    assert "meta.json's own fields (its settings) carry no checksum" in out
    assert "were not verified" in out and "match their checksums" in out


# what a sealed meta.json loses when its record is removed or made to look like an older
# writer's: each is refused as an edit, never "not verified" with exit 0
UNSEALINGS = {
    "digest deleted": lambda meta: meta["checksums"].pop("meta"),
    "record deleted": lambda meta: meta.pop("checksums"),
    "record's generation edited": lambda meta: meta["checksums"].update(generation="another"),
    "record's algorithm edited": lambda meta: meta["checksums"].update(algorithm="md5"),
}


@pytest.mark.parametrize("unseal", UNSEALINGS.values(), ids=UNSEALINGS.keys())
def test_a_sealed_bundle_without_its_digest_fails_verify_and_serve(
    tmp_path: Path,
    unseal: Callable[[dict[str, Any]], object],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bundle = float_bundle(tmp_path)
    meta = json.loads((bundle / "meta.json").read_text())
    assert meta["sealed"] == meta["generation"]
    unseal(meta)
    meta["search_params"] = "nprobe=1"  # the edit the digest would have found
    (bundle / "meta.json").write_text(json.dumps(meta))
    code, out, err = run_cli(["index", "--verify", str(bundle)], monkeypatch, capsys)
    assert code == 1 and out == "" and EDITED in one_error(err)
    pytest.importorskip("uvicorn")
    code, out, err = run_cli(["serve", str(bundle), "--port", "0"], monkeypatch, capsys)
    assert code == 1 and out == "" and EDITED in one_error(err)


def test_the_seal_marker_is_covered_and_an_older_writers_rewrite_is_not_taken_for_damage(
    tmp_path: Path,
) -> None:
    """Deleting "sealed" alone is an edit the digest finds; a rewrite by an older pactl (a new
    generation, both the marker and the record kept from the old one) is its writer's, as
    before."""
    bundle = float_bundle(tmp_path)
    meta = json.loads((bundle / "meta.json").read_text())
    (bundle / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "sealed"}))
    with pytest.raises(PactlError, match=EDITED):
        verify_bundle(bundle)
    from pactl.store.checksums import check_meta, sealed

    rewritten = {**meta, "generation": ".pactl-gen-newer"}
    assert not sealed(rewritten)
    assert check_meta(rewritten, bundle / "meta.json", "fix") is False


def overwrite_rows(npy: Path, rows: np.ndarray) -> None:
    """Write new rows into an .npy file in place (same inode, same size), as a user's own
    tool that rewrites the vectors folder's file would."""
    header = np.load(npy, mmap_mode="r").offset
    with open(npy, "r+b") as f:
        f.seek(header)
        f.write(np.ascontiguousarray(rows, dtype=np.float32).tobytes())


def test_writing_the_vectors_file_after_a_binary_build_leaves_the_bundle_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = binary_bundle(tmp_path, monkeypatch, capsys)
    vectors = tmp_path / "v" / "vectors.npy"
    queries = np.load(vectors)[:10].copy()
    before = search(load_bundle(bundle), queries, 5)
    other = unit(np.random.default_rng(9).standard_normal((60, 32)))
    overwrite_rows(vectors, other)
    after = search(load_bundle(bundle), queries, 5)
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_array_equal(after[0], before[0])
    assert verify_bundle(bundle) is not None  # nothing of the bundle changed
    floats = bundle / ".pactl-current" / "floats.npy"
    assert floats.stat().st_nlink == 1 and not os.path.samefile(floats, vectors)


def test_a_bundle_file_hard_linked_from_outside_is_refused_by_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As an older pactl left a binary bundle: floats.npy a hard link to vectors.npy (the same
    bytes, so every checksum matches)."""
    bundle = binary_bundle(tmp_path, monkeypatch, capsys)
    floats = (bundle / ".pactl-current" / "floats.npy").resolve()
    floats.unlink()
    os.link(tmp_path / "v" / "vectors.npy", floats)
    load_bundle(bundle)  # it still opens and answers
    code, out, err = run_cli(["index", "--verify", str(bundle)], monkeypatch, capsys)
    line = one_error(err)
    assert code == 1 and out == "" and "floats.npy is a hard link to a file outside" in line


def test_files_linked_between_the_bundles_own_generations_are_its_own(tmp_path: Path) -> None:
    """A delete links the unchanged files into the new generation; a kill before the old one
    is removed leaves both: those links are the bundle's, not shared with anything outside."""
    from pactl.index import delete_items
    from pactl.store.checksums import shared_outside

    bundle = float_bundle(tmp_path)
    old = (bundle / ".pactl-current").resolve()
    keep = tmp_path / "old-generation"
    os.link(old / "index.faiss", keep)  # held outside while the generation is replaced
    delete_items(bundle, ids=[3])
    keep.unlink()
    gen = (bundle / ".pactl-current").resolve()
    twin = bundle / (old.name)
    twin.mkdir()
    os.link(gen / "index.faiss", twin / "index.faiss")  # the previous generation, not removed
    assert shared_outside(bundle, gen) == []
    os.link(gen / "items.csv", tmp_path / "elsewhere.csv")
    assert shared_outside(bundle, gen) == ["items.csv"]
