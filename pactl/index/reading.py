"""A bundle read back: the current generation loaded whole, every file checked against
meta.json (format, version, sizes, checksums, counts, search settings) before FAISS reads it,
and the facts a rebuild keeps (ids, deletions)."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl.codes.rotation import ROTATION_KINDS, Rotation
from pactl.errors import PactlError
from pactl.index.binary.build import ROTATION_FILE, apply_search_params
from pactl.index.binary.search import BinaryIndex
from pactl.index.build import faiss_reason
from pactl.index.bundle import (
    BINARY_VERSION,
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    DELETED_FILE,
    INDEX_FILE,
    ITEMS_FILE,
    MAX_SEARCH_SETTING,
    META_FILE,
    REMOVED_FILE,
    SET_FORMAT,
    Bundle,
    ondisk_lists,
)
from pactl.index.gpus import faiss_gpus, gpu_searcher
from pactl.index.ondisk import (
    IVFDATA_FILE,
    quiet_c_stdout,
)
from pactl.index.rescoring import FLOATS_FILE, MAX_RESCORE, RescoredIndex
from pactl.index.search import in_sorted
from pactl.store import json_fields
from pactl.store.generations import (
    check_files,
    read_current,
)
from pactl.store.item_table import TABLE_FILE, ItemTable
from pactl.store.vectors_folder import VECTORS_FORMAT
from pactl.version import __version__


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
    if gpus and not hasattr(bundle.index, "floats"):  # codes rescored search on the CPU
        searcher = gpu_searcher(bundle.index, gpus)
        bundle.gpu_index = searcher if searcher is not bundle.index else None
    return bundle


def _load_generation(path: Path, gen: Path, mmap: bool) -> Bundle:
    meta, items, deleted = read_tables(path, gen)
    binary = meta["version"] == BINARY_VERSION
    index, flag = _read_codes(path, gen, meta, items) if binary else _read_index(gen, meta, mmap)
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
    check_count(path, meta, items, deleted)
    params = str(meta.get("search_params") or "")
    if params and not binary:  # a binary bundle's were set as its codes were read
        try:
            space: Any = faiss.ParameterSpace()
            space.set_index_parameters(index, params)
        except RuntimeError as e:
            raise PactlError(f"bundle {path}: search_params {params!r}: {faiss_reason(e)}") from e
    removed = _read_removed(gen, meta)
    if not binary and meta.get("rescore"):  # lossy float codes rescored on floats.npy
        fix = "rebuild it with `pactl index`"
        floats = _npy(path, gen, FLOATS_FILE, fix, mmap=True)
        if floats.shape != (index.ntotal, index.d) or floats.dtype != np.float32:
            raise PactlError(
                f"bundle {path}: {FLOATS_FILE} {floats.shape} does not fit its index "
                f"({index.ntotal:,} x {index.d}): {fix}"
            )
        index = RescoredIndex(index, floats, items.positions, int(meta["rescore"]))
    return Bundle(path, index, items, meta, flag != 0, deleted, removed=removed)


def read_tables(path: Path, gen: Path) -> tuple[dict[str, Any], ItemTable, np.ndarray]:
    """meta.json, the item table and the deleted ids of a generation, checked against each
    other (the index itself is not read)."""
    for name in (META_FILE, ITEMS_FILE, INDEX_FILE):
        if not (gen / name).is_file():
            if name != META_FILE:  # its format first: a bundle set has none of these files
                read_meta(path, gen)
            raise PactlError(f"bundle {path} lacks {name}: rebuild it with `pactl index`")
    meta = read_meta(path, gen)
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


def check_count(path: Path, meta: dict[str, Any], items: ItemTable, deleted: np.ndarray) -> None:
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
        meta, items, deleted = read_tables(path, gen)
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
    return int(read_current(path, lambda gen: read_meta(path, gen))["count"])


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
        with quiet_c_stdout() if on_disk else contextlib.nullcontext():
            index = faiss.read_index(str(index_file), flag)
    except RuntimeError as e:
        why = faiss_reason(e)
        raise PactlError(
            f"{index_file} is truncated or corrupt ({why}): rebuild it with `pactl index`"
        ) from e
    if on_disk:
        _check_lists_fit(index, ivfdata)
    return index, flag


def _read_codes(path: Path, gen: Path, meta: dict[str, Any], items: ItemTable) -> tuple[Any, int]:
    """A binary bundle's index: index.faiss (FAISS's binary format), its rotation.npy and its
    floats.npy (memory-mapped), each checked against meta.json's "binary" record and the
    others; the tuned search setting set. Returns the BinaryIndex and read flag 1 (the float
    vectors are read in place)."""
    record, fix = meta["binary"], "rebuild it with `pactl index --binary`"
    index_file = gen / INDEX_FILE
    _check_size(index_file, meta.get("index_bytes"))
    try:
        codes = faiss.read_index_binary(str(index_file))
    except RuntimeError as e:
        raise PactlError(f"{index_file} is truncated or corrupt ({faiss_reason(e)}): {fix}") from e
    rotation = Rotation.from_array(
        record["rotation"], _npy(path, gen, ROTATION_FILE, fix), str(path / ROTATION_FILE)
    )
    floats = _npy(path, gen, FLOATS_FILE, fix, mmap=True)
    facts = (codes.d, rotation.bits, rotation.dim, floats.shape, floats.dtype)
    wanted = (record["bits"], record["bits"], meta["dimension"], (codes.ntotal, meta["dimension"]))
    if facts != (*wanted, np.float32):
        raise PactlError(
            f"bundle {path}: its codes ({codes.d} bits), {ROTATION_FILE} {rotation.matrix.shape} "
            f"and {FLOATS_FILE} {floats.shape} do not fit meta.json ({record['bits']} bits of "
            f"{meta['dimension']}-d vectors): {fix}"
        )
    apply_search_params(codes, str(meta.get("search_params") or ""))
    return BinaryIndex(codes, rotation, floats, items.positions, record["rescore"]), 1


def _npy(path: Path, gen: Path, name: str, fix: str, mmap: bool = False) -> np.ndarray:
    """A .npy file of a binary bundle (memory-mapped where asked), one line when unreadable."""
    try:
        return np.load(gen / name, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise PactlError(f"{path / name} is truncated or corrupt ({e}): {fix}") from None


def _check_lists_fit(index: Any, ivfdata: Path) -> None:
    """The lists index.faiss describes must lie inside index.ivfdata: past its end they would
    fault (SIGBUS) at search time instead of failing here."""
    lists = ondisk_lists(index)
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


def read_meta(path: Path, gen: Path) -> dict[str, Any]:
    """meta.json of a bundle generation, every field pactl uses checked (one line naming it)."""
    where = path / META_FILE
    meta = json_fields.read_json_object(gen / META_FILE, where, "a pactl bundle's meta.json")
    found = meta.get("format")
    if found != BUNDLE_FORMAT:
        vectors = found == VECTORS_FORMAT
        hint = "; it holds vectors: index them with `pactl index`" if vectors else ""
        if found == SET_FORMAT:  # pactl.index.sets: searched as one, never changed in place
            hint = (
                "; it is a bundle set: query or serve it, and rebuild it with `pactl index "
                "VECTORS --keep-shards` to change it"
            )
        raise PactlError(f"{path} is not a pactl bundle (meta.json format {found!r}){hint}")
    version = meta.get("version")
    if type(version) is not int or not 1 <= version <= BUNDLE_VERSION:
        raise PactlError(
            f"bundle {path} has version {version!r}; pactl {__version__} reads versions 1 to "
            f"{BUNDLE_VERSION}: rebuild it with `pactl index`"
        )
    json_fields.field(meta, "dimension", int, where, 1, 65_536)
    json_fields.field(meta, "count", int, where, 0, 2**40)
    json_fields.field(meta, "deleted", int, where, 0, 2**40, optional=True)
    json_fields.field(meta, "next_id", int, where, 0, 2**62, optional=True)
    json_fields.field(meta, "fingerprint", str, where, optional=True)
    json_fields.field(meta, "checkpoint", str, where, optional=True)
    json_fields.field(meta, "model_config", dict, where, optional=True)
    json_fields.field(meta, "factory", str, where, optional=True)
    json_fields.field(meta, "on_disk", bool, where, optional=True)
    json_fields.field(meta, "checksums", dict, where, optional=True)
    for key in ("index_bytes", "ivfdata_bytes"):
        json_fields.field(meta, key, int, where, 0, 2**62, optional=True)
    json_fields.field(meta, "rescore", int, where, 0, MAX_RESCORE, optional=True)
    params = json_fields.field(meta, "search_params", str, where, optional=True)
    if params:
        _check_search_params(params, where)
    if version == BINARY_VERSION:
        _check_binary_record(meta, where)
    return meta


def _check_binary_record(meta: dict[str, Any], where: Path) -> None:
    """A binary bundle's "binary" record: its bits, rotation and rescoring depth."""
    record = json_fields.field(meta, "binary", dict, where)
    inner = where.parent / "meta.json: binary"
    json_fields.field(record, "bits", int, inner, 8, 2**20)
    json_fields.field(record, "rescore", int, inner, 0, MAX_RESCORE)
    if record["bits"] % 8 or record.get("rotation") not in ROTATION_KINDS:
        raise PactlError(
            f"{where}: binary record {record!r:.120} has bits that are not whole bytes or an "
            "unknown rotation: rebuild the bundle with `pactl index --binary`"
        )


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
