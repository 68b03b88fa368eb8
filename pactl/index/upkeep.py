"""A bundle kept up: items appended (--add), deleted as tombstones (--delete) and
compacted away (--compact), each change one new generation under the writer lock."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.index.binary.build import BINARY_FILES, add_codes, codes_without
from pactl.index.binary.search import BinaryIndex
from pactl.index.build import ADD_BATCH, add_vectors, as_matrix, faiss_reason
from pactl.index.bundle import (
    BUNDLE_FILES,
    INDEX_FILE,
    ITEMS_FILE,
    REMOVED_FILE,
    Bundle,
    _write_meta,
    ondisk_lists,
    write_bundle,
)
from pactl.index.mapped import blocks
from pactl.index.ondisk import (
    IVFDATA_FILE,
    PENDING_IVFDATA,
    add_on_disk,
    empty_like,
    merge_lists,
    quiet_c_stdout,
)
from pactl.index.reading import check_count, check_folder, load_bundle, read_tables
from pactl.index.rescoring import FLOATS_FILE, RescoredIndex, rows_of, write_floats
from pactl.index.search import in_sorted
from pactl.store import checksums
from pactl.store.generations import (
    current_dir,
    generation_of,
    link_names,
    new_generation,
    read_current,
    remove_stale,
    writer_lock,
)
from pactl.store.item_table import ID_MAX, TABLE_FILE, ItemTable


def add_to_bundle(
    bundle_dir: Path,
    vectors: np.ndarray,
    items: Sequence[tuple[Any, ...]] | ItemTable,
    meta_check: dict[str, Any],
    reporter: Reporter | None = None,
    replaces: Sequence[int] | np.ndarray = (),
) -> None:
    """Append vectors (with their items) to a bundle; they must come from the bundle's model.

    `meta_check` is the new vectors' meta.json: its dimension and model fingerprint must match
    the bundle's. New ids must not be in the bundle yet. The tuned search setting is kept. The
    result is a new generation of the bundle (the old one is only read); an on-disk bundle gets
    a new index.ivfdata, its lists and the new ones merged into a fresh file. The ids in
    `replaces` (items whose file changed) are deleted in that same generation, so a reader
    sees the old vector or the new one, never both or neither.
    """
    with writer_lock(bundle_dir):
        bundle = load_bundle(bundle_dir, mmap=False)
        refuse_set_shard(bundle_dir, bundle.meta)
        x = as_matrix(vectors, "vectors")
        _check_same_model(bundle, bundle_dir, x.shape[1], meta_check)
        if len(items) != len(x):
            raise PactlError(f"{len(items)} items for {len(x)} new vectors")
        new = items if isinstance(items, ItemTable) else ItemTable.from_rows(items)
        clash = new.ids[bundle.items.positions(new.ids) >= 0]
        if len(clash):
            raise PactlError(
                f"id {int(clash[0])} is already in {bundle_dir} ({len(clash)} clashing ids); "
                f"number new items from {bundle.next_id}"
            )
        gone = np.asarray(replaces, dtype=np.int64)
        unknown = gone[bundle.items.positions(gone) < 0]
        if len(unknown):
            raise PactlError(f"no item with id {int(unknown[0])} in {bundle_dir} to replace")
        with new_generation(bundle_dir, BUNDLE_FILES) as gen:
            index = bundle.index
            items = bundle.items.concat(new)
            if isinstance(index, BinaryIndex):
                index = add_codes(index, x, new.ids, items.positions, gen)
            elif isinstance(index, RescoredIndex):  # codes added, floats.npy grown to match
                add_vectors(index.index, x, new.ids, reporter or QUIET)
                chunks = itertools.chain((b for _, b in blocks(index.floats)), [x])
                floats = write_floats(gen / FLOATS_FILE, (len(items), x.shape[1]), chunks)
                index = RescoredIndex(index.index, floats, items.positions, index.rescore)
            elif ondisk_lists(index) is not None:
                index = add_on_disk(index, x, new.ids, gen, reporter or QUIET)
            else:
                add_vectors(index, x, new.ids, reporter or QUIET)
            dead = np.union1d(bundle.deleted, gone)
            write_bundle(gen, index, items, bundle.meta, dead, bundle.removed)


def refuse_set_shard(bundle_dir: Path, meta: dict[str, Any]) -> None:
    """A bundle set's shard bundle (its meta.json records the trained index the set's shards
    share, pactl.index.sets) changes only with its set: added to or deleted from alone, it
    would no longer be the shard the set recorded, and the set would refuse to load."""
    if "trained_digest" in meta:
        raise PactlError(
            f"{bundle_dir} is a shard bundle of a bundle set, which changes as a whole: "
            "rebuild the set with `pactl index VECTORS --keep-shards` (its vectors folder "
            "changed as wanted)"
        )


def _check_same_model(bundle: Bundle, bundle_dir: Path, dim: int, meta: dict[str, Any]) -> None:
    """New vectors must have the bundle's dimension and come from its model (fingerprint)."""
    have = int(bundle.index.d)
    for given in (dim, meta.get("dimension", dim)):
        if given != have:
            raise PactlError(f"new vectors have dimension {given}; bundle {bundle_dir} has {have}")
    mine, theirs = bundle.meta.get("fingerprint"), meta.get("fingerprint")
    if mine != theirs:
        raise PactlError(
            f"new vectors come from another model (fingerprint {str(theirs)[:12]}, bundle "
            f"{bundle_dir} has {str(mine)[:12]}): embed them with the bundle's checkpoint"
        )


