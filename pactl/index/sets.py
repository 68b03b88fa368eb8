"""Bundle sets: shard bundles filled from one trained index, tuned once on their union, and
answered as one bundle by `pactl query`, `pactl serve` and the API.

A set is a folder whose meta.json (format pactl.bundle_set) names its shard bundles
(`shards/<i>-of-<n>/`, each a normal bundle folder), the digest of the trained empty index they
were all filled from (so their scores compare), the search setting tuned once on their union
against exact neighbours, and the digest of each shard's meta.json (a shard changed since is
refused). Item ids are the vectors' own, distinct across the shards, so a hit's path is its
shard's item's. The set changes as a whole: its shards are written inside a new generation of
the set folder, which becomes current, with its meta.json, in one rename.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from pactl.config import IndexConfig
from pactl.console import Reporter
from pactl.errors import PactlError
from pactl.index.build import add_parts, check_parts, choose_factory, new_index, train_index
from pactl.index.bundle import (
    BINARY_VERSION,
    BUNDLE_FILES,
    META_FILE,
    SET_FORMAT,
    Bundle,
    write_bundle,
)
from pactl.index.gpus import faiss_gpus
from pactl.index.reading import check_folder, load_bundle
from pactl.index.rescoring import FLOATS_FILE, MAX_RESCORE, RescoredIndex, lossy, place_floats
from pactl.index.sharded import StackedRows, as_one
from pactl.index.tune import TUNING_FLOOR_S, TUNING_SHARE, search_knob, tune_search
from pactl.index.verify import verify_bundle
from pactl.store import checksums, json_fields
from pactl.store.generations import (
    check_files,
    new_generation,
    read_current,
    record_files,
)
from pactl.store.item_table import ItemTable
from pactl.version import __version__

SET_VERSION = 1
SHARDS_DIR = "shards"  # shards/<i>-of-<n>/, one bundle each, inside the set's generation
SET_FILES = (META_FILE, SHARDS_DIR)
SHARD_NAME = re.compile(r"[0-9]{5}-of-[0-9]{5}")  # one path component, as the vectors' shards
FIX = "rebuild the set with `pactl index VECTORS --keep-shards`"
BUNDLE_FIX = "rebuild the bundle"  # how a bundle's refusal begins its advice
Parts = Sequence[tuple[np.ndarray, ItemTable]]  # per shard: its vectors and items


def is_bundle_set(path: Path) -> bool:
    """Whether `path` holds a bundle set: its meta.json's format says so."""
    try:
        found = json.loads((path / META_FILE).read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError):
        return False
    return bool(found == SET_FORMAT)


def load_bundle_or_set(path: Path, mmap: bool = True, faiss_device: str = "cpu") -> Bundle:
    """A bundle (pactl.index.reading.load_bundle), or a bundle set loaded as one Bundle."""
    if is_bundle_set(path):
        return load_set(path, mmap, faiss_device)
    return load_bundle(path, mmap, faiss_device)


def verify_bundle_or_set(path: Path, reporter: Reporter | None = None) -> checksums.Checked | None:
    """verify_bundle of a bundle, or of each shard bundle of a set once the set itself loads
    (its meta.json's fields, its shards' digests): the files of all of them together."""
    if not is_bundle_set(path):
        return verify_bundle(path, reporter)
    bundle = load_set(path)
    checked = []
    for entry in bundle.meta["shards"]:
        try:
            found = verify_bundle(path / entry["folder"], reporter)
        except PactlError as e:
            raise shard_damaged(path, entry["folder"], e) from None
        if found is None:  # a set's shards are written with checksums: never older
            raise PactlError(f"{path / entry['folder']} records no checksums: {FIX}")
        checked.append((entry["folder"], found))
    files = tuple(f"{folder}/{name}" for folder, found in checked for name in found.files)
    size = sum(found.size for _, found in checked)
    return checksums.Checked(files, size, all(found.meta for _, found in checked))


# ---------------------------------------------------------------------------- building


