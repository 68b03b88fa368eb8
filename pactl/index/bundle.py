"""Bundles on disk: index.faiss, items.csv and meta.json (and index.ivfdata) written as one
generation of a folder, loaded and checked whole, appended to."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl import __version__, records
from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.fsutil import (
    check_files,
    new_generation,
    read_current,
    record_files,
    writer_lock,
)
from pactl.index.build import _as_matrix, _why, add_vectors
from pactl.index.items import ItemTable
from pactl.index.ondisk import IVFDATA_FILE, _add_on_disk, _quiet_c_stdout

BUNDLE_FORMAT = "pactl.bundle"
BUNDLE_VERSION = 1
VECTORS_FORMAT = "pactl.vectors"
INDEX_FILE, ITEMS_FILE, META_FILE = "index.faiss", "items.csv", "meta.json"
BUNDLE_FILES = (INDEX_FILE, ITEMS_FILE, META_FILE, IVFDATA_FILE)
MAX_SEARCH_SETTING = 10_000_000  # nprobe / efSearch beyond this is a typo or a tampered file


@dataclass
class Bundle:
    path: Path  # the bundle folder
    index: Any  # faiss.Index, search parameters already set from meta.json
    items: ItemTable
    meta: dict[str, Any]
    mmapped: bool = False  # the index reads its codes from index.faiss (or .ivfdata) in place


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
) -> None:
    """Write a bundle's files into the fresh generation folder `gen`.

    `meta` should carry the vectors' checkpoint, fingerprint and model_config and the tuning
    record of build_index; format, version, dimension, count, the generation and the size of
    each file are set here from the index itself, so a loader can tell that the files belong
    together. An index with on-disk lists (build_ondisk_index) also gets index.ivfdata.
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
    derived = {
        "dimension": int(index.d),
        "count": int(index.ntotal),
        "metric": "ip" if index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2",
        "on_disk": lists is not None,
        "index_bytes": (gen / INDEX_FILE).stat().st_size,
        **({"ivfdata_bytes": (gen / IVFDATA_FILE).stat().st_size} if lists is not None else {}),
    }
    header = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "pactl_version": __version__}
    mine = {*header, *derived, "index_bytes", "ivfdata_bytes", "generation", "files"}
    rest = {k: v for k, v in meta.items() if k not in mine}
    full = record_files(gen, {**header, **rest, **derived})
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
    items: list[tuple[int, str, str]],
    meta_check: dict[str, Any],
    reporter: Reporter | None = None,
) -> None:
    """Append vectors (with their items) to a bundle; they must come from the bundle's model.

    `meta_check` is the new vectors' meta.json: its dimension and model fingerprint must match
    the bundle's. New ids must not be in the bundle yet. The tuned search setting is kept. The
    result is a new generation of the bundle (the old one is only read); an on-disk bundle gets
    a new index.ivfdata, its lists and the new ones merged into a fresh file.
    """
    with writer_lock(bundle_dir):
        bundle = load_bundle(bundle_dir, mmap=False)
        x = _as_matrix(vectors, "vectors")
        dim = int(bundle.index.d)
        for given in (x.shape[1], meta_check.get("dimension", x.shape[1])):
            if given != dim:
                raise PactlError(
                    f"new vectors have dimension {given}; bundle {bundle_dir} has {dim}"
                )
        mine, theirs = bundle.meta.get("fingerprint"), meta_check.get("fingerprint")
        if mine != theirs:
            raise PactlError(
                f"new vectors come from another model (fingerprint {str(theirs)[:12]}, bundle "
                f"{bundle_dir} has {str(mine)[:12]}): embed them with the bundle's checkpoint"
            )
        if len(items) != len(x):
            raise PactlError(f"{len(items)} items for {len(x)} new vectors")
        new = ItemTable.from_rows(items)
        clash = new.ids[bundle.items.positions(new.ids) >= 0]
        if len(clash):
            raise PactlError(
                f"id {int(clash[0])} is already in {bundle_dir} ({len(clash)} clashing ids); "
                f"number new items from {bundle.items.max_id() + 1}"
            )
        with new_generation(bundle_dir, BUNDLE_FILES) as gen:
            index = bundle.index
            if _ondisk_lists(index) is not None:
                index = _add_on_disk(index, x, new.ids, gen, reporter or QUIET)
            else:
                add_vectors(index, x, new.ids, reporter or QUIET)
            write_bundle(gen, index, bundle.items.concat(new), bundle.meta)


def load_bundle(path: Path, mmap: bool = True) -> Bundle:
    """Open a bundle's current generation, checking it is whole and consistent; sets the tuned
    search parameters.

    With `mmap`, index kinds that FAISS can map (IVF lists, flat codes) read their vectors from
    the file through the page cache instead of copying them into memory. An on-disk bundle
    (index.ivfdata) is always read that way, whatever `mmap` says.
    """
    check_folder(path)
    return read_current(path, lambda gen: _load_generation(path, gen, mmap))


def _load_generation(path: Path, gen: Path, mmap: bool) -> Bundle:
    for name in (META_FILE, ITEMS_FILE, INDEX_FILE):
        if not (gen / name).is_file():
            raise PactlError(f"bundle {path} lacks {name}: rebuild it with `pactl index`")
    meta = _read_meta(path, gen)
    check_files(gen, meta, path, "rebuild the bundle with `pactl index`")
    index, flag = _read_index(gen, meta, mmap)
    items = ItemTable.read(gen / ITEMS_FILE)
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
    params = str(meta.get("search_params") or "")
    if params:
        try:
            space: Any = faiss.ParameterSpace()
            space.set_index_parameters(index, params)
        except RuntimeError as e:
            raise PactlError(f"bundle {path}: search_params {params!r}: {_why(e)}") from e
    return Bundle(path, index, items, meta, mmapped=flag != 0)


def bundle_count(path: Path) -> int:
    """The number of items in the bundle's current generation (read from its meta.json)."""
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
    if meta.get("version") != BUNDLE_VERSION:
        raise PactlError(
            f"bundle {path} has version {meta.get('version')!r}; pactl {__version__} reads "
            f"version {BUNDLE_VERSION}: rebuild it with `pactl index`"
        )
    records.field(meta, "dimension", int, where, 1, 65_536)
    records.field(meta, "count", int, where, 0, 2**40)
    records.field(meta, "fingerprint", str, where, optional=True)
    records.field(meta, "checkpoint", str, where, optional=True)
    records.field(meta, "model_config", dict, where, optional=True)
    records.field(meta, "factory", str, where, optional=True)
    records.field(meta, "on_disk", bool, where, optional=True)
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