def delete_items(
    bundle_dir: Path,
    ids: Sequence[int] = (),
    paths: Sequence[str] = (),
    reporter: Reporter | None = None,
) -> int:
    """Delete items by id or by path (as `pactl query --exclude-self` finds a path: absolute, or
    relative to the working folder); returns how many were not deleted already.

    The items stay in the index as tombstones (deleted.npy) that every search skips, until
    compact_bundle or a rebuild drops them. The new generation hard-links the unchanged
    index.faiss, index.ivfdata and items.csv of the current one (a copy where links are not
    allowed) and writes deleted.npy and meta.json. An id or path the bundle lacks is an error
    naming it, and nothing is deleted.
    """
    check_folder(bundle_dir)
    with writer_lock(bundle_dir):
        gen_now, meta, items, dead = read_current(
            bundle_dir, lambda gen: (gen, *read_tables(bundle_dir, gen))
        )
        check_count(bundle_dir, meta, items, dead)
        refuse_set_shard(bundle_dir, meta)
        wanted = _resolve(bundle_dir, items, ids, paths)
        fresh = np.setdiff1d(wanted, dead)
        if len(fresh) == 0:
            _tidy(bundle_dir)
            (reporter or QUIET).log("nothing to delete: those items were deleted already")
            return 0
        with new_generation(bundle_dir, BUNDLE_FILES) as gen:
            kept = (INDEX_FILE, IVFDATA_FILE, ITEMS_FILE, TABLE_FILE, REMOVED_FILE, *BINARY_FILES)
            for name in kept:
                if (gen_now / name).is_file():
                    _link_or_copy(gen_now / name, gen / name)
            metric = meta.get("metric", "ip")
            dead = np.union1d(dead, fresh)
            # the linked files' digests are the ones recorded for them, never of what they hold
            # now: damage stays found
            known = {n: d for n, d in (checksums.recorded(meta) or {}).items() if n in kept}
            _write_meta(gen, meta, meta["dimension"], metric, items, dead, known)
        return len(fresh)  # the caller says it: `pactl index --delete` prints it as its result


def _tidy(bundle_dir: Path) -> None:
    """What a writer killed after its switch left undone, when there is nothing to write now
    (which would do it): older generations removed, the visible names matching the current
    generation. Call with the writer lock held."""
    remove_stale(bundle_dir)
    if generation_of(bundle_dir) is not None:
        link_names(bundle_dir, current_dir(bundle_dir), BUNDLE_FILES)


def _resolve(
    bundle_dir: Path, items: ItemTable, ids: Sequence[int], paths: Sequence[str]
) -> np.ndarray:
    """The ids named by `ids` and `paths`, each checked to be an item of the bundle."""
    from pactl.index.search import PathIndex

    beyond = [int(i) for i in ids if not 0 <= int(i) <= ID_MAX]  # int64 cannot hold them
    if beyond:
        raise PactlError(f"no item with id {beyond[0]} in bundle {bundle_dir}")
    wanted = np.asarray([int(i) for i in ids], dtype=np.int64)
    unknown = wanted[items.positions(wanted) < 0]
    if len(unknown):
        raise PactlError(f"no item with id {int(unknown[0])} in bundle {bundle_dir}")
    by_path = PathIndex(items).ids(list(paths)) if len(paths) else wanted[:0]
    missing = np.flatnonzero(by_path < 0)
    if len(missing):
        raise PactlError(f"no item in bundle {bundle_dir} has the path {paths[missing[0]]}")
    return np.union1d(wanted, by_path)


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link to an unchanged file of the previous generation (never written in place, so
    sharing it is safe), or a copy where the filesystem has no hard links."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def compact_bundle(bundle_dir: Path, reporter: Reporter | None = None) -> dict[str, Any]:
    """Remove the deleted items from the index and items.csv for real, in a new generation.

    FAISS `remove_ids` where the index kind has it (flat, IVF); on-disk lists have their live
    entries copied into a new index.ivfdata (the bundle's own file is only read); else the
    live vectors are reconstructed and added to the emptied index (HNSW); an index that can do
    neither is refused with what to do. Returns removed, count (live items) and method
    ("none", "remove_ids", "copied" or "rebuilt").
    """
    check_folder(bundle_dir)
    log = reporter or QUIET
    with writer_lock(bundle_dir):
        bundle = load_bundle(bundle_dir, mmap=False)
        refuse_set_shard(bundle_dir, bundle.meta)
        dead = bundle.deleted
        if len(dead) == 0:
            _tidy(bundle_dir)
            log.log(f"{bundle_dir} has no deleted items: nothing to compact")
            return {"removed": 0, "count": bundle.live_count, "method": "none"}
        keep = ~bundle.is_deleted(bundle.items.ids)
        items = bundle.items.take(np.flatnonzero(keep))
        removed = _remembered(bundle.removed, bundle.items.take(np.flatnonzero(~keep)))
        with new_generation(bundle_dir, BUNDLE_FILES) as gen:
            index: Any
            if isinstance(bundle.index, BinaryIndex):
                rows = np.flatnonzero(keep)
                index, method = codes_without(bundle.index, dead, rows, items, gen, log)
            elif isinstance(bundle.index, RescoredIndex):  # the floats' rows compacted alike
                old = bundle.index
                inner, method = _without(old.index, dead, items.ids, gen, log)
                kept = rows_of(old.floats, np.flatnonzero(keep))
                floats = write_floats(gen / FLOATS_FILE, (len(items), old.d), kept)
                index = RescoredIndex(inner, floats, items.positions, old.rescore)
            else:
                index, method = _without(bundle.index, dead, items.ids, gen, log)
            if index.ntotal != len(items):
                raise PactlError(
                    f"compacting {bundle_dir} left {index.ntotal} vectors for {len(items)} items:"
                    " rebuild it from the vectors folder with `pactl index VECTORS`"
                )
            write_bundle(gen, index, items, bundle.meta, removed=removed)
        return {"removed": len(dead), "count": len(items), "method": method}


