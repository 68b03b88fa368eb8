"""Bundle integrity: meta.json records blake2b-256 checksums of the bundle's files; a full check
finds same-size tampering and names the file; every open refuses label codes out of range
(a damaged items.bin) instead of failing later; bundles without checksums still open."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import one_error, run_cli
from test_hostile_cli import tiny_bundle

from pactl.errors import PactlError
from pactl.index import delete_items, load_bundle, verify_bundle


def meta_of(bundle: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((bundle / "meta.json").read_text())


def flip(file: Path, at: int) -> None:
    """One byte changed in place: the size stays, so only the content can tell."""
    data = bytearray(file.read_bytes())
    data[at] ^= 0x5A
    file.write_bytes(bytes(data))


def section_offset(items_bin: Path, name: str) -> int:
    """Where a section of items.bin starts, read from its header as its docstring lays out."""
    data = items_bin.read_bytes()
    size = int.from_bytes(data[8:16], "little")
    header = json.loads(data[16 : 16 + size])
    start = -(-(16 + size) // 64) * 64
    return int(start + header["sections"][name][1])


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A Flat bundle of 8 random unit vectors in 4 labels, written by the library (no network)."""
    import faiss

    from pactl.index import save_bundle

    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(16))
    index.add_with_ids(x, np.arange(8, dtype=np.int64))
    rows = [(i, f"/photos/{i}.png", f"c{i % 4}") for i in range(8)]
    save_bundle(tmp_path / "b", index, rows, {"fingerprint": "f" * 64, "factory": "Flat"})
    return tmp_path / "b"


def test_meta_records_each_files_blake2b(bundle: Path) -> None:
    meta = meta_of(bundle)
    record = meta["checksums"]
    assert record["algorithm"] == "blake2b-256" and record["generation"] == meta["generation"]
    assert {"index.faiss", "items.bin", "items.csv"} <= set(record["files"])
    for name, digest in record["files"].items():
        assert hashlib.blake2b((bundle / name).read_bytes(), digest_size=32).hexdigest() == digest
    checked = verify_bundle(bundle)
    assert checked is not None and set(checked.files) == set(record["files"])


@pytest.mark.parametrize("name", ["index.faiss", "items.bin"])
def test_same_size_tampering_is_found_by_verify_and_named(bundle: Path, name: str) -> None:
    file = bundle / name
    at = file.stat().st_size - 3 if name == "index.faiss" else section_offset(file, "path_bytes")
    flip(file, at)
    load_bundle(bundle)  # the cheap checks of an open cannot see it
    with pytest.raises(PactlError, match=f"{name} is damaged"):
        verify_bundle(bundle)


def damage_label_codes(bundle: Path) -> None:
    file = bundle / "items.bin"
    at = section_offset(file, "label_codes")
    data = bytearray(file.read_bytes())
    data[at : at + 4] = (1000).to_bytes(4, "little")  # 4 labels: code 1000 names none
    file.write_bytes(bytes(data))


def test_label_codes_out_of_range_are_refused_on_open(bundle: Path) -> None:
    damage_label_codes(bundle)
    with pytest.raises(PactlError, match="items.bin is damaged: a label code"):
        load_bundle(bundle)


def test_a_query_on_damaged_label_codes_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tiny_bundle(tmp_path, monkeypatch, capsys)
    damage_label_codes(bundle)
    image = str(tmp_path / "imgs" / "class_0" / "0.png")
    code, out, err = run_cli(["query", image, "--index", str(bundle)], monkeypatch, capsys)
    assert code == 1 and out == "" and "items.bin is damaged" in one_error(err)


def test_a_delete_keeps_the_record_true_and_damage_found(bundle: Path) -> None:
    delete_items(bundle, ids=[0])
    assert verify_bundle(bundle) is not None
    flip(bundle / "items.bin", section_offset(bundle / "items.bin", "path_bytes"))
    delete_items(bundle, ids=[1])  # carries the recorded digest of the linked file over
    with pytest.raises(PactlError, match="items.bin is damaged"):
        verify_bundle(bundle)


def test_bundles_without_checksums_still_open(bundle: Path) -> None:
    meta = meta_of(bundle)
    del meta["checksums"], meta["sealed"]  # as a pactl before checksums wrote it
    (bundle / "meta.json").write_text(json.dumps(meta))
    assert verify_bundle(bundle) is None and len(load_bundle(bundle).items) == 8
    meta["checksums"] = {"algorithm": "blake2b-256", "generation": "another", "files": {}}
    (bundle / "meta.json").write_text(json.dumps(meta))  # left by a rewrite of an older pactl
    assert verify_bundle(bundle) is None