def build_set(
    parts: Parts, out: Path, config: IndexConfig, reporter: Reporter, meta: dict[str, Any]
) -> dict[str, Any]:
    """Train one index on a seeded sample of all the parts, fill one shard bundle per part
    from copies of it, tune the search setting once on their union, and write the set at
    `out` as a new generation of it. `meta`: the vectors' fields every bundle records
    (checkpoint, fingerprint, model_config, ...). Returns the set's meta.json."""
    check_apart(parts)
    shards = [(vectors, table.ids) for vectors, table in parts]
    n, dim = check_parts(shards)
    factory = config.factory or choose_factory(n, dim, config.memory_budget_gb)
    gpus = faiss_gpus(config.faiss_device)
    started = time.perf_counter()
    seed = 0
    rng = np.random.default_rng(seed)
    empty = new_index(factory, dim)
    check_shardable(empty, factory)
    trained_on = train_index(empty, shards, rng, seed, reporter, factory, gpus)
    names = [f"{i:05d}-of-{len(parts):05d}" for i in range(len(parts))]
    with new_generation(out, SET_FILES, staged=True) as gen:
        with contextlib.ExitStack() as stack:
            folders = [gen / SHARDS_DIR / name for name in names]
            gens = [
                stack.enter_context(new_generation(f, BUNDLE_FILES, True, True)) for f in folders
            ]
            filled = [filled_copy(empty, part, reporter, gpus) for part in shards]
            floats = place_shard_floats(filled[0], parts, gens, config, reporter)
            union = tuning_view(empty, filled, floats, parts, config.rescore)
            share = max(TUNING_FLOOR_S, TUNING_SHARE * (time.perf_counter() - started))
            budget, target = config.query_budget_ms, config.target_recall
            tuning = tune_search(
                union, shards, target, rng, reporter, gpus, budget, config.rescore,
                tuning_seconds=share,
            )  # fmt: skip
            digest = trained_digest(empty)
            shared = {"factory": factory, "search_params": tuning["search_params"]}
            shared |= {"trained_digest": digest, **meta}
            final = [Path(os.path.abspath(out)) / gen.name / SHARDS_DIR / name for name in names]
            write_shards(gens, filled, floats, parts, tuning.get("rescore"), shared, final)
        entries = [
            shard_entry(gen, name, table) for name, (_, table) in zip(names, parts, strict=True)
        ]
        seconds = round(time.perf_counter() - started, 3)
        facts = {"train_points": trained_on, "seed": seed, "build_seconds": seconds}
        record = {**meta, "factory": factory, "trained_digest": digest, **tuning, **facts}
        record = write_set_meta(gen, {**record, "count": n, "ntotal": n, "shards": entries})
    reporter.log(f"built a set of {len(parts)} {factory} shard bundles in {seconds:.1f} s")
    return record


def check_apart(parts: Parts) -> None:
    """Refuse parts whose items overlap (an id or an image's path in two shards): one item
    would answer twice, and its id could not name one hit."""
    tables = [table for _, table in parts]
    for name, keys in (("id", [t.ids for t in tables]), ("path", [_hashes(t) for t in tables])):
        shard_of = np.concatenate([np.full(len(k), i) for i, k in enumerate(keys)])
        joined = np.concatenate(keys)
        order = np.argsort(joined, kind="stable")
        same = np.flatnonzero(np.diff(joined[order]) == 0)
        for at in same.tolist():
            first, second = order[at], order[at + 1]
            if shard_of[first] == shard_of[second]:
                continue  # within one shard: check_parts or the vectors' own rules say so
            if name == "path" and _path_at(tables, first) != _path_at(tables, second):
                continue  # a hash collision, not the same path
            shown = _path_at(tables, first) if name == "path" else int(joined[first])
            raise PactlError(
                f"the vectors' shards overlap: {name} {shown} is in shard {shard_of[first]} "
                f"and shard {shard_of[second]}; a set holds each item once: embed each image "
                "into one shard"
            )