def _remembered(before: ItemTable, now: ItemTable) -> ItemTable:
    """The removed items after a compaction: those removed before, less the paths removed
    again now (their newer row wins), then those removed now."""
    again = set(now.paths.tolist())
    older = np.fromiter((p not in again for p in before.paths), dtype=bool, count=len(before))
    return ItemTable.join([before.take(older), now])


def _without(
    index: Any, dead: np.ndarray, live: np.ndarray, gen: Path, log: Reporter
) -> tuple[Any, str]:
    """The index less the vectors of `dead` ids, and how: "remove_ids", "copied" or
    "rebuilt"."""
    if ondisk_lists(index) is not None:
        return _ondisk_without(index, dead, gen), "copied"
    try:
        index.remove_ids(faiss.IDSelectorBatch(dead))
        return index, "remove_ids"
    except RuntimeError:
        pass  # this kind cannot remove (HNSW): rebuild from its own vectors, if it has them
    try:
        vectors = np.empty((len(live), index.d), dtype=np.float32)
        for start in range(0, len(live), ADD_BATCH):
            batch = live[start : start + ADD_BATCH]
            vectors[start : start + len(batch)] = index.reconstruct_batch(batch)
    except RuntimeError as e:
        why = faiss_reason(e)
        raise PactlError(
            f"this index kind can neither remove items nor give back its vectors ({why}): "
            "rebuild the bundle from the vectors folder with `pactl index VECTORS`"
        ) from None
    log.log(f"rebuilding the index from the {len(live):,} live vectors it holds")
    index.reset()
    # Not add_vectors: a lossy kind (HNSW over SQ codes) gives back vectors a little off unit
    # length, which it took in before, and codes them again the same way.
    for start in range(0, len(live), ADD_BATCH):
        index.add_with_ids(vectors[start : start + ADD_BATCH], live[start : start + ADD_BATCH])
    return index, "rebuilt"


def _ondisk_without(index: Any, dead: np.ndarray, gen: Path) -> Any:
    """On-disk lists less `dead`, for write_bundle to move in: the live entries of each list
    are copied into a scratch file of `gen` (the bundle's own file is only read), whose lists
    are then merged into a packed file. FAISS's own remove_ids is not used on on-disk lists: a
    list it shrinks can land on its old offset with a new capacity and lose its ids."""
    scratch = gen / ".compact.ivfdata"
    source: Any = faiss.extract_index_ivf(index).invlists
    copy = empty_like(index)
    ivf: Any = faiss.extract_index_ivf(copy)
    lists: Any = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(scratch))
    total = 0
    with quiet_c_stdout():
        for number in range(ivf.nlist):
            size = source.list_size(number)
            if size == 0:
                continue
            ids = faiss.rev_swig_ptr(source.get_ids(number), size)
            keep = ~in_sorted(ids, dead)
            kept = int(keep.sum())
            if kept == 0:
                continue
            codes = faiss.rev_swig_ptr(source.get_codes(number), size * ivf.code_size)
            kept_ids = np.ascontiguousarray(ids[keep])
            kept_codes = np.ascontiguousarray(codes.reshape(size, ivf.code_size)[keep])
            lists.resize(number, kept)  # from empty: a fresh slot, nothing moved
            lists.update_entries(
                number, 0, kept, faiss.swig_ptr(kept_ids), faiss.swig_ptr(kept_codes)
            )
            total += kept
        ivf.replace_invlists(lists, True)
        lists.this.disown()
        copy.ntotal = ivf.ntotal = total
        packed = empty_like(index)
        merge_lists(packed, [copy], gen / PENDING_IVFDATA)
    del copy
    scratch.unlink()
    return packed
