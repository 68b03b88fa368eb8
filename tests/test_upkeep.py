"""Keeping a bundle up to date: deletes (tombstones every search skips), compaction, and an --add
that replaces the vector of a changed file; each checked against brute force over the live
vectors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest
from conftest import clustered, make_class_folder, one_error, run_cli, unit
from PIL import Image

from pactl.config import IndexConfig
from pactl.console import QUIET
from pactl.embed import read_embedded
from pactl.errors import PactlError
from pactl.index import (
    BUNDLE_FILES,
    DELETED_FILE,
    INDEX_FILE,
    ITEMS_FILE,
    REMOVED_FILE,
    add_to_bundle,
    build_index,
    build_ondisk_index,
    bundle_count,
    compact_bundle,
    delete_items,
    load_bundle,
    rebuild_facts,
    save_bundle,
    write_bundle,
)
from pactl.index.search import PathIndex, search
from pactl.store.generations import current_dir, generation_of

N, DIM, QUERIES, K = 600, 16, 40, 10
MODEL = ["--backbone", "small", "--weights", "none", "--image-size", "16"]
FINGERPRINT = "f" * 64
# Search settings that make the approximate kinds (near) exhaustive on N items, so brute force
# over the live vectors is the reference for all of them.
KINDS = {
    "Flat": "",
    "IVF16,Flat": "nprobe=16",
    "HNSW16,Flat": "efSearch=600",
}


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20261203)
    centres = unit(rng.standard_normal((12, DIM)))
    return clustered(rng, N, centres, 1.0), clustered(rng, QUERIES, centres, 1.0)


def rows(n: int, start: int = 0) -> list[tuple[int, str, str]]:
    return [(i, f"/photos/{i}.png", f"c{i % 5}") for i in range(start, start + n)]


def make_bundle(out: Path, base: np.ndarray, factory: str) -> Path:
    index, record = build_index(base, IndexConfig(factory=factory), QUIET)
    save_bundle(out, index, rows(len(base)), {"fingerprint": FINGERPRINT, **record})
    return out


def opened(bundle_dir: Path, factory: str) -> Any:
    bundle = load_bundle(bundle_dir)
    if KINDS[factory]:
        faiss.ParameterSpace().set_index_parameters(bundle.index, KINDS[factory])
    return bundle


def brute_force(
    base: np.ndarray, queries: np.ndarray, live: np.ndarray, k: int, own: np.ndarray | None = None
) -> np.ndarray:
    """Ids of the k best live vectors of each query in float64, its own id left out."""
    scores = queries.astype(np.float64) @ base[live].astype(np.float64).T
    if own is not None:
        scores[live[None, :] == own[:, None]] = -np.inf
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return live[order]


def hard_to_serve(base: np.ndarray, queries: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Tombstones that hurt: the 8 true nearest of every other query (so a row of k=10 needs a
    deeper second search) and a random 15% of the rest."""
    nearest = brute_force(base, queries[::2], np.arange(N), 8).ravel()
    some = rng.choice(N, size=N * 15 // 100, replace=False)
    return np.union1d(nearest, some)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth)]))  # noqa: B905


# ---------------------------------------------------------------------------- searches skip them


@pytest.mark.parametrize("factory", list(KINDS))
def test_deleted_ids_are_never_returned(factory: str, tmp_path: Path, data: Any) -> None:
    base, queries = data
    bundle_dir = make_bundle(tmp_path / "b", base, factory)
    dead = hard_to_serve(base, queries, np.random.default_rng(1))
    assert delete_items(bundle_dir, ids=dead.tolist()) == len(dead)
    live = np.setdiff1d(np.arange(N), dead)
    bundle = opened(bundle_dir, factory)
    np.testing.assert_array_equal(bundle.deleted, dead)
    assert bundle.live_count == bundle_count(bundle_dir) == len(live)
    assert bundle.index.ntotal == N  # tombstones: still in the index until compaction

    scores, ids = search(bundle, queries, K, batch_size=7)
    truth = brute_force(base, queries, live, K)
    assert not np.isin(ids, dead).any()
    assert (ids >= 0).all()  # k live hits in every row, although many of the best are deleted
    if factory == "HNSW16,Flat":
        assert recall(ids, truth) >= 0.99
    else:
        np.testing.assert_array_equal(ids, truth)
    assert (np.diff(scores, axis=1) <= 1e-6).all()

    # Base vectors as queries, their own item excluded (by id, a live or a deleted one).
    own = np.array([int(live[0]), int(dead[0]), int(live[5]), -1], dtype=np.int64)
    _, self_ids = search(bundle, base[own], K, exclude_ids=own)
    assert not np.isin(self_ids, dead).any() and not (self_ids == own[:, None]).any()
    if factory != "HNSW16,Flat":
        np.testing.assert_array_equal(self_ids, brute_force(base, base[own], live, K, own))