def _hashes(table: ItemTable) -> np.ndarray:
    return np.fromiter((hash(p) for p in table.paths), dtype=np.int64, count=len(table))


def _path_at(tables: list[ItemTable], row: int) -> str:
    """The path of row `row` of the tables joined in order."""
    for table in tables:
        if row < len(table):
            return str(table.paths[int(row)])
        row -= len(table)
    raise IndexError(row)


def check_shardable(empty: Any, factory: str) -> None:
    """A set's shards are copies of one trained index, so only kinds whose search a copy
    repeats: an IVF (the lists of every shard probed alike) or flat codes. An HNSW graph is
    built per shard, its links unlike one graph's over all items: refused."""
    knob = search_knob(empty, 10)
    if knob is not None and knob.name != "nprobe":
        raise PactlError(
            f"--factory {factory}: a set's shards share one trained index, and an HNSW graph "
            "is built anew per shard; give an IVF factory (IVF1024,Flat) or Flat"
        )


def filled_copy(
    empty: Any, part: tuple[np.ndarray, np.ndarray], reporter: Reporter, gpus: int
) -> Any:
    """A copy of the trained empty index with one part's vectors added under their ids."""
    index = faiss.clone_index(empty)
    add_parts(index, [part], reporter, gpus)
    return index


def place_shard_floats(
    first: Any, parts: Parts, gens: list[Path], config: IndexConfig, reporter: Reporter
) -> list[np.ndarray] | None:
    """Each shard's floats.npy in its generation, for lossy codes rescored by cosine (unless
    config.rescore is 0); None for exact codes."""
    if config.rescore == 0 or not lossy(first):
        return None
    return [
        place_floats([(vectors, table.ids)], gen / FLOATS_FILE, reporter)
        for (vectors, table), gen in zip(parts, gens, strict=True)
    ]


def tuning_view(
    empty: Any,
    filled: list[Any],
    floats: list[np.ndarray] | None,
    parts: Parts,
    depth: int | None,
) -> Any:
    """The union of the filled shards as one FAISS index, to tune on: an IVF whose lists are
    the shards' lists stacked (FAISS's HStackInvertedLists: nothing copied), else the shards
    under one IndexShards; rescored on the shards' floats stacked where they were placed."""
    swig: Any = faiss  # (its stubs lack InvertedListsPtrVector and IndexShards' arguments)
    view: Any = swig.IndexShards(empty.d, False, False)  # not threaded, the shards' own ids
    ivf = faiss.try_extract_index_ivf(empty)
    kept: list[Any] = list(filled)  # what the view reads: alive as long as it is
    if ivf is not None:
        view = faiss.clone_index(empty)
        lists = swig.InvertedListsPtrVector()
        for index in filled:
            lists.push_back(faiss.extract_index_ivf(index).invlists)
        stacked = faiss.HStackInvertedLists(lists.size(), lists.data())
        inner = faiss.extract_index_ivf(view)
        inner.replace_invlists(stacked, False)
        inner.ntotal = view.ntotal = sum(int(index.ntotal) for index in filled)
        kept.append(stacked)
    else:
        for index in filled:
            view.add_shard(index)
    view.referenced_objects = kept
    if floats is None:
        return view
    stacked_floats: Any = StackedRows(floats)  # read as rows of one float matrix
    positions = ItemTable.join([table for _, table in parts]).positions
    return RescoredIndex(view, stacked_floats, positions, depth or 1)


def write_shards(
    gens: list[Path],
    filled: list[Any],
    floats: list[np.ndarray] | None,
    parts: Parts,
    depth: int | None,
    shared: dict[str, Any],
    folders: list[Path],
) -> None:
    """Each shard's bundle files into its generation, with the set's setting and digest;
    `folders`: where each shard bundle will lie once the set's generation is in place."""
    for i, (gen, index, (_, table)) in enumerate(zip(gens, filled, parts, strict=True)):
        meta = {**shared, **({"rescore": depth} if floats is not None else {})}
        checkpoint = meta.get("checkpoint")
        if checkpoint:  # from the shard folder as the file system resolves it
            meta["checkpoint_relative"] = os.path.relpath(os.path.abspath(checkpoint), folders[i])
        if floats is not None and depth:
            index = RescoredIndex(index, floats[i], table.positions, depth)
        write_bundle(gen, index, table, meta)