def test_index_verify_says_what_it_checked_and_names_damage(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["index", "--verify", str(bundle)], monkeypatch, capsys)
    files = meta_of(bundle)["checksums"]["files"]
    size = sum((bundle / name).stat().st_size for name in files)
    assert code == 0, err
    assert (
        out.strip()
        == f"verified {bundle}: {len(files)} files ({size:,} bytes) match their checksums"
        " and so do meta.json's fields"
    )
    flip(bundle / "index.faiss", (bundle / "index.faiss").stat().st_size - 3)
    code, out, err = run_cli(["index", "--verify", str(bundle)], monkeypatch, capsys)
    assert code == 1 and out == "" and f"{bundle}/index.faiss is damaged" in one_error(err)


def test_index_verify_of_a_bundle_without_checksums(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = meta_of(bundle)
    del meta["checksums"], meta["sealed"]  # as a pactl before checksums wrote it
    (bundle / "meta.json").write_text(json.dumps(meta))
    code, out, err = run_cli(["index", "--verify", str(bundle)], monkeypatch, capsys)
    assert code == 0 and "no checksums recorded" in out, err
    code, _, err = run_cli(["index", "--verify", str(bundle), "--compact"], monkeypatch, capsys)
    assert code == 2 and "--verify goes alone" in one_error(err)


def test_serve_refuses_a_damaged_bundle_at_start(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("uvicorn")
    flip(bundle / "items.bin", section_offset(bundle / "items.bin", "path_bytes"))
    code, out, err = run_cli(["serve", str(bundle), "--port", "0"], monkeypatch, capsys)
    assert code == 1 and "items.bin is damaged" in one_error(err)


def blake2b_of(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def test_file_digest_hashes_every_chunk_and_reports_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards against a digest of part of the file, or a file read whole (memory of its size)
    with one progress step: 7-byte chunks over 50 bytes are 8 steps of at most 7 bytes."""
    from pactl.store import checksums

    data = bytes(np.random.default_rng(1).integers(0, 256, 50, dtype=np.uint8))
    (tmp_path / "f").write_bytes(data)
    monkeypatch.setattr(checksums, "BLOCK_BYTES", 7)
    steps: list[int] = []
    assert checksums.file_digest(tmp_path / "f", steps.append) == blake2b_of(data)
    assert steps == [7] * 7 + [1]
    assert checksums.file_digest(tmp_path / "f") == blake2b_of(data)


def test_record_hashes_new_files_and_carries_known_digests_over(tmp_path: Path) -> None:
    """Guards against a carried-over digest being hashed again (a linked file's damage would
    then be recorded as true) or a new file left unhashed: the known digest, deliberately not
    the file's, is kept as given, the other file's is its blake2b."""
    from pactl.store.checksums import record

    gen = tmp_path / "gen-0003"
    gen.mkdir()
    (gen / "a.bin").write_bytes(b"alpha")
    (gen / "b.bin").write_bytes(b"beta")
    got = record(gen, ["b.bin", "a.bin"], known={"a.bin": "0" * 64})
    assert got == {
        "algorithm": "blake2b-256",
        "generation": "gen-0003",
        "files": {"a.bin": "0" * 64, "b.bin": blake2b_of(b"beta")},
    }
    assert record(gen, ["a.bin"])["files"] == {"a.bin": blake2b_of(b"alpha")}


def test_recorded_ignores_a_record_of_another_algorithm_or_without_files() -> None:
    """Guards against a record in another algorithm being compared with blake2b digests (every
    file then reported damaged): it counts as none, as does one whose files are no mapping."""
    from pactl.store.checksums import recorded

    files = {"a.bin": "ab" * 32, "b.bin": 3}

    def meta(**fields: object) -> dict:  # type: ignore[type-arg]
        return {"generation": "g1", "checksums": {"generation": "g1", **fields}}

    assert recorded(meta(algorithm="blake2b-256", files=files)) == {"a.bin": "ab" * 32}
    assert recorded(meta(algorithm="sha256", files=files)) is None
    assert recorded(meta(algorithm="blake2b-256", files=["a.bin"])) is None
    assert recorded({"generation": "g2", "checksums": meta(files=files)["checksums"]}) is None


def test_check_reports_every_byte_hashed_and_their_total(tmp_path: Path) -> None:
    """Guards against a check that hashes without telling its progress, or miscounts the bytes
    it names: the steps sum to the files' sizes, which Checked.size gives."""
    from pactl.store.checksums import check

    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"y" * 3)
    digests = {"b": blake2b_of(b"y" * 3), "a": blake2b_of(b"x" * 10)}
    steps: list[int] = []
    checked = check(tmp_path, digests, Path("shown"), "rebuild", steps.append)
    assert sorted(steps) == [3, 10] and checked.size == 13 and checked.files == ("a", "b")
    with pytest.raises(PactlError, match="shown/a is damaged.*: rebuild"):
        check(tmp_path, {"a": blake2b_of(b"z")}, Path("shown"), "rebuild", steps.append)