def test_k_is_capped_by_the_live_items(tmp_path: Path, data: Any) -> None:
    base, queries = data
    bundle_dir = make_bundle(tmp_path / "b", base, "Flat")
    live = np.array([3, 77, 150, 151, 299, 300, 420, 421, 500, 555, 598, 599])
    delete_items(bundle_dir, ids=np.setdiff1d(np.arange(N), live).tolist())
    bundle = load_bundle(bundle_dir)
    _, ids = search(bundle, queries, K)
    np.testing.assert_array_equal(ids, brute_force(base, queries, live, K))
    _, wide = search(bundle, queries, 500)
    assert wide.shape == (QUERIES, len(live))
    np.testing.assert_array_equal(wide, brute_force(base, queries, live, len(live)))
    _, own = search(bundle, base[live[:2]], 500, exclude_ids=live[:2])
    assert own.shape == (2, len(live) - 1) and set(own[0]) == set(live) - {live[0]}
    _, own = search(bundle, base[:2], 500, exclude_ids=np.array([0, 1]))  # deleted themselves
    np.testing.assert_array_equal(own, brute_force(base, base[:2], live, len(live)))


# ---------------------------------------------------------------------------- delete_items


def test_delete_by_path_and_by_id(
    tmp_path: Path, data: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, _ = data
    bundle_dir = make_bundle(tmp_path / "b", base, "Flat")
    before = current_dir(bundle_dir)
    inodes = [(before / name).stat().st_ino for name in (INDEX_FILE, ITEMS_FILE)]
    paths = ["/photos/7.png", "/photos/../photos/9.png"]
    assert delete_items(bundle_dir, ids=[4], paths=paths) == 3
    after = current_dir(bundle_dir)
    assert after != before and not before.exists()
    # The unchanged index and items.csv are hard links to the previous generation's files.
    assert [(after / name).stat().st_ino for name in (INDEX_FILE, ITEMS_FILE)] == inodes
    bundle = load_bundle(bundle_dir)
    np.testing.assert_array_equal(bundle.deleted, [4, 7, 9])
    assert bundle.meta["deleted"] == 3 and bundle.meta["count"] == N - 3
    assert json.loads((bundle_dir / "meta.json").read_text())["files"][DELETED_FILE] > 0
    # Deleting again is no error and writes nothing.
    gen = generation_of(bundle_dir)
    assert delete_items(bundle_dir, ids=[4, 7], paths=["/photos/9.png"]) == 0
    assert generation_of(bundle_dir) == gen
    # A relative path is taken from the working folder, as `pactl query --exclude-self` does.
    monkeypatch.chdir(tmp_path)
    relative = tmp_path / "rel"
    index, record = build_index(base[:20], IndexConfig(factory="Flat"), QUIET)
    save_bundle(relative, index, [(i, str(tmp_path / f"{i}.png"), "") for i in range(20)], record)
    assert delete_items(relative, paths=["3.png", "./5.png"]) == 2
    np.testing.assert_array_equal(load_bundle(relative).deleted, [3, 5])


def test_delete_refuses_what_the_bundle_lacks(tmp_path: Path, data: Any) -> None:
    base, _ = data
    bundle_dir = make_bundle(tmp_path / "b", base, "Flat")
    gen = generation_of(bundle_dir)
    with pytest.raises(PactlError, match=r"no item with id 600 in bundle"):
        delete_items(bundle_dir, ids=[1, 600])
    with pytest.raises(PactlError, match=r"has the path /photos/nope\.png"):
        delete_items(bundle_dir, ids=[1], paths=["/photos/nope.png"])
    assert generation_of(bundle_dir) == gen  # nothing at all was deleted
    assert len(load_bundle(bundle_dir).deleted) == 0
    with pytest.raises(PactlError, match="does not exist"):
        delete_items(tmp_path / "none", ids=[1])


def test_tombstones_survive_an_add_and_a_reload_checks_them(tmp_path: Path, data: Any) -> None:
    base, queries = data
    bundle_dir = make_bundle(tmp_path / "b", base[:500], "Flat")
    delete_items(bundle_dir, ids=[1, 2, 3])
    # An add that also replaces item 10 (its file changed): one new generation does both.
    new_rows = [(i, f"/photos/{i}.png", "") for i in range(500, 600)]
    new_rows[0] = (500, "/photos/10.png", "")
    add_to_bundle(bundle_dir, base[500:], new_rows, {"fingerprint": FINGERPRINT}, replaces=[10])
    bundle = load_bundle(bundle_dir)
    np.testing.assert_array_equal(bundle.deleted, [1, 2, 3, 10])
    assert bundle.live_count == bundle_count(bundle_dir) == 600 - 4
    _, ids = search(bundle, queries, K)
    live = np.setdiff1d(np.arange(N), [1, 2, 3, 10])
    np.testing.assert_array_equal(ids, brute_force(base, queries, live, K))
    # The path of a replaced file now names its new item, not the deleted one.
    assert PathIndex(bundle.items).ids(["/photos/10.png"]).tolist() == [500]
    assert PathIndex(bundle.items, skip=bundle.deleted).ids(["/photos/1.png"]).tolist() == [-1]
    assert delete_items(bundle_dir, paths=["/photos/10.png"]) == 1
    assert 500 in load_bundle(bundle_dir).deleted
    with pytest.raises(PactlError, match="no item with id 9999"):
        add_to_bundle(
            bundle_dir, base[:1], [(700, "/x", "")], {"fingerprint": FINGERPRINT}, None, [9999]
        )


def test_a_damaged_tombstone_file_is_refused(tmp_path: Path, data: Any) -> None:
    base, _ = data
    bundle_dir = make_bundle(tmp_path / "b", base[:50], "Flat")
    delete_items(bundle_dir, ids=[1, 2])
    tombstones = current_dir(bundle_dir) / DELETED_FILE
    tombstones.unlink()
    np.save(tombstones, np.array([1, 77], dtype=np.int64))  # same size, an id that is no item
    with pytest.raises(PactlError, match="names id 77, not an item"):
        load_bundle(bundle_dir)
    tombstones.unlink()
    with pytest.raises(PactlError, match=f"lacks {DELETED_FILE}"):
        load_bundle(bundle_dir)


def test_an_old_bundle_without_tombstones_loads(tmp_path: Path, data: Any) -> None:
    """A bundle written before deletes existed: no deleted.npy, no "deleted" in meta.json, and
    (older still) a flat folder without generations."""
    base, queries = data
    bundle_dir = make_bundle(tmp_path / "b", base[:100], "Flat")
    flat = tmp_path / "flat"
    flat.mkdir()
    gen = current_dir(bundle_dir)
    for name in ("index.faiss", "items.csv"):
        shutil.copyfile(gen / name, flat / name)
    meta = json.loads((gen / "meta.json").read_text())
    for key in ("deleted", "generation", "files"):
        del meta[key]
    (flat / "meta.json").write_text(json.dumps(meta))
    bundle = load_bundle(flat)
    assert len(bundle.deleted) == 0 and bundle.live_count == bundle_count(flat) == 100
    np.testing.assert_array_equal(
        search(bundle, queries, K)[1], brute_force(base, queries, np.arange(100), K)
    )
    assert delete_items(flat, ids=[0]) == 1  # and it can be kept up to date from there
    assert load_bundle(flat).deleted.tolist() == [0]
    assert compact_bundle(flat)["count"] == 99


# ---------------------------------------------------------------------------- compaction


@pytest.mark.parametrize(
    ("factory", "method"),
    [("Flat", "remove_ids"), ("IVF16,Flat", "remove_ids"), ("HNSW16,Flat", "rebuilt")],
)
def test_compact_equals_a_fresh_build(factory: str, method: str, tmp_path: Path, data: Any) -> None:
    base, queries = data
    bundle_dir = make_bundle(tmp_path / "b", base, factory)
    dead = hard_to_serve(base, queries, np.random.default_rng(2))
    delete_items(bundle_dir, ids=dead.tolist())
    live = np.setdiff1d(np.arange(N), dead)
    done = compact_bundle(bundle_dir)
    assert done == {"removed": len(dead), "count": len(live), "method": method}
    bundle = opened(bundle_dir, factory)
    assert bundle.index.ntotal == len(bundle.items) == len(live) == bundle_count(bundle_dir)
    assert len(bundle.deleted) == 0 and not (bundle_dir / DELETED_FILE).exists()
    np.testing.assert_array_equal(bundle.items.ids, live)
    assert bundle.items.paths.tolist() == [f"/photos/{i}.png" for i in live]
    assert bundle.meta["search_params"] == load_bundle(bundle_dir).meta["search_params"]
    # The vectors left are exactly the live ones (HNSW's rebuild re-adds what it held).
    if factory != "IVF16,Flat":
        np.testing.assert_allclose(bundle.index.reconstruct_batch(live), base[live], atol=1e-6)
    truth = brute_force(base, queries, live, K)
    _, ids = search(bundle, queries, K)
    fresh, _ = build_index(base[live], IndexConfig(factory=factory), QUIET, ids=live)
    if KINDS[factory]:
        faiss.ParameterSpace().set_index_parameters(fresh, KINDS[factory])
    fresh_ids = fresh.search(queries, K)[1]
    if factory == "HNSW16,Flat":
        assert recall(ids, truth) >= 0.99 and recall(fresh_ids, truth) >= 0.99
    else:
        np.testing.assert_array_equal(ids, truth)
        np.testing.assert_array_equal(ids, fresh_ids)
    # Nothing left to compact: no new generation.
    gen = generation_of(bundle_dir)
    assert compact_bundle(bundle_dir)["method"] == "none" and generation_of(bundle_dir) == gen


def test_a_bundle_with_tombstones_is_one_an_older_pactl_refuses(tmp_path: Path, data: Any) -> None:
    # pactl versions that read bundle version 1 only know nothing of deleted.npy: they would
    # answer with deleted items, so a bundle holding tombstones says version 2, which they
    # refuse ("rebuild it"); one without tombstones stays readable to them.
    base, _ = data
    bundle_dir = make_bundle(tmp_path / "b", base, "Flat")

    def version() -> int:
        return int(json.loads((bundle_dir / "meta.json").read_text())["version"])

    assert version() == 1
    delete_items(bundle_dir, ids=[3])
    assert version() == 2 and load_bundle(bundle_dir).is_deleted(np.array([3]))[0]
    compact_bundle(bundle_dir)
    assert version() == 1


def test_the_items_compacted_away_are_carried_through_every_write(
    tmp_path: Path, data: Any
) -> None:
    base, _ = data
    bundle_dir = make_bundle(tmp_path / "b", base, "Flat")
    delete_items(bundle_dir, ids=[3, 7])
    compact_bundle(bundle_dir)
    assert (bundle_dir / REMOVED_FILE).is_file()
    delete_items(bundle_dir, ids=[11])  # a delete links it into the new generation
    assert load_bundle(bundle_dir).removed.ids.tolist() == [3, 7]
    new = unit(np.random.default_rng(4).standard_normal((1, DIM))).astype(np.float32)
    add_to_bundle(bundle_dir, new, rows(1, start=N), {"fingerprint": FINGERPRINT})
    removed = load_bundle(bundle_dir).removed  # an add writes it again
    assert removed.ids.tolist() == [3, 7] and removed.paths.tolist() == [
        "/photos/3.png",
        "/photos/7.png",
    ]
    compact_bundle(bundle_dir)  # a second compaction adds its own
    bundle = load_bundle(bundle_dir)
    assert bundle.removed.ids.tolist() == [3, 7, 11] and bundle.live_count == N - 2
    assert bundle.meta["ntotal"] == bundle.index.ntotal == N - 2  # meta.json follows every write
    assert rebuild_facts(bundle_dir).gone == {f"/photos/{i}.png" for i in (3, 7, 11)}
    # removed.bin is one of the generation's files: one cut short is refused, not half-read
    with open(bundle_dir / REMOVED_FILE, "r+b") as f:
        f.truncate(40)
    with pytest.raises(PactlError, match="removed.bin is truncated or corrupt"):
        load_bundle(bundle_dir)


def test_the_writer_lock_refuses_another_thread_as_another_process(
    tmp_path: Path, data: Any
) -> None:
    """A service's requests are threads of one process: the lock is re-entrant for the thread
    that holds it only, so two requests never write the same bundle at once."""
    import threading

    from pactl.errors import Busy
    from pactl.store.generations import writer_lock

    base, _ = data
    bundle_dir = make_bundle(tmp_path / "b", base, "Flat")
    seen: list[BaseException | int] = []

    def other() -> None:
        try:
            seen.append(delete_items(bundle_dir, ids=[1]))
        except BaseException as e:  # noqa: BLE001 - what the thread saw is the result
            seen.append(e)

    with writer_lock(bundle_dir):
        assert delete_items(bundle_dir, ids=[0]) == 1  # the holding thread: re-entrant
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert len(seen) == 1 and isinstance(seen[0], Busy)
    assert load_bundle(bundle_dir).deleted.tolist() == [0]
    other()  # once released, the other thread writes
    assert seen[1] == 1 and load_bundle(bundle_dir).deleted.tolist() == [0, 1]


def test_ids_removed_by_a_compaction_are_never_given_again(tmp_path: Path, data: Any) -> None:
    base, _ = data
    bundle_dir = make_bundle(tmp_path / "b", base, "Flat")
    top = list(range(N - 5, N))
    delete_items(bundle_dir, ids=top)
    compact_bundle(bundle_dir)
    bundle = load_bundle(bundle_dir)
    assert bundle.items.max_id() == N - 6 and bundle.next_id == N  # not N - 5
    assert json.loads((bundle_dir / "meta.json").read_text())["next_id"] == N
    new = unit(np.random.default_rng(9).standard_normal((2, base.shape[1]))).astype(np.float32)
    first = bundle.next_id
    add_to_bundle(bundle_dir, new, rows(2, start=first), {"fingerprint": FINGERPRINT})
    again = load_bundle(bundle_dir)
    assert again.items.ids[-2:].tolist() == [N, N + 1] and again.next_id == N + 2


def test_compact_an_on_disk_bundle(tmp_path: Path, data: Any) -> None:
    base, queries = data
    out = tmp_path / "b"
    ids = np.arange(N, dtype=np.int64)
    with new_gen(out) as gen:
        parts = [(base[:300], ids[:300]), (base[300:], ids[300:])]
        index, record = build_ondisk_index(parts, IndexConfig(factory="IVF16,Flat"), QUIET, gen)
        write_bundle(gen, index, rows(N), {"fingerprint": FINGERPRINT, **record})
    lists = (out / "index.ivfdata").stat()
    dead = hard_to_serve(base, queries, np.random.default_rng(3))
    delete_items(out, ids=dead.tolist())
    assert (out / "index.ivfdata").stat().st_ino == lists.st_ino  # linked, not copied
    live = np.setdiff1d(np.arange(N), dead)
    assert compact_bundle(out)["method"] == "copied"
    bundle = opened(out, "IVF16,Flat")
    assert bundle.meta["on_disk"] and bundle.index.ntotal == len(live)
    assert (out / "index.ivfdata").stat().st_size < lists.st_size  # packed, not holes
    _, found = search(bundle, queries, K)
    np.testing.assert_array_equal(found, brute_force(base, queries, live, K))
    assert not [p for p in current_dir(out).iterdir() if p.name.startswith(".")]


def test_compact_refuses_an_index_that_cannot_give_back_its_vectors(
    tmp_path: Path, data: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, _ = data
    bundle_dir = make_bundle(tmp_path / "b", base[:50], "HNSW16,Flat")
    delete_items(bundle_dir, ids=[1])
    gen = generation_of(bundle_dir)

    def cannot(*args: Any) -> None:
        raise RuntimeError("Error: reconstruct not implemented for this type of index")

    # HNSW cannot remove; with reconstruction gone too, nothing is left to compact with.
    monkeypatch.setattr(faiss.IndexIDMap2, "reconstruct_batch", cannot)
    with pytest.raises(PactlError, match=r"rebuild the bundle from the vectors folder"):
        compact_bundle(bundle_dir)
    assert generation_of(bundle_dir) == gen and load_bundle(bundle_dir).deleted.tolist() == [1]


def new_gen(out: Path) -> Any:
    from pactl.store.generations import new_generation

    return new_generation(out, BUNDLE_FILES)


# ---------------------------------------------------------------------------- the CLI


def small_bundle(tmp_path: Path, base: np.ndarray, n: int = 30) -> Path:
    """A Flat bundle whose items are tmp_path/img/<id>.png (relative: img/<id>.png)."""
    index, record = build_index(base[:n], IndexConfig(factory="Flat"), QUIET)
    items = [(i, str(tmp_path / "img" / f"{i}.png"), "") for i in range(n)]
    save_bundle(tmp_path / "b", index, items, {"fingerprint": FINGERPRINT, **record})
    return tmp_path / "b"


def test_cli_delete_and_compact(
    tmp_path: Path, data: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = data
    bundle_dir = small_bundle(tmp_path, base)
    b = str(bundle_dir)
    code, out, err = run_cli(
        ["index", b, "--delete", "3", "--delete", "img/5.png"], monkeypatch, capsys
    )
    assert (code, out) == (0, f"deleted 2 items from {b} (28 left)\n") and "deleted" not in err
    code, out, _ = run_cli(
        ["index", b, "--delete", "-", "-q"], monkeypatch, capsys, stdin="7\nimg/9.png\n\n"
    )
    assert (code, out) == (0, f"deleted 2 items from {b} (26 left)\n")
    assert load_bundle(bundle_dir).deleted.tolist() == [3, 5, 7, 9]
    # Unknown names: exit 1, one line naming it, nothing deleted.
    for name in ("img/none.png", "30", str(2**64)):  # past int64 too: a line, no traceback
        code, out, err = run_cli(
            ["index", b, "--delete", "1", "--delete", name], monkeypatch, capsys
        )
        assert code == 1 and out == "" and err.count("\n") == 1 and name.split("/")[-1] in err, err
    code, _, err = run_cli(["index", b, "--delete", "-"], monkeypatch, capsys, stdin="")
    assert code == 1 and "standard input" in err
    # `./11` names a file called 11, on stdin as on the command line; item 11 is not deleted.
    for how in (["--delete", "./11"], ["--delete", "-"]):
        code, _, err = run_cli(["index", b, *how], monkeypatch, capsys, stdin="./11\n")
        assert code == 1 and "has the path ./11" in err, err
    assert load_bundle(bundle_dir).deleted.tolist() == [3, 5, 7, 9]
    code, out, _ = run_cli(["index", b, "--compact"], monkeypatch, capsys)
    assert (code, out) == (0, f"compacted {b}: removed 4 deleted items (26 in all)\n")
    bundle = load_bundle(bundle_dir)
    assert len(bundle.items) == bundle.index.ntotal == 26 and len(bundle.deleted) == 0
    # Usage mistakes: exit 2.
    assert run_cli(["index", "--compact"], monkeypatch, capsys)[0] == 2
    assert run_cli(["index", b, "--delete", "1", "--add", b], monkeypatch, capsys)[0] == 2


def test_a_second_writer_is_refused_for_delete(
    tmp_path: Path, data: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = data
    bundle_dir = small_bundle(tmp_path, base)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from pathlib import Path\n"
            "from pactl.store.generations import writer_lock\n"
            f"with writer_lock(Path({str(bundle_dir)!r})):\n"
            "    print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        for args in (["--delete", "1"], ["--compact"]):
            code, _, err = run_cli(["index", str(bundle_dir), *args], monkeypatch, capsys)
            assert code == 1 and err.count("\n") == 1 and "another pactl process" in err
        with pytest.raises(PactlError, match="being written by another pactl process"):
            delete_items(bundle_dir, ids=[1])
        assert len(load_bundle(bundle_dir).deleted) == 0  # readers do not wait for the lock
    finally:
        holder.kill()
        holder.wait()
    assert delete_items(bundle_dir, ids=[1]) == 1


def test_add_replaces_the_vector_of_a_changed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pactl.verbs.query import query_chunks

    imgs = make_class_folder(tmp_path / "imgs", classes=2, per_class=3, seed=1)
    b = tmp_path / "b"
    code, _, err = run_cli(["index", str(imgs), *MODEL, "--out", str(b), "-q"], monkeypatch, capsys)
    assert code == 0, err
    target = imgs / "class_0" / "1.png"
    before = load_bundle(b)
    old_id = int(PathIndex(before.items).ids([str(target)])[0])
    assert old_id >= 0 and before.live_count == 6

    def best(k: int) -> list[Any]:
        chunk = next(query_chunks(b, [target], k, None, False, "cpu", QUIET))
        return chunk.hits[0]

    assert best(1)[0].id == old_id and best(1)[0].score > 0.999
    # Another picture under the same name (another size, and a later mtime).
    noise = np.random.default_rng(9).integers(0, 256, size=(24, 20, 3), dtype=np.uint8)
    Image.fromarray(noise).save(target)
    stat = target.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    code, out, err = run_cli(["index", str(imgs), "--add", str(b)], monkeypatch, capsys)
    assert code == 0, err
    assert out == f"added 0 items and replaced 1 changed one to {b} (6 in all)\n"
    after = load_bundle(b)
    new_id = int(PathIndex(after.items).ids([str(target)])[0])
    assert new_id == before.items.max_id() + 1
    assert after.deleted.tolist() == [old_id] and after.live_count == 6
    assert after.index.ntotal == len(after.items) == 7  # the old vector is a tombstone
    hits = best(10)
    assert hits[0].id == new_id and hits[0].score > 0.999  # the new picture finds itself
    assert old_id not in [h.id for h in hits] and len(hits) == 6
    # Unchanged now: nothing to embed; an unknown size/mtime (an older bundle) is unchanged too.
    code, out, _ = run_cli(["index", str(imgs), "--add", str(b)], monkeypatch, capsys)
    assert out == f"added 0 items to {b} (6 in all)\n"
    assert compact_bundle(b)["count"] == 6
    assert [h.id for h in best(6)][0] == new_id
    # A sweep of the folder after a delete leaves the deleted image out while it is unchanged.
    assert run_cli(["index", str(b), "--delete", str(target)], monkeypatch, capsys)[0] == 0
    code, out, err = run_cli(["index", str(imgs), "--add", str(b)], monkeypatch, capsys)
    assert out == f"added 0 items to {b} (5 in all)\n" and "1 image of" in err, err
    assert load_bundle(b).is_deleted(np.array([new_id]))[0]


def test_what_an_add_embeds(tmp_path: Path, data: Any) -> None:
    """New files, and changed ones (size or mtime differs from the recorded one); unknown
    size/mtime (-1, an older bundle) is taken as unchanged. A deleted file stays out while it
    is unchanged, and comes back as a new item once it changes."""
    from pactl.verbs.add import _to_embed

    base, _ = data
    files = [tmp_path / f"{i}.png" for i in range(5)]
    for i, f in enumerate(files):
        f.write_bytes(b"x" * (10 + i))
    mtime = files[1].stat().st_mtime_ns
    recorded = [
        (0, str(files[0]), ""),  # nothing recorded: unchanged
        (1, str(files[1]), "", 11, mtime),  # as recorded: unchanged
        (2, str(files[2]), "", 99, -1),  # another size: changed
        (3, str(files[3]), "", -1, mtime - 1),  # another mtime: changed
    ]
    index, record = build_index(base[:4], IndexConfig(factory="Flat"), QUIET)
    save_bundle(tmp_path / "b", index, recorded, {"fingerprint": FINGERPRINT, **record})
    new, changed, out = _to_embed(files, list("abcde"), load_bundle(tmp_path / "b"))
    assert [f for f, _ in new] == files[2:] and changed == {str(files[2]): 2, str(files[3]): 3}
    assert out == 0
    delete_items(tmp_path / "b", ids=[0, 1, 2])  # unknown stats, as recorded, changed since
    new, changed, out = _to_embed(files, list("abcde"), load_bundle(tmp_path / "b"))
    assert [f for f, _ in new] == files[2:] and changed == {str(files[3]): 3} and out == 2
    os.utime(files[1], ns=(mtime + 10**9, mtime + 10**9))  # touched: new content to pactl
    new, _, out = _to_embed(files, list("abcde"), load_bundle(tmp_path / "b"))
    assert [f for f, _ in new] == files[1:] and out == 1


def test_a_rebuild_keeps_deleted_images_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=3, per_class=4)
    model = ["--backbone", "small", "--weights", "none", "--image-size", "16"]
    vec, bundle_dir = tmp_path / "vec", tmp_path / "b"
    for args in (
        ["embed", str(imgs), *model, "--out", str(vec)],
        ["index", str(vec), "--out", str(bundle_dir)],
    ):
        assert run_cli(args, monkeypatch, capsys)[0] == 0
    paths = load_bundle(bundle_dir).items.paths.tolist()
    delete_items(bundle_dir, paths=[paths[0], paths[5]])
    for on_disk in ("no", "yes", "no"):  # tombstones again, so the next rebuild knows them
        args = ["index", str(vec), "--out", str(bundle_dir), "--on-disk", on_disk]
        args += [] if on_disk == "no" else ["--factory", "IVF2,Flat"]
        code, out, err = run_cli(args, monkeypatch, capsys)
        assert code == 0 and "keeping 2 deleted images of" in err, err
        bundle = load_bundle(bundle_dir)
        dead = bundle.is_deleted(bundle.items.ids).tolist()
        live = [p for p, d in zip(bundle.items.paths.tolist(), dead, strict=True) if not d]
        assert live == [p for i, p in enumerate(paths) if i not in (0, 5)]
        assert bundle.live_count == len(paths) - 2 and f"indexed {len(paths) - 2} items" in out
        vectors, vec_items, _ = read_embedded(vec)
        _, ids = search(bundle, np.asarray(vectors), len(paths))  # every image, every item
        found = {int(i) for i in ids.ravel() if i >= 0}
        assert found == {int(i) for i, p in zip(vec_items.ids, paths, strict=True) if p in live}
    # --compact removes them from the index; the bundle still lists them (removed.bin), so a
    # rebuild from a vectors folder that holds those images keeps them deleted, and so does
    # an --add of the images, until a file changes.
    for _ in range(2):
        assert compact_bundle(bundle_dir)["removed"] == 2
        bundle = load_bundle(bundle_dir)
        assert bundle.items.paths.tolist() == [p for i, p in enumerate(paths) if i not in (0, 5)]
        assert bundle.removed.paths.tolist() == [paths[0], paths[5]]  # once each, however often
        code, _, err = run_cli(["index", str(vec), "--out", str(bundle_dir)], monkeypatch, capsys)
        assert code == 0 and "keeping 2 deleted images of" in err, err
        assert load_bundle(bundle_dir).live_count == len(paths) - 2
    compact_bundle(bundle_dir)
    code, _, err = run_cli(["index", str(imgs), "--add", str(bundle_dir)], monkeypatch, capsys)
    assert code == 0 and "2 images of" in err and "left out" in err, err
    assert load_bundle(bundle_dir).live_count == len(paths) - 2
    later = os.stat(paths[5]).st_mtime_ns + 10**9
    os.utime(paths[5], ns=(later, later))  # touched: new content, added again
    code, _, err = run_cli(["index", str(imgs), "--add", str(bundle_dir)], monkeypatch, capsys)
    assert code == 0 and "1 image of" in err, err
    bundle = load_bundle(bundle_dir)
    assert bundle.live_count == len(paths) - 1 and paths[5] in bundle.items.paths.tolist()
    facts = rebuild_facts(bundle_dir)
    assert facts.gone == {paths[0]} and facts.removed.paths.tolist() == [paths[0], paths[5]]
    other = tmp_path / "other"  # a new folder knows nothing of the deletions
    assert run_cli(["index", str(vec), "--out", str(other)], monkeypatch, capsys)[0] == 0
    assert load_bundle(other).items.paths.tolist() == paths


def built_then_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[Path, Path]:
    """In tmp_path (made the working folder): imgs/ (2 classes x 3) embedded into vec/ and
    indexed into b/, then more/ (2 images) added to b with --add; returns (imgs, more)."""
    imgs = make_class_folder(tmp_path / "imgs", classes=2, per_class=3)
    more = make_class_folder(tmp_path / "more", classes=1, per_class=2)
    monkeypatch.chdir(tmp_path)
    for args in (
        ["embed", "imgs", *MODEL, "--out", "vec"],
        ["index", "vec", "--out", "b"],
        ["index", "more", "--add", "b"],
    ):
        assert run_cli(args, monkeypatch, capsys)[0] == 0
    return imgs, more


def test_a_rebuild_that_would_drop_items_is_refused_without_overwrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Items added with --add live in the bundle only; a bundle of other images is not the
    new input's either. A rebuild over them says so in one line and changes nothing (images
    are not even embedded); --overwrite rebuilds without them."""
    _, more = built_then_added(tmp_path, monkeypatch, capsys)
    added = sorted(str(p) for p in more.rglob("*.png"))
    generation = generation_of(Path("b"))

    def refused(args: list[str], lost: int, of: int) -> None:
        code, out, err = run_cli(args, monkeypatch, capsys)
        assert (code, out) == (1, "")
        line = one_error(err)
        assert f"would drop {lost} of its {of} items" in line and "--overwrite" in line, line
        assert generation_of(Path("b")) == generation

    refused(["index", "vec", "--out", "b"], 2, 8)
    bundle = load_bundle(Path("b"))
    assert bundle.live_count == 8 and added[0] in bundle.items.paths.tolist()
    vectors = sorted(os.listdir(current_dir(Path("vec"))))
    refused(["index", "more", *MODEL, "--out", "b"], 6, 8)  # other images: before embedding
    assert (
        not (Path("b") / "vectors").exists()
        and sorted(os.listdir(current_dir(Path("vec")))) == vectors
    )
    code, out, err = run_cli(["index", "vec", "--out", "b", "--overwrite"], monkeypatch, capsys)
    assert code == 0 and "indexed 6 items" in out, err
    assert not set(added) & set(load_bundle(Path("b")).items.paths.tolist())
    # the same input again needs no --overwrite
    assert run_cli(["index", "vec", "--out", "b"], monkeypatch, capsys)[0] == 0


@pytest.mark.parametrize("compact", [False, True])
def test_an_ivf_search_widens_until_rows_are_full(compact: bool, tmp_path: Path, data: Any) -> None:
    """An IVF search sees its nprobe lists only: with every item of those lists deleted (or
    compacted away), or k beyond what they hold, a deeper search alone finds nothing more.
    Rows left short are searched again with nprobe doubled, up to all lists: every row gets
    k live hits, each a live item."""
    base, queries = data
    bundle_dir = make_bundle(tmp_path / "b", base, "IVF16,Flat")
    bundle = load_bundle(bundle_dir)
    faiss.ParameterSpace().set_index_parameters(bundle.index, "nprobe=1")
    lists = faiss.extract_index_ivf(bundle.index).quantizer.search(queries, 1)[1].ravel()
    assigned = faiss.extract_index_ivf(bundle.index).quantizer.search(base, 1)[1].ravel()
    dead = np.flatnonzero(np.isin(assigned, lists[:5]))  # the first queries' own lists, whole
    delete_items(bundle_dir, ids=dead.tolist())
    if compact:
        compact_bundle(bundle_dir)
    bundle = load_bundle(bundle_dir)
    faiss.ParameterSpace().set_index_parameters(bundle.index, "nprobe=1")
    live = np.setdiff1d(np.arange(N), dead)
    for k in (K, 300):
        scores, ids = search(bundle, queries, k)
        assert (ids >= 0).all(), (k, int((ids < 0).sum()))
        assert not np.isin(ids, dead).any() and np.isin(ids, live).all()
        assert all(len(set(row.tolist())) == k for row in ids)


def test_a_rebuild_keeps_every_id_and_never_gives_one_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An id names one image for good: a rebuild from a vectors folder keeps each path's id
    (however the folder numbers it now), and ids the bundle gave are never handed to another
    image, not even after --overwrite dropped their items."""
    imgs, _ = built_then_added(tmp_path, monkeypatch, capsys)

    def ids_by_path() -> dict[str, int]:
        items = load_bundle(Path("b")).items
        return dict(zip(items.paths.tolist(), items.ids.tolist(), strict=True))

    before = ids_by_path()
    assert sorted(before.values()) == list(range(8))  # 6 built, 2 added
    first = imgs / "class_0" / "!.png"  # sorts first: the folder renumbers every image
    Image.new("RGB", (16, 16), (3, 200, 90)).save(first)
    assert run_cli(["embed", "imgs", *MODEL, "--out", "vec"], monkeypatch, capsys)[0] == 0
    assert read_embedded(Path("vec"))[1].paths.tolist()[0] == str(first)
    code, _, err = run_cli(["index", "vec", "--out", "b", "--overwrite"], monkeypatch, capsys)
    assert code == 0, err
    after = ids_by_path()
    assert {p: i for p, i in after.items() if p != str(first)} == {
        p: i for p, i in before.items() if p.startswith(str(imgs))
    }
    assert after[str(first)] == 8  # not 6 or 7: those named the dropped --add images
    assert load_bundle(Path("b")).next_id == 9