def shard_entry(gen: Path, name: str, table: ItemTable) -> dict[str, Any]:
    """The set's record of one shard: its folder, items and meta.json's digest."""
    folder = f"{SHARDS_DIR}/{name}"
    written = json.loads((gen / folder / META_FILE).read_text(encoding="utf-8"))
    return {"folder": folder, "count": len(table), "meta_digest": checksums.meta_digest(written)}


def write_set_meta(gen: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The set's meta.json, sealed with the digest of its fields."""
    header = {"format": SET_FORMAT, "version": SET_VERSION, "pactl_version": __version__}
    full = record_files(gen, {**header, **record})
    full["checksums"] = checksums.record(gen, full["files"])
    full = checksums.seal(full)
    (gen / META_FILE).write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")
    return full


def trained_digest(empty: Any) -> str:
    """The blake2b-256 of the trained empty index as FAISS writes it: shards filled from
    copies of it share it."""
    data = faiss.serialize_index(empty)
    return hashlib.blake2b(np.ascontiguousarray(data).tobytes(), digest_size=32).hexdigest()


# ---------------------------------------------------------------------------- reading


def load_set(path: Path, mmap: bool = True, faiss_device: str = "cpu") -> Bundle:
    """Open a set's current generation as one Bundle: every shard bundle loaded (each checked
    as a bundle is), then checked against the set (dimension and metric, trained index, its
    meta.json as the set recorded it, no item in two shards); its index searches every shard
    with the set's setting and merges the hits by score (pactl.index.sharded). Searches run
    on the CPU; `faiss_device` gpu is refused where FAISS has none, as for a bundle."""
    check_folder(path)
    faiss_gpus(faiss_device)
    return read_current(path, lambda gen: _load_generation(path, gen, mmap))


def _load_generation(path: Path, gen: Path, mmap: bool) -> Bundle:
    meta = read_set_meta(path, gen)
    shards = [_open_shard(path, entry["folder"], mmap) for entry in meta["shards"]]
    for entry, shard in zip(meta["shards"], shards, strict=True):
        check_shard(path, meta, entry, shard)
    repeated = _repeated(np.concatenate([shard.items.ids for shard in shards]))
    if repeated is not None:
        raise PactlError(
            f"bundle set {path}: its shards overlap (item id {repeated} is in two): {FIX}"
        )
    items = ItemTable.join([shard.items for shard in shards])
    codes = [_codes(shard.index) for shard in shards]
    params = str(meta.get("search_params") or "")
    if params:  # the set's, on every shard (each records it too)
        space: Any = faiss.ParameterSpace()
        for one in codes:
            space.set_index_parameters(one, params)
    depth = int(meta.get("rescore") or 0)
    floats = [shard.index.floats for shard in shards] if depth else None
    index = as_one(codes, floats, items.positions, depth)
    dead = np.unique(np.concatenate([shard.deleted for shard in shards]))
    mapped = all(shard.mmapped for shard in shards)
    return Bundle(path, index, items, meta, mapped, dead)


def _open_shard(path: Path, folder: str, mmap: bool) -> Bundle:
    """One shard bundle, or one line saying the set's shard is missing or damaged."""
    where = path / folder
    if not where.is_dir():
        raise PactlError(f"bundle set {path}: its shard bundle {folder} is missing: {FIX}")
    try:
        return load_bundle(where, mmap)
    except PactlError as e:
        raise shard_damaged(path, folder, e) from None


def shard_damaged(path: Path, folder: str, error: PactlError) -> PactlError:
    """A shard bundle's own refusal, said of its set: its advice to rebuild the bundle becomes
    the set's, since a shard rebuilt alone is trained apart from the others."""
    reason = str(error)
    cut = reason.find(BUNDLE_FIX)
    if cut >= 0:
        reason = f"{reason[:cut].rstrip(' :;,')}: {FIX}"
    return PactlError(f"bundle set {path}: shard bundle {folder} is damaged: {reason}")


def _codes(index: Any) -> Any:
    """A shard's FAISS index (under its rescoring, where it has one)."""
    return index.index if isinstance(index, RescoredIndex) else index


def check_shard(path: Path, meta: dict[str, Any], entry: dict[str, Any], shard: Bundle) -> None:
    """A shard bundle belongs to its set: a float bundle of its dimension and metric, filled
    from its trained index, rescored as it is, and its meta.json the one the set recorded."""
    folder, own = entry["folder"], shard.meta
    facts = (own["dimension"], own.get("metric"))
    if facts != (meta["dimension"], meta["metric"]):
        raise PactlError(
            f"bundle set {path}: shard bundle {folder} holds vectors of dimension {facts[0]}, "
            f"metric {facts[1]}; the set's are of dimension {meta['dimension']}, metric "
            f"{meta['metric']}: shards of different dimension or metric are not one set; {FIX}"
        )
    if own.get("version") == BINARY_VERSION or own.get("trained_digest") != meta["trained_digest"]:
        raise PactlError(
            f"bundle set {path}: shard bundle {folder} was trained apart from the set (its "
            "trained index is not the one the set's shards share), so its scores do not "
            f"compare: {FIX}"
        )
    if bool(own.get("rescore")) != bool(meta.get("rescore")):
        raise PactlError(
            f"bundle set {path}: shard bundle {folder} is rescored unlike the set: {FIX}"
        )
    if checksums.meta_digest(own) != entry["meta_digest"]:
        raise PactlError(
            f"bundle set {path}: shard bundle {folder} changed since the set was made (rebuilt, "
            f"or items added or deleted): {FIX}"
        )


def _repeated(ids: np.ndarray) -> int | None:
    """An id held twice, or None."""
    ordered = np.sort(ids)
    same = np.flatnonzero(np.diff(ordered) == 0)
    return int(ordered[same[0]]) if len(same) else None


def read_set_meta(path: Path, gen: Path) -> dict[str, Any]:
    """The set's meta.json, every field used checked, its sealed digest included."""
    where = path / META_FILE
    meta = json_fields.read_json_object(gen / META_FILE, where, "a pactl bundle set's meta.json")
    if meta.get("format") != SET_FORMAT:
        raise PactlError(
            f"{path} is not a pactl bundle set (meta.json format {meta.get('format')!r})"
        )
    version = meta.get("version")
    if type(version) is not int or not 1 <= version <= SET_VERSION:
        raise PactlError(
            f"bundle set {path} has version {version!r}; pactl {__version__} reads versions 1 "
            f"to {SET_VERSION}: {FIX}"
        )
    check_files(gen, meta, path, FIX)
    if not checksums.check_meta(meta, where, FIX):
        raise PactlError(f"{where} carries no checksum of its fields: {FIX}")
    json_fields.field(meta, "dimension", int, where, 1, 65_536)
    json_fields.field(meta, "metric", str, where)
    json_fields.field(meta, "trained_digest", str, where)
    json_fields.field(meta, "search_params", str, where, optional=True)
    json_fields.field(meta, "rescore", int, where, 0, MAX_RESCORE, optional=True)
    shards = json_fields.field(meta, "shards", list, where)
    if not shards:
        raise PactlError(f"{where} names no shard bundles: {FIX}")
    for entry in shards:
        folder = entry.get("folder") if isinstance(entry, dict) else None
        name = str(folder).removeprefix(f"{SHARDS_DIR}/")
        if not isinstance(folder, str) or not SHARD_NAME.fullmatch(name) or folder == name:
            raise PactlError(f"{where}: shard {entry!r:.80} is not {SHARDS_DIR}/<i>-of-<n>: {FIX}")
        json_fields.field(entry, "meta_digest", str, where)
    return meta
