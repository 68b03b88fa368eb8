"""The bundle's format: index.faiss, items.csv and meta.json (and index.ivfdata, deleted.npy,
removed.bin; a binary bundle's rotation.npy and floats.npy) written as one generation of a folder
(pactl.store.generations), and the Bundle as loaded. Reading it back is pactl.index.reading's;
appending, deleting and compacting pactl.index.upkeep's.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl.errors import PactlError
from pactl.index.binary.build import ROTATION_FILE
from pactl.index.binary.search import BinaryIndex
from pactl.index.gpus import GPU_MAX_K
from pactl.index.mapped import blocks
from pactl.index.ondisk import (
    IVFDATA_FILE,
)
from pactl.index.rescoring import FLOATS_FILE, RescoredIndex, write_floats
from pactl.index.search import in_sorted
from pactl.store import checksums
from pactl.store.generations import (
    new_generation,
    record_files,
)
from pactl.store.item_table import TABLE_FILE, ItemTable
from pactl.version import __version__

BUNDLE_FORMAT = "pactl.bundle"
SET_FORMAT = "pactl.bundle_set"  # shard bundles answered as one (pactl.index.sets)
BUNDLE_VERSION = 3  # 2: may hold deleted.npy; 3: binary codes (index.faiss a FAISS binary index)
TOMBSTONES_VERSION = 2  # a pactl that reads only version 1 would return deleted items: refused
# a pactl that reads versions 1 and 2 would take a binary index.faiss for a damaged one: refused
BINARY_VERSION = 3
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
    ROTATION_FILE,
    FLOATS_FILE,
)
MAX_SEARCH_SETTING = 10_000_000  # nprobe / efSearch beyond this is a typo or a tampered file


@dataclass
class Bundle:
    path: Path  # the bundle folder
    index: Any  # faiss.Index (a BinaryIndex for codes), search parameters set from meta.json
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
    binary = isinstance(index, BinaryIndex)
    codes = index.index if isinstance(index, RescoredIndex) else index
    lists = None if binary else ondisk_lists(codes)
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
    if binary:
        _write_codes(gen, index)
    elif isinstance(index, RescoredIndex):  # its floats.npy was placed in `gen` as it was built
        _check_floats_placed(gen, index)
        faiss.write_index(index.index, str(gen / INDEX_FILE))
    else:
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
    version = BINARY_VERSION if (gen / ROTATION_FILE).is_file() else version
    header = {"format": BUNDLE_FORMAT, "version": version, "pactl_version": __version__}
    mine = {*header, *derived, "index_bytes", "ivfdata_bytes", "generation", "files", "checksums"}
    rest = {k: v for k, v in meta.items() if k not in mine}
    full = record_files(gen, {**header, **rest, **derived})
    full["checksums"] = checksums.record(gen, full["files"], known)
    full = checksums.seal(full)  # meta.json's own fields steer answers too
    (gen / META_FILE).write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")


def _write_codes(gen: Path, binary: BinaryIndex) -> None:
    """A binary bundle's index.faiss (FAISS's binary format), rotation.npy and floats.npy (kept
    where the build or an upkeep wrote it into `gen`, else copied from the one it maps)."""
    faiss.write_index_binary(binary.codes, str(gen / INDEX_FILE))
    np.save(gen / ROTATION_FILE, binary.rotation.to_array(), allow_pickle=False)
    source = Path(getattr(binary.floats, "filename", "") or "")
    if not (source.is_file() and source.resolve() == (gen / FLOATS_FILE).resolve()):
        chunks = (block for _, block in blocks(binary.floats))
        binary.floats = write_floats(gen / FLOATS_FILE, binary.floats.shape, chunks)
    if binary.floats.shape != (binary.ntotal, binary.d):
        raise PactlError(f"{binary.floats.shape} float vectors for {binary.ntotal} codes")


def _check_floats_placed(gen: Path, index: RescoredIndex) -> None:
    """A rescored float index's floats.npy must be the file in `gen` it maps, of its shape."""
    source = Path(getattr(index.floats, "filename", "") or "")
    placed = source.is_file() and source.resolve() == (gen / FLOATS_FILE).resolve()
    if not placed or index.floats.shape != (index.ntotal, index.d):
        raise PactlError(
            f"the float vectors of a rescored index are not {gen / FLOATS_FILE} "
            f"({index.floats.shape} for {index.ntotal} items): rebuild it with `pactl index`"
        )


def ondisk_lists(index: Any) -> Any | None:
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
