"""Bundles on disk: index.faiss, items.csv and meta.json (and index.ivfdata, deleted.npy)
written as one generation of a folder, loaded and checked whole, appended to, items deleted
(tombstones) and compacted away."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl import checksums, records
from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.fsutil import (
    _link_names,
    check_files,
    current_dir,
    generation_of,
    new_generation,
    read_current,
    record_files,
    remove_stale,
    writer_lock,
)
from pactl.index.build import (
    ADD_BATCH,
    GPU_MAX_K,
    _as_matrix,
    _why,
    add_vectors,
    faiss_gpus,
    gpu_searcher,
)
from pactl.index.ondisk import (
    IVFDATA_FILE,
    PENDING_IVFDATA,
    _add_on_disk,
    _merge_lists,
    _quiet_c_stdout,
    empty_like,
)
from pactl.index.search import in_sorted
from pactl.items import ID_MAX, TABLE_FILE, ItemTable
from pactl.version import __version__

BUNDLE_FORMAT = "pactl.bundle"
BUNDLE_VERSION = 2  # 2: may hold deleted.npy; a bundle without tombstones is still written as 1
TOMBSTONES_VERSION = 2  # a pactl that reads only version 1 would return deleted items: refused
VECTORS_FORMAT = "pactl.vectors"
INDEX_FILE, ITEMS_FILE, META_FILE = "index.faiss", "items.csv", "meta.json"
DELETED_FILE = "deleted.npy"  # int64 ids of deleted items (tombstones), sorted; absent when none
# items compacted away (the items.bin format): a rebuild or an --add leaves them out still
REMOVED_FILE = "removed.bin"
BUNDLE_FILES = (
    INDEX_FILE,
    ITEMS_FILE,
    TABLE_FILE,
    META_FILE,
    IVFDATA_FILE,
    DELETED_FILE,
    REMOVED_FILE,
)
MAX_SEARCH_SETTING = 10_000_000  # nprobe / efSearch beyond this is a typo or a tampered file


@dataclass
class Bundle:
    path: Path  # the bundle folder
    index: Any  # faiss.Index, search parameters already set from meta.json
    items: ItemTable
    meta: dict[str, Any]
    mmapped: bool = False  # the index reads its codes from index.faiss (or .ivfdata) in place
    # ids still in the index and items.csv but deleted (tombstones), sorted; searches skip them
    deleted: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    # a copy of a Flat index on the GPUs (load_bundle's faiss_device); None: search `index`
    gpu_index: Any = None
    # the items compacted away (removed.bin): no longer searched or counted, but remembered
    removed: ItemTable = field(default_factory=lambda: ItemTable.from_rows([]))

    def searcher(self, depth: int) -> Any:
        """What answers a search for `depth` hits a query: the GPU copy, up to the most hits a
        GPU search selects, else the index itself."""
        if self.gpu_index is not None and depth <= GPU_MAX_K:
            return self.gpu_index
        return self.index

    @property
    def live_count(self) -> int:
        """Items a search can return: all of them less the deleted ones."""
        return len(self.items) - len(self.deleted)

    def is_deleted(self, ids: np.ndarray) -> np.ndarray:
        """Whether each id (any shape) is a tombstone; False for -1 and unknown ids."""
        return in_sorted(np.asarray(ids, dtype=np.int64), self.deleted)

    @property
    def next_id(self) -> int:
        """The first id never given to an item of this bundle: above every id it holds and
        every id a compaction removed (meta.json "next_id"), so an id names one item for
        good, and a client that kept an old id never gets another item under it."""
        return max(int(self.meta.get("next_id", 0)), self.items.max_id() + 1)


# ---------------------------------------------------------------------------- bundles on disk


def save_bundle(
    out: Path,
    index: Any,
    items_csv_source: Path | list[tuple[int, str, str]] | ItemTable,
    meta: dict[str, Any],
) -> None:
    """Write index.faiss, items.csv and meta.json (and index.ivfdata) as a new generation of
    the bundle folder `out`, which becomes current in one step once all are on disk."""
    with new_generation(out, BUNDLE_FILES) as gen:
        write_bundle(gen, index, items_csv_source, meta)


def write_bundle(
    gen: Path,
    index: Any,
    items_csv_source: Path | list[tuple[int, str, str]] | ItemTable,
    meta: dict[str, Any],
    deleted: np.ndarray | None = None,
    removed: ItemTable | None = None,
) -> None:
    """Write a bundle's files into the fresh generation folder `gen`.

    `meta` should carry the vectors' checkpoint, fingerprint and model_config and the tuning
    record of build_index; format, version, dimension, count, the generation and the size of
    each file are set here from the index itself, so a loader can tell that the files belong
    together. An index with on-disk lists (build_ondisk_index) also gets index.ivfdata.
    `deleted`: ids of items that stay in the index but are deleted (deleted.npy); `removed`:
    the items compacted away so far (removed.bin), which stay deleted by path.
    """
    lists = _ondisk_lists(index)
    items = (
        items_csv_source
        if isinstance(items_csv_source, ItemTable)
        else ItemTable.read(items_csv_source)
        if isinstance(items_csv_source, Path)
        else ItemTable.from_rows(items_csv_source)
    )
    if len(items) != index.ntotal:
        raise PactlError(f"{len(items)} items for an index of {index.ntotal} vectors")
    if lists is not None:
        _place_lists(gen, lists)
    faiss.write_index(index, str(gen / INDEX_FILE))
    if isinstance(items_csv_source, Path):
        shutil.copyfile(items_csv_source, gen / ITEMS_FILE)
    else:
        items.write(gen / ITEMS_FILE)
    items.save(gen / TABLE_FILE)  # what load_bundle maps; items.csv is the export
    if removed is not None and len(removed):
        removed.save(gen / REMOVED_FILE)
    metric = "ip" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2"
    _write_meta(gen, meta, int(index.d), metric, items, deleted)


def _write_meta(
    gen: Path,
    meta: dict[str, Any],
    dimension: int,
    metric: str,
    items: ItemTable,
    deleted: np.ndarray | None,
    known: dict[str, str] | None = None,
) -> None:
    """deleted.npy (when there are tombstones) and meta.json, whose "count" is the live items
    and "deleted" the tombstones (the index holds both), the sizes of the index files already
    in `gen` (index.ivfdata, if there, makes it an on-disk bundle) and every file's checksum
    (`known`: those of files linked unchanged from the current generation)."""
    dead = np.unique(np.asarray(deleted if deleted is not None else (), dtype=np.int64))
    if len(dead) and (items.positions(dead) < 0).any():
        raise PactlError(f"deleted id {int(dead[items.positions(dead) < 0][0])} is not an item")
    if len(dead):
        np.save(gen / DELETED_FILE, dead, allow_pickle=False)
    on_disk = (gen / IVFDATA_FILE).is_file()
    derived = {
        "dimension": dimension,
        "ntotal": len(items),  # vectors in the index, tombstones included (items match them)
        "count": len(items) - len(dead),
        "deleted": len(dead),
        "next_id": max(int(meta.get("next_id", 0)), items.max_id() + 1),
        "metric": metric,
        "on_disk": on_disk,
        "index_bytes": (gen / INDEX_FILE).stat().st_size,
        **({"ivfdata_bytes": (gen / IVFDATA_FILE).stat().st_size} if on_disk else {}),
    }
    version = TOMBSTONES_VERSION if len(dead) else 1  # older pactl still reads the rest
    header = {"format": BUNDLE_FORMAT, "version": version, "pactl_version": __version__}
    mine = {*header, *derived, "index_bytes", "ivfdata_bytes", "generation", "files", "checksums"}
    rest = {k: v for k, v in meta.items() if k not in mine}
    full = record_files(gen, {**header, **rest, **derived})
    full["checksums"] = checksums.record(gen, full["files"], known)
    (gen / META_FILE).write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")


def _ondisk_lists(index: Any) -> Any | None:
    """The index's OnDiskInvertedLists when they have a file of their own, else None.

    Lists mapped from index.faiss (load_bundle with mmap) have no file of their own, and
    write_index cannot serialise them in place: refused.
    """
    ivf: Any = faiss.try_extract_index_ivf(index)
    lists = faiss.downcast_InvertedLists(ivf.invlists) if ivf is not None else None
    if not isinstance(lists, faiss.OnDiskInvertedLists):
        return None
    if not lists.filename:
        raise PactlError("a memory-mapped index cannot be saved: load it with mmap=False first")
    return lists


def _place_lists(gen: Path, lists: Any) -> None:
    """Put the lists file into `gen` as index.ivfdata and point the index at that name.

    index.faiss records the lists' file name; readers open it with IO_FLAG_ONDISK_SAME_DIR,
    which keeps that name's last component and looks for it beside index.faiss, so the folder
    can move. Lists merged into `gen` (build_ondisk_index, an --add) are renamed; any other
    lists file (another bundle's) is copied, never taken from it.
    """
    final = gen / IVFDATA_FILE
    source = Path(lists.filename)
    if source.parent.resolve() == gen.resolve():
        with open(source, "rb") as f:  # the merge wrote through a shared mapping
            os.fsync(f.fileno())
        if source.resolve() != final.resolve():
            os.replace(source, final)
    else:
        shutil.copyfile(source, final)
    lists.filename = str(final)


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
        x = _as_matrix(vectors, "vectors")
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
            if _ondisk_lists(index) is not None:
                index = _add_on_disk(index, x, new.ids, gen, reporter or QUIET)
            else:
                add_vectors(index, x, new.ids, reporter or QUIET)
            dead = np.union1d(bundle.deleted, gone)
            items = bundle.items.concat(new)
            write_bundle(gen, index, items, bundle.meta, dead, bundle.removed)


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


# ---------------------------------------------------------------------------- deletes


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
            bundle_dir, lambda gen: (gen, *_read_tables(bundle_dir, gen))
        )
        _check_count(bundle_dir, meta, items, dead)
        wanted = _resolve(bundle_dir, items, ids, paths)
        fresh = np.setdiff1d(wanted, dead)
        if len(fresh) == 0:
            _tidy(bundle_dir)
            (reporter or QUIET).log("nothing to delete: those items were deleted already")
            return 0
        with new_generation(bundle_dir, BUNDLE_FILES) as gen:
            kept = (INDEX_FILE, IVFDATA_FILE, ITEMS_FILE, TABLE_FILE, REMOVED_FILE)
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
        _link_names(bundle_dir, current_dir(bundle_dir), BUNDLE_FILES)


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


# ---------------------------------------------------------------------------- compaction


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
        dead = bundle.deleted
        if len(dead) == 0:
            _tidy(bundle_dir)
            log.log(f"{bundle_dir} has no deleted items: nothing to compact")
            return {"removed": 0, "count": bundle.live_count, "method": "none"}
        keep = ~bundle.is_deleted(bundle.items.ids)
        items = bundle.items.take(np.flatnonzero(keep))
        removed = _remembered(bundle.removed, bundle.items.take(np.flatnonzero(~keep)))
        with new_generation(bundle_dir, BUNDLE_FILES) as gen:
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
    if _ondisk_lists(index) is not None:
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
        raise PactlError(
            f"this index kind can neither remove items nor give back its vectors ({_why(e)}): "
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
    with _quiet_c_stdout():
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
        _merge_lists(packed, [copy], gen / PENDING_IVFDATA)
    del copy
    scratch.unlink()
    return packed


def load_bundle(path: Path, mmap: bool = True, faiss_device: str = "cpu") -> Bundle:
    """Open a bundle's current generation, checking it is whole and consistent; sets the tuned
    search parameters.

    With `mmap`, index kinds that FAISS can map (IVF lists, flat codes) read their vectors from
    the file through the page cache instead of copying them into memory. An on-disk bundle
    (index.ivfdata) is always read that way, whatever `mmap` says.

    `faiss_device` (auto, cpu, gpu) is where searches run: on the GPUs FAISS has, a Flat
    index is copied there (Bundle.gpu_index); other kinds search on the CPU with their tuned
    parameters.
    """
    check_folder(path)
    gpus = faiss_gpus(faiss_device)
    bundle = read_current(path, lambda gen: _load_generation(path, gen, mmap))
    if gpus:
        searcher = gpu_searcher(bundle.index, gpus)
        bundle.gpu_index = searcher if searcher is not bundle.index else None
    return bundle


def _load_generation(path: Path, gen: Path, mmap: bool) -> Bundle:
    meta, items, deleted = _read_tables(path, gen)
    index, flag = _read_index(gen, meta, mmap)
    if len(items) != index.ntotal:
        raise PactlError(
            f"bundle {path} is inconsistent: {ITEMS_FILE} has {len(items):,} rows but "
            f"{INDEX_FILE} holds {index.ntotal:,} vectors; rebuild it with `pactl index`"
        )
    if meta["dimension"] != index.d:
        raise PactlError(
            f"bundle {path}: meta.json says dimension {meta['dimension']}, "
            f"{INDEX_FILE} has {index.d}"
        )
    _check_count(path, meta, items, deleted)
    params = str(meta.get("search_params") or "")
    if params:
        try:
            space: Any = faiss.ParameterSpace()
            space.set_index_parameters(index, params)
        except RuntimeError as e:
            raise PactlError(f"bundle {path}: search_params {params!r}: {_why(e)}") from e
    removed = _read_removed(gen, meta)
    return Bundle(path, index, items, meta, flag != 0, deleted, removed=removed)


def _read_tables(path: Path, gen: Path) -> tuple[dict[str, Any], ItemTable, np.ndarray]:
    """meta.json, the item table and the deleted ids of a generation, checked against each
    other (the index itself is not read)."""
    for name in (META_FILE, ITEMS_FILE, INDEX_FILE):
        if not (gen / name).is_file():
            raise PactlError(f"bundle {path} lacks {name}: rebuild it with `pactl index`")
    meta = _read_meta(path, gen)
    check_files(gen, meta, path, "rebuild the bundle with `pactl index`")
    # items.bin when meta.json records its size (check_files has checked it); older bundles
    # have only items.csv, which is parsed
    lean = TABLE_FILE in (meta.get("files") or {})
    items = ItemTable.open(gen / TABLE_FILE) if lean else ItemTable.read(gen / ITEMS_FILE)
    return meta, items, _read_deleted(path, gen, meta, items)


def _read_removed(gen: Path, meta: dict[str, Any]) -> ItemTable:
    """The items compacted away from a generation (removed.bin, whose size check_files has
    checked against meta.json); none in bundles without it."""
    if REMOVED_FILE not in (meta.get("files") or {}):
        return ItemTable.from_rows([])
    return ItemTable.open(gen / REMOVED_FILE)


def _check_count(path: Path, meta: dict[str, Any], items: ItemTable, deleted: np.ndarray) -> None:
    """meta.json's live count and its tombstones add up to the rows of items.csv (a bundle of
    an older pactl, without "deleted", counted them all)."""
    if "deleted" in meta and meta["count"] + len(deleted) != len(items):
        raise PactlError(
            f"bundle {path} is inconsistent: meta.json counts {meta['count']:,} items and "
            f"{len(deleted):,} deleted, {ITEMS_FILE} has {len(items):,} rows; "
            "rebuild it with `pactl index`"
        )


def _read_deleted(path: Path, gen: Path, meta: dict[str, Any], items: ItemTable) -> np.ndarray:
    """The sorted tombstone ids of deleted.npy; none for a bundle without the file (older pactl
    or nothing deleted). Every id must be an item, and meta.json's "deleted" their number."""
    file, expected = gen / DELETED_FILE, int(meta.get("deleted") or 0)
    fix = "rebuild the bundle with `pactl index`"
    if not file.is_file():
        if expected:
            raise PactlError(f"bundle {path} lacks {DELETED_FILE}: {fix}")
        return np.empty(0, dtype=np.int64)
    try:
        dead = np.load(file, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise PactlError(f"{path / DELETED_FILE} is corrupt ({e}): {fix}") from None
    if dead.dtype != np.int64 or dead.ndim != 1 or (len(dead) > 1 and (np.diff(dead) <= 0).any()):
        raise PactlError(f"{path / DELETED_FILE} is not a sorted list of item ids: {fix}")
    if len(dead) != expected:
        raise PactlError(
            f"{path / DELETED_FILE} holds {len(dead):,} ids, meta.json counts {expected:,}: {fix}"
        )
    stray = dead[items.positions(dead) < 0]
    if len(stray):
        raise PactlError(f"{path / DELETED_FILE} names id {int(stray[0])}, not an item: {fix}")
    return dead


@dataclass(frozen=True)
class Replaced:
    """What a rebuild must know of the bundle it replaces (rebuild_facts)."""

    live: set[str]  # the paths of its live items: a rebuild without them drops them
    gone: set[str]  # paths deleted or compacted away and not live under a new id: kept deleted
    removed: ItemTable  # the items compacted away, carried over
    ids: dict[str, int] = field(default_factory=dict)  # path -> its id (a live one first)
    next_id: int = 0  # the first id the bundle never gave


def rebuild_facts(path: Path) -> Replaced:
    """What the bundle at `path` holds that a rebuild over it must keep or may lose: its live
    paths, the paths of its deleted and compacted-away items that are not in it under a new id
    (a changed file replaced by --add is live again), and the table of the compacted-away
    ones. Nothing when `path` is no bundle yet; PactlError when it is a bundle that cannot be
    read."""
    if not (path / META_FILE).exists():
        return Replaced(set(), set(), ItemTable.from_rows([]))

    def read(gen: Path) -> Replaced:
        meta, items, deleted = _read_tables(path, gen)
        removed = _read_removed(gen, meta)
        dead = in_sorted(items.ids, deleted).tolist()
        paths = items.paths.tolist()
        live = {p for p, d in zip(paths, dead, strict=True) if not d}
        gone = {p for p, d in zip(paths, dead, strict=True) if d} | set(removed.paths.tolist())
        ids = {p: i for p, i, d in zip(paths, items.ids.tolist(), dead, strict=True) if d}
        ids |= {p: i for p, i, d in zip(paths, items.ids.tolist(), dead, strict=True) if not d}
        next_id = max(int(meta.get("next_id", 0)), items.max_id() + 1, removed.max_id() + 1)
        return Replaced(live, gone - live, removed, ids, next_id)

    return read_current(path, read)


def bundle_count(path: Path) -> int:
    """The number of live (not deleted) items in the bundle's current generation (read from its
    meta.json)."""
    return int(read_current(path, lambda gen: _read_meta(path, gen))["count"])


def _read_index(gen: Path, meta: dict[str, Any], mmap: bool) -> tuple[Any, int]:
    """index.faiss (and index.ivfdata), sizes checked against meta.json; returns the index and
    the FAISS read flag used."""
    index_file, ivfdata = gen / INDEX_FILE, gen / IVFDATA_FILE
    _check_size(index_file, meta.get("index_bytes"))
    recorded = meta.get("on_disk")
    on_disk = bool(recorded) or (recorded is None and ivfdata.exists())
    if on_disk:
        if not ivfdata.is_file():
            raise PactlError(
                f"bundle {gen} lacks {IVFDATA_FILE} (its inverted lists): "
                "rebuild it with `pactl index`"
            )
        _check_size(ivfdata, meta.get("ivfdata_bytes"))
        # SAME_DIR: the lists file is looked for beside index.faiss, wherever the folder is now
        flag = int(faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY)
    else:
        flag = _mmap_flag(index_file) if mmap else 0
    try:
        with _quiet_c_stdout() if on_disk else contextlib.nullcontext():
            index = faiss.read_index(str(index_file), flag)
    except RuntimeError as e:
        raise PactlError(
            f"{index_file} is truncated or corrupt ({_why(e)}): rebuild it with `pactl index`"
        ) from e
    if on_disk:
        _check_lists_fit(index, ivfdata)
    return index, flag


def _check_lists_fit(index: Any, ivfdata: Path) -> None:
    """The lists index.faiss describes must lie inside index.ivfdata: past its end they would
    fault (SIGBUS) at search time instead of failing here."""
    lists = _ondisk_lists(index)
    size = ivfdata.stat().st_size
    if lists is None:
        raise PactlError(
            f"{ivfdata.parent / INDEX_FILE} has no on-disk lists although {IVFDATA_FILE} is "
            "there: rebuild the bundle with `pactl index`"
        )
    if lists.totsize > size:
        raise PactlError(
            f"{ivfdata} is truncated or corrupt ({size:,} bytes, {INDEX_FILE} expects "
            f"{lists.totsize:,}): rebuild the bundle with `pactl index`"
        )


def _check_size(file: Path, recorded: Any) -> None:
    actual = file.stat().st_size
    if isinstance(recorded, int) and recorded != actual:
        raise PactlError(
            f"{file} is truncated or corrupt ({actual:,} bytes, meta.json records "
            f"{recorded:,}): rebuild the bundle with `pactl index`"
        )


def check_folder(path: Path) -> None:
    """One line when `path` is not a folder that could be a bundle."""
    if not path.exists():
        raise PactlError(f"bundle {path} does not exist: build one with `pactl index`")
    if not path.is_dir():
        raise PactlError(f"bundle {path} is not a folder")


def _read_meta(path: Path, gen: Path) -> dict[str, Any]:
    """meta.json of a bundle generation, every field pactl uses checked (one line naming it)."""
    where = path / META_FILE
    meta = records.read_json_object(gen / META_FILE, where, "a pactl bundle's meta.json")
    found = meta.get("format")
    if found != BUNDLE_FORMAT:
        vectors = found == VECTORS_FORMAT
        hint = "; it holds vectors: index them with `pactl index`" if vectors else ""
        raise PactlError(f"{path} is not a pactl bundle (meta.json format {found!r}){hint}")
    version = meta.get("version")
    if type(version) is not int or not 1 <= version <= BUNDLE_VERSION:
        raise PactlError(
            f"bundle {path} has version {version!r}; pactl {__version__} reads versions 1 to "
            f"{BUNDLE_VERSION}: rebuild it with `pactl index`"
        )
    records.field(meta, "dimension", int, where, 1, 65_536)
    records.field(meta, "count", int, where, 0, 2**40)
    records.field(meta, "deleted", int, where, 0, 2**40, optional=True)
    records.field(meta, "next_id", int, where, 0, 2**62, optional=True)
    records.field(meta, "fingerprint", str, where, optional=True)
    records.field(meta, "checkpoint", str, where, optional=True)
    records.field(meta, "model_config", dict, where, optional=True)
    records.field(meta, "factory", str, where, optional=True)
    records.field(meta, "on_disk", bool, where, optional=True)
    records.field(meta, "checksums", dict, where, optional=True)
    for key in ("index_bytes", "ivfdata_bytes"):
        records.field(meta, key, int, where, 0, 2**62, optional=True)
    params = records.field(meta, "search_params", str, where, optional=True)
    if params:
        _check_search_params(params, where)
    return meta


def _check_search_params(params: str, where: Path) -> None:
    """`name=value` pairs with positive integer values: FAISS aborts on some zero settings."""
    for pair in params.split(","):
        name, _, value = pair.partition("=")
        if not re.fullmatch(r"[A-Za-z_]+", name.strip()) or not value.strip().isdigit():
            raise PactlError(f"{where}: search_params {params!r} is not name=number,...")
        if not 1 <= int(value) <= MAX_SEARCH_SETTING:
            raise PactlError(f"{where}: search_params {params!r}: {name} is out of range")


def _mmap_flag(index_file: Path) -> int:
    """The FAISS read flag that maps this index kind's codes, keyed on the file's first fourcc.

    IVF files ("Iw..") map their inverted lists; flat codes, bare ("IxF.") or under an id map
    ("IxM2", "IxMp") or an HNSW graph ("IHN."), map through IO_FLAG_MMAP_IFC. Anything else
    (pre-transforms, refinement, ...) is read into memory.
    """
    with open(index_file, "rb") as f:
        fourcc = f.read(4)
    if fourcc[:2] == b"Iw":
        return int(faiss.IO_FLAG_MMAP)
    if fourcc[:3] in (b"IxF", b"IHN") or fourcc in (b"IxM2", b"IxMp"):
        return int(faiss.IO_FLAG_MMAP_IFC)
    return 0
