"""The item table: sizes and mtimes carried through, items.bin against its input, old bundles."""

from __future__ import annotations

import json
import mmap
import os
import tracemalloc
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest

from pactl.errors import PactlError
from pactl.index import ITEMS_FILE, META_FILE, ItemTable, load_bundle, save_bundle
from pactl.index.search import hits
from pactl.store.generations import current_dir
from pactl.store.item_table import TABLE_FILE, Strings

# names a CSV or a careless decoder would mangle; the last is not UTF-8
AWKWARD = [
    "/data/a,b.jpg",
    '/data/say "cheese".jpg',
    "/data/two\nlines.jpg",
    "/data/cr\r.jpg",
    "/data/ünï cødé 写真.jpg",
    os.fsdecode(b"/data/latin1-\xe9\xff.jpg"),
    "",
]


def rows_of(n: int, rng: np.random.Generator) -> list[tuple[int, str, str, int, int]]:
    """n rows with shuffled sparse ids, awkward names, empty and repeated labels."""
    ids = rng.choice(10**12, size=n, replace=False)
    labels = ["", "cat", "dog,wet", 'say "hi"', "x\ny"]
    rows = []
    for i, item in enumerate(ids.tolist()):
        path = AWKWARD[i % len(AWKWARD)] + f"_{i}" if i % 3 else f"/data/photos/{i}.jpg"
        size = -1 if i % 11 == 0 else int(rng.integers(0, 2**40))
        mtime = -1 if i % 13 == 0 else int(rng.integers(0, 2**62))
        rows.append((item, path, labels[i % len(labels)], size, mtime))
    return rows


def columns(table: ItemTable) -> list[list[Any]]:
    return [
        table.ids.tolist(),
        table.paths.tolist(),
        table.labels.tolist(),
        table.sizes.tolist(),
        table.mtimes.tolist(),
    ]


def expected(rows: list[tuple[int, str, str, int, int]]) -> list[list[Any]]:
    return [list(c) for c in zip(*rows, strict=True)]


def flat_index(n: int, ids: np.ndarray) -> Any:
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(4))
    vectors = np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32)
    index.add_with_ids(vectors, ids)
    return index


def test_rows_round_trip_through_csv_and_table(tmp_path: Path) -> None:
    rows = rows_of(500, np.random.default_rng(1))
    table = ItemTable.from_rows(rows)
    assert columns(table) == expected(rows)
    table.write(tmp_path / "items.csv")
    assert columns(ItemTable.read(tmp_path / "items.csv")) == expected(rows)
    table.save(tmp_path / TABLE_FILE)
    opened = ItemTable.open(tmp_path / TABLE_FILE)
    assert columns(opened) == expected(rows)
    for i in (0, 5, 6, 499, -1):  # single rows decode alone, the same as in bulk
        assert opened.paths[i] == rows[i][1] and opened.labels[i] == rows[i][2]
    assert os.fsencode(opened.paths[5]) == b"/data/latin1-\xe9\xff.jpg_5"  # the exact bytes


def test_three_column_rows_and_old_csv_have_unknown_stats(tmp_path: Path) -> None:
    table = ItemTable.from_rows([(4, "a", "x"), (2, "b", "")])
    assert table.sizes.tolist() == [-1, -1] and table.mtimes.tolist() == [-1, -1]
    (tmp_path / "old.csv").write_text("id,path,label\n7,p,l\n8,q\n")
    old = ItemTable.read(tmp_path / "old.csv")
    assert columns(old) == [[7, 8], ["p", "q"], ["l", ""], [-1, -1], [-1, -1]]
    (tmp_path / "bad.csv").write_text("id,path,label,size,mtime_ns\n7,p,l,big,1\n")
    with pytest.raises(PactlError, match="size 'big' is not an integer"):
        ItemTable.read(tmp_path / "bad.csv")


def test_join_take_and_positions_against_brute_force(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    rows = rows_of(3_000, rng)
    parts = [ItemTable.from_rows(rows[:1000]), ItemTable.from_rows(rows[1000:])]
    parts[1].save(tmp_path / TABLE_FILE)
    joined = ItemTable.join([parts[0], ItemTable.open(tmp_path / TABLE_FILE)])
    assert columns(joined) == expected(rows)
    assert columns(parts[0].concat(parts[1])) == expected(rows)
    keep = rng.random(len(rows)) < 0.5
    assert columns(joined.take(keep)) == expected([r for r, k in zip(rows, keep, strict=True) if k])
    assert joined.paths[keep].tolist() == [r[1] for r, k in zip(rows, keep, strict=True) if k]
    ids = [r[0] for r in rows]
    wanted = np.concatenate([rng.choice(ids, 399), [-1, 10**12 + 5, 3]]).reshape(-1, 3)
    reference = {item: pos for pos, item in enumerate(ids)}
    for table in (joined, _saved(joined, tmp_path / "all.bin")):
        got = table.positions(wanted)
        assert got.shape == wanted.shape
        assert got.ravel().tolist() == [reference.get(int(i), -1) for i in wanted.ravel()]
        assert table.max_id() == max(ids)
    identity = _saved(ItemTable.from_rows([(i, f"p{i}", "") for i in range(10)]), tmp_path / "i")
    assert identity.positions(np.array([0, 9, 10, -1])).tolist() == [0, 9, -1, -1]
    assert identity.max_id() == 9
    empty = _saved(ItemTable.from_rows([]), tmp_path / "empty.bin")
    assert len(empty) == 0 and empty.positions(np.array([0])).tolist() == [-1]
    assert empty.max_id() == -1 and empty.paths.tolist() == []


def _saved(table: ItemTable, path: Path) -> ItemTable:
    table.save(path)
    return ItemTable.open(path)


def test_bundle_maps_items_bin_and_reads_old_bundles(tmp_path: Path) -> None:
    rows = rows_of(300, np.random.default_rng(3))
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    save_bundle(tmp_path / "b", flat_index(len(rows), ids), rows, {})
    meta = json.loads((tmp_path / "b" / META_FILE).read_text())
    assert meta["files"][TABLE_FILE] == (tmp_path / "b" / TABLE_FILE).stat().st_size
    assert isinstance(load_bundle(tmp_path / "b").items.paths._blob.base.obj, mmap.mmap)
    assert columns(load_bundle(tmp_path / "b").items) == expected(rows)
    bundle = load_bundle(tmp_path / "b")
    picked = [7, 5, 299, 0]
    found = hits(bundle, ["q"], np.ones((1, 4), np.float32), ids[picked][None, :])[0]
    assert [(h.id, h.path, h.label) for h in found] == [rows[i][:3] for i in picked]
    export = ItemTable.read(tmp_path / "b" / ITEMS_FILE)  # the CSV export says the same
    assert columns(export) == expected(rows)
    # a bundle of an older pactl: items.csv only, and no record of items.bin in meta.json
    gen = current_dir(tmp_path / "b")
    (gen / TABLE_FILE).unlink()
    del meta["files"][TABLE_FILE]
    (gen / META_FILE).write_text(json.dumps(meta))
    assert columns(load_bundle(tmp_path / "b").items) == expected(rows)
    csv_bytes = (gen / ITEMS_FILE).read_bytes()  # and it is items.csv that is read:
    (gen / ITEMS_FILE).write_bytes(csv_bytes.replace(b"/photos/", b"/PHOTOS/"))  # same size
    assert load_bundle(tmp_path / "b").items.paths[0] == rows[0][1].replace("photos", "PHOTOS")


def test_tampered_table_is_refused_in_one_line(tmp_path: Path) -> None:
    rows = [(i, f"/p/{i}.jpg", "l") for i in range(50)]
    save_bundle(tmp_path / "b", flat_index(50, np.arange(50)), rows, {})
    table = (tmp_path / "b" / TABLE_FILE).resolve()
    data = table.read_bytes()
    table.write_bytes(data[:-8])
    with pytest.raises(PactlError, match=f"{TABLE_FILE} is truncated or corrupt") as caught:
        load_bundle(tmp_path / "b")
    assert "\n" not in str(caught.value)
    table.write_bytes(data)
    assert load_bundle(tmp_path / "b").items.paths[49] == "/p/49.jpg"
    # opened without the size check: every cut of the file is refused, never read past its end
    cut = tmp_path / "cut.bin"
    for end in (0, 7, 16, 40, len(data) // 2, len(data) - 1):
        cut.write_bytes(data[:end])
        with pytest.raises(PactlError) as caught:
            ItemTable.open(cut)
        assert "\n" not in str(caught.value) and str(cut) in str(caught.value)
    cut.write_bytes(data.replace(b'"version": 1', b'"version": 9', 1))
    with pytest.raises(PactlError, match="version 9"):
        ItemTable.open(cut)


def test_opening_decodes_no_path(tmp_path: Path) -> None:
    n = 20_000
    ItemTable.from_rows(
        [(i, f"/data/photos/c{i % 7}/img_{i:07d}.jpg", "c") for i in range(n)]
    ).save(tmp_path / TABLE_FILE)
    tracemalloc.start()
    table = ItemTable.open(tmp_path / TABLE_FILE)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 64 * 1024  # decoding the paths would take over 1 MB; the mapping is not traced
    assert isinstance(table.paths, Strings)
    assert table.paths[12_345] == "/data/photos/c4/img_0012345.jpg"
