"""The verbs' library side: each CLI command calls one function here."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pactl.config import (
    IndexConfig,
    ModelConfig,
    OnnxConfig,
    ParquetConfig,
    Preset,
    QdrantConfig,
    read_config,
)
from pactl.console import Reporter, counted
from pactl.errors import PactlError

if TYPE_CHECKING:
    from pactl.checkpoint import ModelSource


def source_items(
    source: str, split: str | None, reporter: Reporter, follow_links: bool = False
) -> tuple[list[Path], list[str]]:
    """Images and labels to embed: a plain folder (labels from class sub-folders, if any),
    or the rows of a dataset / manifest / CSV (optionally one split). Links that lead out of
    the folder are skipped (a folder) or refused (a manifest row) unless `follow_links`."""
    from pactl.datasets import list_images, load_source

    path = Path(source)
    if split is None and path.is_dir() and not (path / "manifest.csv").is_file():
        files = list_images(path, follow_links=follow_links, reporter=reporter)
        if not files:
            raise PactlError(f"{path} has no images")
        labels = [f.relative_to(path).parts[0] if f.parent != path else "" for f in files]
        return files, labels
    manifest = load_source(source, reporter, follow_links=follow_links, splits=split is not None)
    if split:
        manifest = manifest.select(split)
        if not len(manifest):
            raise PactlError(f"{source} has no rows in split {split!r}")
    return manifest.files(), list(manifest.class_names)


def embed_source(
    source: str,
    model_from: ModelSource,
    out_dir: Path,
    split: str | None,
    device_name: str,
    reporter: Reporter,
    batch_size: int = 128,
    workers: int = 0,
    amp: str = "none",
    shard: str | None = None,
    follow_links: bool = False,
    commit_every: int | None = None,
    gpu_decode: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Embed a source with a checkpoint or a backbone (`model_from`) into `out_dir`, or with
    `shard` ("i/n", "auto") one slice of it into `out_dir/shards/<i>-of-<n>/`; ids are positions
    in the whole (sorted) input list. Progress is committed every `commit_every` images
    (default pactl.config.COMMIT_EVERY). Vectors of another network in `out_dir` are replaced
    only with `overwrite`."""
    from pactl.embed import VECTORS_FILES, VECTORS_FORMAT, Shard, parse_shard
    from pactl.fsutil import check_replaceable

    part = parse_shard(shard) if shard else Shard()  # a usage mistake before any listing
    target = out_dir / "shards" / part.name if part.count > 1 else out_dir
    check_replaceable(target, VECTORS_FORMAT, VECTORS_FILES)
    files, labels = source_items(source, split, reporter, follow_links)
    ids = np.arange(len(files), dtype=np.int64)
    if part.count > 1:
        start, stop = part.bounds(len(files))
        files, labels, ids = files[start:stop], labels[start:stop], ids[start:stop]
        out_dir = out_dir / "shards" / part.name
        reporter.log(f"shard {part.index}/{part.count}: items {start} to {stop - 1}")
    return embed_source_files(
        files,
        labels,
        ids,
        model_from,
        out_dir,
        device_name,
        reporter,
        workers,
        batch_size,
        amp,
        commit_every=commit_every,
        gpu_decode=gpu_decode,
        replace_other=overwrite,
    )


def gather_vectors(folder: Path) -> tuple[np.ndarray, Any, dict[str, Any]]:
    """Vectors, items and meta of an embed folder, its shards joined in shard order (in
    memory; read_parts keeps them apart)."""
    parts, meta = read_parts(folder)
    vectors, items = _join_parts(parts)
    return vectors, items, meta


def read_parts(folder: Path) -> tuple[list[tuple[np.ndarray, Any]], dict[str, Any]]:
    """Per shard, in shard order, its memory-mapped vectors and ItemTable, and the set's meta
    (count summed); a folder without shards/ is one part, and so is each shard of the Parquet
    layout (pactl.interop.parquet). Nothing is joined or copied."""
    from pactl.embed import Shard, read_embedded
    from pactl.interop.parquet import is_parquet_folder, read_parquet

    if is_parquet_folder(folder):
        return read_parquet(folder)

    shards = sorted((folder / "shards").glob("*-of-*/meta.json"))
    if not shards:
        vectors, items, meta = read_embedded(folder)
        return [(vectors, items)], meta
    counts = {m.parent.name.split("-of-")[1] for m in shards}
    if len(counts) != 1:
        raise PactlError(
            f"{folder}/shards mixes shards of {len(counts)} different splits "
            f"({', '.join(sorted(counts))}): remove the set that is not wanted"
        )
    count = int(counts.pop())
    found = {m.parent.name for m in shards}
    missing = [i for i in range(count) if Shard(i, count).name not in found]
    if missing:
        shown = ", ".join(f"{i}/{count}" for i in missing[:8]) + (
            " ..." if len(missing) > 8 else ""
        )
        raise PactlError(
            f"{folder}/shards has {len(found)} of {count} shards; missing: {shown}. Finish them "
            f"with `pactl embed ... --out {folder} --shard i/{count}`"
        )
    read = [read_embedded(m.parent) for m in shards]
    fingerprints = {meta["fingerprint"] for _, _, meta in read}
    if len(fingerprints) != 1:
        raise PactlError(f"the shards in {folder}/shards were embedded with different models")
    parts = [(vectors, items) for vectors, items, _ in read]
    return parts, {**read[0][2], "count": sum(len(v) for v, _ in parts)}


def _join_parts(parts: list[tuple[np.ndarray, Any]]) -> tuple[np.ndarray, Any]:
    """One matrix and one ItemTable; more than one part is copied into memory."""
    from pactl.index import ItemTable

    if len(parts) == 1:
        return parts[0]
    vectors = np.concatenate([np.asarray(v) for v, _ in parts])
    return vectors, ItemTable.join([table for _, table in parts])


def index_vectors(
    vectors_dir: Path,
    out: Path | None,
    config: IndexConfig,
    reporter: Reporter,
    overwrite: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Build a bundle from an embed output folder; returns (bundle folder, meta).

    Shards are joined in memory, or, with on-disk merging (config.on_disk), indexed one at a time
    into an IVF whose lists go to index.ivfdata. A rebuild of a bundle that has items deleted
    keeps them deleted (by path): they are tombstones again in the new bundle, so a later
    rebuild still knows them, and the items a compaction removed stay listed as removed. A
    rebuild that would drop live items of the bundle (added with --add, or another set of
    images) is refused unless `overwrite`.
    """
    from pactl.fsutil import check_replaceable, new_generation
    from pactl.index import (
        BUNDLE_FILES,
        BUNDLE_FORMAT,
        ItemTable,
        build_ondisk_index,
        build_parts,
        rebuild_facts,
        wants_on_disk,
        write_bundle,
    )

    parts, meta = read_parts(vectors_dir)
    if meta["count"] == 0:
        raise PactlError(f"{vectors_dir} holds no vectors (every image was skipped?)")
    out = out or default_bundle_dir(meta.get("checkpoint"))
    check_apart(vectors_dir, out)
    check_replaceable(out, BUNDLE_FORMAT, BUNDLE_FILES)
    dim = int(parts[0][0].shape[1])
    try:
        before = rebuild_facts(out)
    except PactlError as e:  # the bundle being replaced is damaged: nothing of it is kept
        reporter.warn(f"{e}; rebuilding it without its deletions")
        before = None
    if before is not None and not overwrite:
        check_nothing_dropped(out, before.live, vectors_paths(parts), str(vectors_dir))
    gone = before.gone if before is not None else set()
    removed = before.removed if before is not None else None
    if before is not None and before.ids:
        parts = same_ids(parts, before.ids, before.next_id)
    dead = None
    with new_generation(out, BUNDLE_FILES) as gen:
        tables = [table for _, table in parts]
        items = ItemTable.join(tables) if len(tables) > 1 else tables[0]
        shards = [(vectors, part_items.ids) for vectors, part_items in parts]
        if wants_on_disk(config, meta["count"], dim, sharded=len(parts) > 1):
            index, tuning = build_ondisk_index(shards, config, reporter, gen)
        else:  # in memory, the shards read in turn and never joined
            index, tuning = build_parts(shards, config, reporter)
        if gone:
            dead = items.ids[_named(items, gone)]
            reporter.log(f"keeping {counted(len(dead), 'deleted image')} of {out} deleted")
        bundle_meta = {
            **{k: meta[k] for k in ("dimension", "count", "metric", "checkpoint", "fingerprint")},
            "checkpoint_relative": _relative(meta.get("checkpoint"), out),
            "model_config": meta["model_config"],
            "vectors": str(vectors_dir.resolve()),
            "calibration": _calibration_to_copy(meta, reporter),
            **tuning,
            **({"next_id": before.next_id} if before is not None else {}),
        }
        write_bundle(gen, index, items, bundle_meta, deleted=dead, removed=removed)
    bundle_meta["count"] = len(items) - (len(dead) if dead is not None else 0)
    return out, bundle_meta


def checkpoint_calibration(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The same-item calibration of the checkpoint that made the vectors of `meta`, while it
    holds the same weights; None for a backbone's vectors or a checkpoint never calibrated."""
    recorded = meta.get("checkpoint")
    if not recorded or not Path(recorded).is_file():
        return None
    from pactl.checkpoint import load  # torch: only when there is a checkpoint to read

    payload = load(Path(recorded))
    if payload.get("fingerprint") != meta.get("fingerprint"):
        return None
    calibration = payload.get("calibration")
    return calibration if isinstance(calibration, dict) else None


def _calibration_to_copy(meta: dict[str, Any], reporter: Reporter) -> dict[str, Any] | None:
    """What a new bundle records of its checkpoint's calibration; a checkpoint that cannot be
    read now (the vectors need only its record) leaves the bundle without one, said once."""
    try:
        return checkpoint_calibration(meta)
    except PactlError as e:
        reporter.warn(f"the bundle records no same-item calibration: {e}")
        return None


def calibration_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The same-item calibration recorded in a bundle's meta.json, else its checkpoint's (one
    calibrated after the bundle was built), else None."""
    recorded = meta.get("calibration")
    if isinstance(recorded, dict):
        return recorded
    return checkpoint_calibration(meta)


def same_ids(
    parts: list[tuple[np.ndarray, Any]], ids: dict[str, int], next_id: int
) -> list[tuple[np.ndarray, Any]]:
    """The parts with the ids the bundle being rebuilt gave their paths (an id names one image
    for good: a client that kept one, a running service, a --delete ID), and ids from
    `next_id` on for paths it never held."""
    from pactl.index import ItemTable

    out = []
    for vectors, table in parts:
        kept = np.fromiter((ids.get(p, -1) for p in table.paths), dtype=np.int64, count=len(table))
        fresh = np.flatnonzero(kept < 0)
        kept[fresh] = np.arange(next_id, next_id + len(fresh), dtype=np.int64)
        next_id += len(fresh)
        out.append((vectors, ItemTable(kept, table.paths, table.labels, table.sizes, table.mtimes)))
    return out


def vectors_paths(parts: list[tuple[np.ndarray, Any]]) -> set[str]:
    return {p for _, table in parts for p in table.paths}


def check_nothing_dropped(bundle: Path, live: set[str], incoming: set[str], source: str) -> None:
    """Refuse a rebuild of `bundle` from `source` that leaves out some of its live items (those
    it got from --add or POST /add, or a bundle of other images): without --overwrite nothing
    indexed is lost silently."""
    dropped = live - incoming
    if dropped:
        raise PactlError(
            f"rebuilding {bundle} from {source} would drop {len(dropped):,} of its "
            f"{len(live):,} items, which {source} does not hold (e.g. {min(dropped)}; items "
            "added with --add are in the bundle only): give --overwrite to rebuild without "
            "them, or another --out"
        )


def _named(items: Any, paths: set[str]) -> np.ndarray:
    """Whether each item's path is one of `paths`."""
    return np.fromiter((p in paths for p in items.paths), dtype=bool, count=len(items))


def _relative(checkpoint: str | None, bundle_dir: Path) -> str | None:
    """The checkpoint's path from the bundle folder: a run folder moved with its bundle inside
    (runs/<run>/index) still finds its best.pt."""
    if not checkpoint:
        return None
    return os.path.relpath(os.path.abspath(checkpoint), os.path.abspath(bundle_dir))


def bundle_checkpoint(meta: dict[str, Any], bundle_dir: Path) -> Path | None:
    """The checkpoint that made a bundle: where it was recorded, else where it lies relative to
    the bundle (the two moved together); None for a backbone's bundle."""
    recorded = meta.get("checkpoint")
    if not recorded:
        return None
    relative = meta.get("checkpoint_relative")
    for candidate in (Path(recorded), bundle_dir / relative if relative else None):
        if candidate is not None and candidate.is_file():
            return candidate
    raise PactlError(
        f"the checkpoint that made {bundle_dir} is not at {recorded} any more"
        + (f" nor at {bundle_dir / relative}" if relative else "")
        + ": pass the same checkpoint with --checkpoint PATH"
    )


def check_apart(vectors_dir: Path, out: Path) -> None:
    """A bundle folder may hold its vectors folder (`pactl index IMAGES` makes out/vectors), but
    must not be it, nor lie inside it: the bundle would replace its own input."""
    source, target = vectors_dir.resolve(), out.resolve()
    if target == source or source in target.parents:
        raise PactlError(
            f"the bundle {out} would overwrite its own input {vectors_dir}: "
            "give --out another folder"
        )


def add_to_index(
    source: str,
    bundle_dir: Path,
    split: str | None,
    device_name: str,
    reporter: Reporter,
    workers: int = 0,
    follow_links: bool = False,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Embed the images of `source` that the bundle lacks, or holds from before their file
    changed (size or mtime), with its own model and append them; a changed file's old item is
    deleted in the same new generation. Files gone from `source` are not deleted.

    `checkpoint`: the bundle's checkpoint where it lies now (its recorded place may be gone);
    one with other weights than the bundle's is refused before any work."""
    from pactl.fsutil import remove_stale, writer_lock
    from pactl.index import check_folder, load_bundle

    check_folder(bundle_dir)
    with writer_lock(bundle_dir):  # one writer at a time; queries go on reading
        remove_stale(bundle_dir)  # a .add left by a killed --add
        bundle = load_bundle(bundle_dir, mmap=False)  # handed over: freed before the add
        if checkpoint is not None:
            check_own_checkpoint(checkpoint, bundle.meta, bundle_dir)
        files, labels = source_items(source, split, reporter, follow_links)
        return _add_locked(
            files, labels, source, bundle, bundle_dir, device_name, reporter, workers, checkpoint
        )


def check_own_checkpoint(checkpoint: Path, meta: dict[str, Any], bundle_dir: Path) -> None:
    """Refuse a checkpoint whose weights are not those that made the bundle (fingerprints)."""
    from pactl import checkpoint as ckpt

    theirs = ckpt.fingerprint(ckpt.load(checkpoint)["model"])
    mine = meta.get("fingerprint")
    if theirs != mine:
        raise PactlError(
            f"{checkpoint} is not the network of {bundle_dir} (weights fingerprint "
            f"{theirs[:12]}, the bundle's {str(mine)[:12]}): --add embeds with the bundle's own "
            "network; give its checkpoint, or none, or build a new bundle"
        )


def _add_locked(
    files: list[Path],
    labels: list[str],
    source: str,
    bundle: Any,
    bundle_dir: Path,
    device_name: str,
    reporter: Reporter,
    workers: int,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    from pactl.index import add_to_bundle, bundle_count

    new, changed, kept_out = _to_embed(files, labels, bundle)
    if kept_out:
        reporter.log(
            f"{counted(kept_out, 'image')} of {source} deleted from {bundle_dir} and unchanged "
            "since: left out (a changed file, e.g. touched, is added again)"
        )
    if not new:
        some = "every other image" if kept_out else "every image"
        reporter.log(f"{some} of {source} is already in {bundle_dir}, unchanged")
        return {"added": 0, "replaced": 0, "count": bundle.live_count}
    if changed:
        reporter.log(f"replacing {counted(len(changed), 'changed image')}")
    scratch = bundle_dir / ".add"
    first = bundle.next_id
    ids = np.arange(first, first + len(new), dtype=np.int64)
    recorded = checkpoint or bundle_checkpoint(bundle.meta, bundle_dir)
    model_from: ModelSource = recorded or read_config(
        ModelConfig, bundle.meta.get("model_config"), f"{bundle_dir / 'meta.json'}: model_config"
    )
    del bundle  # release the index file before it is rewritten
    try:
        embed_source_files(
            [f for f, _ in new],
            [lab for _, lab in new],
            ids,
            model_from,
            scratch,
            device_name,
            reporter,
            workers,
            scratch=True,
        )
        vectors, items, meta = gather_vectors(scratch)
        # Only a changed file that was embedded again loses its old vector (one unreadable now
        # keeps it); old and new change places in one generation.
        replaces = [changed[k] for k in map(os.path.abspath, items.paths) if k in changed]
        add_to_bundle(
            bundle_dir, np.ascontiguousarray(vectors), items, meta, reporter, replaces=replaces
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    added = len(items) - len(replaces)
    return {"added": added, "replaced": len(replaces), "count": bundle_count(bundle_dir)}


def _to_embed(
    files: list[Path], labels: list[str], bundle: Any
) -> tuple[list[tuple[Path, str]], dict[str, int], int]:
    """The (file, label) pairs an --add embeds: those the bundle lacks, and those whose size or
    mtime_ns differs from what it recorded (unknown in older bundles: taken as unchanged); for
    the changed ones, their path -> the id of the live item they replace; and how many files
    were left out because they were deleted from the bundle (or compacted away) and are
    unchanged since (a sweep of the source folder does not bring back what was deleted; a
    changed file is new content and is added). Files gone from the source stay in the bundle."""
    items, removed = bundle.items, bundle.removed
    dead = bundle.is_deleted(items.ids).tolist()
    known: dict[str, int] = {}
    # path -> (size, mtime_ns) of a deleted item: compacted away, or a tombstone (newer)
    stats = zip(removed.sizes.tolist(), removed.mtimes.tolist(), strict=True)
    deleted = dict(zip(removed.paths, stats, strict=True))
    for at, (p, d) in enumerate(zip(items.paths, dead, strict=True)):
        if d:
            deleted[p] = (int(items.sizes[at]), int(items.mtimes[at]))
        else:
            known[p] = at
    new: list[tuple[Path, str]] = []
    changed: dict[str, int] = {}
    kept_out = 0
    for f, label in zip(files, labels, strict=True):
        key = os.path.abspath(f)
        row, gone = known.get(key), deleted.get(key)
        if row is None and gone is not None:
            if _changed(f, *gone):
                new.append((f, label))
            else:
                kept_out += 1
        elif row is None:
            new.append((f, label))
        elif _changed(f, int(items.sizes[row]), int(items.mtimes[row])):
            new.append((f, label))
            changed[key] = int(items.ids[row])
    return new, changed, kept_out


def _changed(file: Path, size: int, mtime_ns: int) -> bool:
    """Whether a file's size or mtime differs from the recorded one (-1: not recorded)."""
    try:
        now = os.stat(file)
    except OSError:
        return False  # gone or unreadable: its indexed vector stays
    return (size >= 0 and now.st_size != size) or (mtime_ns >= 0 and now.st_mtime_ns != mtime_ns)


def embed_source_files(
    files: list[Path],
    labels: list[str],
    ids: np.ndarray,
    model_from: ModelSource,
    out_dir: Path,
    device_name: str,
    reporter: Reporter,
    workers: int = 0,
    batch_size: int = 128,
    amp: str = "none",
    scratch: bool = False,
    commit_every: int | None = None,
    gpu_decode: bool = False,
    replace_other: bool = False,
) -> dict[str, Any]:
    """Embed `files` (with explicit `ids`) with a checkpoint's or a backbone's network
    (`scratch`: into a private folder; `replace_other`: over vectors of another network;
    pactl.embed.embed_to_folder)."""
    from pactl.checkpoint import open_network
    from pactl.config import COMMIT_EVERY
    from pactl.embed import embed_to_folder
    from pactl.runtime import resolve_device

    model, network = open_network(model_from)
    device = resolve_device(device_name)
    model.to(device)
    return embed_to_folder(
        model,
        network,
        files,
        labels,
        ids,
        out_dir,
        device,
        reporter,
        batch_size=batch_size,
        workers=workers,
        amp=amp,
        scratch=scratch,
        commit_every=commit_every or COMMIT_EVERY,
        gpu_decode=gpu_decode,
        replace_other=replace_other,
    )


def default_bundle_dir(checkpoint: str | Path | None) -> Path:
    """`runs/<run>/index` for a checkpoint inside a run folder, else `./index`."""
    if checkpoint is None:
        return Path("index")
    run = Path(checkpoint).parent
    return run / "index" if (run / "config.json").is_file() else Path("index")


def index_images(
    source: str,
    model_from: ModelSource,
    out: Path | None,
    split: str | None,
    config: IndexConfig,
    device_name: str,
    reporter: Reporter,
    workers: int = 0,
    follow_links: bool = False,
    overwrite: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Embed `source` with a checkpoint or a backbone, then index it, in one go. A bundle
    already there is checked first: one of another kind, or whose live items `source` lacks
    (without `overwrite`), is refused before any embedding."""
    from pactl.embed import VECTORS_FILES, VECTORS_FORMAT
    from pactl.fsutil import check_replaceable
    from pactl.index import BUNDLE_FILES, BUNDLE_FORMAT, rebuild_facts

    bundle = out or default_bundle_dir(model_from if isinstance(model_from, Path) else None)
    check_replaceable(bundle, BUNDLE_FORMAT, BUNDLE_FILES)  # before minutes of embedding
    vectors_dir = bundle / "vectors"
    check_replaceable(vectors_dir, VECTORS_FORMAT, VECTORS_FILES)
    files, labels = source_items(source, split, reporter, follow_links)
    if not overwrite:
        try:
            live = rebuild_facts(bundle).live
        except PactlError:
            live = set()  # damaged: index_vectors says so, and rebuilds it
        check_nothing_dropped(bundle, live, {os.path.abspath(f) for f in files}, source)
    ids = np.arange(len(files), dtype=np.int64)
    # the bundle's own vectors: rebuilt with it, whatever network made the old ones
    embed_source_files(
        files, labels, ids, model_from, vectors_dir, device_name, reporter, workers,
        replace_other=True,
    )  # fmt: skip
    return index_vectors(vectors_dir, bundle, config, reporter, overwrite=True)


def index_latest_run(
    runs: Path,
    config: IndexConfig,
    device_name: str,
    reporter: Reporter,
    follow_links: bool = False,
    overwrite: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Right after `pactl train NAME`: index that dataset's test (gallery) images, following
    links where asked or where the run itself followed them."""
    from pactl.datasets import load_source
    from pactl.training.loop import latest_run, resumed_configs

    run = latest_run(runs)
    best = run / "best.pt"
    if not best.is_file():
        raise PactlError(f"{run} has no best.pt yet: let training finish an evaluated epoch")
    source, _, cfg = resumed_configs(run)
    follow = follow_links or cfg.follow_links
    manifest = load_source(source, reporter, follow_links=follow)
    split = "gallery" if manifest.has_split("gallery") else "test"
    reporter.log(f"indexing the {split} split of {source} with {best}")
    return index_images(
        source,
        best,
        run / "index",
        split,
        config,
        device_name,
        reporter,
        follow_links=follow,
        overwrite=overwrite,
    )


def find_bundle(runs: Path, name_one: str = "pass --index") -> Path:
    """The most recently written bundle under `runs/` (or `./index`)."""
    metas = [*runs.glob("*/index/meta.json"), *Path("index").glob("meta.json")]
    if not metas:
        raise PactlError(
            f"no index bundle under {runs}/ or ./index: build one with `pactl index` or {name_one}"
        )
    return max(metas, key=lambda p: p.stat().st_mtime).parent


@dataclass
class QueryChunk:
    names: list[str]  # the queries of this chunk that were embedded
    hits: list[list[Any]]  # per query, its pactl.index.search.Hit rows
    failed: list[tuple[str, str]]  # (query, reason without the path) of unreadable images
    labels: list[str | None]  # a query's label when it is itself an indexed item


def open_query_model(
    bundle_dir: Path, checkpoint: Path | None, device_name: str, faiss_device: str = "auto"
) -> tuple[Any, Any, Any, Any]:
    """Load the bundle (searching where `faiss_device` says) and its model once; refuse a
    model other than the bundle's."""
    from pactl.checkpoint import network_of
    from pactl.index import load_bundle
    from pactl.runtime import resolve_device

    bundle = load_bundle(bundle_dir, faiss_device=faiss_device)
    model, network = network_of(
        bundle.meta, checkpoint or bundle_checkpoint(bundle.meta, bundle_dir)
    )
    device = resolve_device(device_name)
    model.to(device)
    return bundle, model, network.config, device


def query_chunks(
    bundle_dir: Path,
    images: Any,
    k: int,
    checkpoint: Path | None,
    exclude_self: bool,
    device_name: str,
    reporter: Reporter,
    chunk: int = 512,
    batch_size: int = 128,
    know_labels: bool = False,
    faiss_device: str = "auto",
    qdrant: tuple[str, str] | None = None,
    same_item: bool = False,
    threshold: float | None = None,
) -> Any:
    """Yield a QueryChunk per `chunk` query images: memory stays bounded for any number.
    `qdrant`: (URL or folder, collection) searched instead of the bundle's index, the queries
    embedded with the bundle's network all the same. With `same_item`, only hits at or above
    the same-item threshold (`threshold`, else the bundle's calibrated one) are kept: a query
    may then have none."""
    opened = open_query_model(bundle_dir, checkpoint, device_name, faiss_device)
    least = None
    if same_item:
        from pactl.calibrate import same_item_threshold

        meta = opened[0].meta
        least, how = same_item_threshold(calibration_of(meta), str(bundle_dir), threshold)
        reporter.log(f"same item: {how}")
    find = None
    if qdrant is not None:
        from pactl.interop.qdrant import QdrantSearch

        find = QdrantSearch(*qdrant, int(opened[0].index.d), k)
    try:
        yield from answer_chunks(
            *opened, images, k, exclude_self, reporter, chunk, batch_size, know_labels, find, least
        )
    finally:
        if find is not None:
            find.close()


def answer_chunks(
    bundle: Any,
    model: Any,
    model_cfg: ModelConfig,
    device: Any,
    images: Any,
    k: int,
    exclude_self: bool,
    reporter: Reporter,
    chunk: int = 512,
    batch_size: int = 128,
    know_labels: bool = False,
    find: Any = None,
    least: float | None = None,
) -> Any:
    """query_chunks over a bundle and model already open (open_query_model): `pactl query` and
    pactl.api.Index.query embed and search query files by this one loop. `find(names, vectors,
    own ids or None)` gives the hits instead of the bundle's index (a Qdrant collection). Hits
    below `least` (a same-item threshold) are left out."""
    from itertools import islice

    from pactl.embed import embed_files, fastpath
    from pactl.images import reason_of
    from pactl.index.search import PathIndex, hits, search

    if k > bundle.live_count:
        reporter.log(f"--k {k} is more than the {bundle.live_count} items indexed; showing all")
    # Queries are found among the indexed items only when that is asked for.
    wanted = exclude_self or know_labels
    lookup = PathIndex(bundle.items, skip=bundle.deleted) if wanted else None
    it = iter(images)
    while batch := list(islice(it, chunk)):
        if len(batch) >= fastpath.PREPARE_MIN_IMAGES:  # many queries: prepare the network, once
            model = fastpath.inference_model(model, model_cfg, device)
        done = embed_files(model, batch, model_cfg, device, reporter, batch_size=batch_size)
        names = [str(batch[i]) for i in done.rows]
        own = lookup.ids(names) if lookup else np.full(len(names), -1, dtype=np.int64)
        if find is None:
            scores, ids = search(bundle, done.vectors, k, own if exclude_self else None)
            found = hits(bundle, names, scores, ids)
        else:
            found = find(names, done.vectors, own if exclude_self else None)
        failed = [(str(batch[i]), reason_of(batch[i], why)) for i, why in done.failed]
        labels = [_item_label(bundle, int(i)) for i in own]
        if least is not None:
            found = [[h for h in row if h.score >= least] for row in found]
        yield QueryChunk(names, found, failed, labels)


def export_onnx(
    checkpoint: Path, out: Path, config: OnnxConfig, reporter: Reporter
) -> dict[str, Any]:
    """`pactl export CHECKPOINT --to onnx`: the network as an ONNX file checked by
    onnxruntime (pactl.interop.onnx_model)."""
    from dataclasses import asdict

    from pactl.interop.onnx_model import export_onnx as export

    return asdict(export(checkpoint, out, config, reporter))


def export_parquet(
    vectors_dir: Path, out: Path, config: ParquetConfig, reporter: Reporter
) -> dict[str, Any]:
    """`pactl export VECTORS --to parquet`: a vectors folder (its shards in order) in the
    clip-retrieval layout (pactl.interop.parquet)."""
    from pactl.interop.parquet import write_parquet

    check_apart(vectors_dir, out)
    parts, meta = read_parts(vectors_dir)
    return write_parquet(parts, meta, out, reporter, config)


def export_qdrant(
    source: Path, target: str, config: QdrantConfig, reporter: Reporter
) -> dict[str, int]:
    """`pactl export BUNDLE --to qdrant`: a bundle's live items (or a vectors folder's) as
    points of a Qdrant collection, skipping those already there (pactl.interop.qdrant)."""
    from pactl.index import META_FILE, load_bundle
    from pactl.interop.qdrant import bundle_vectors, export_vectors

    if (source / META_FILE).is_file() and (source / "index.faiss").exists():
        vectors, items = bundle_vectors(load_bundle(source, mmap=False))
    else:
        vectors, items, _ = gather_vectors(source)
    return export_vectors(vectors, items, target, config, reporter)


def _item_label(bundle: Any, item_id: int) -> str | None:
    if item_id < 0:
        return None
    return str(bundle.items.labels[bundle.items.positions(np.array([item_id]))[0]])


def eval_checkpoint(
    source: str,
    model_from: ModelSource,
    ks: tuple[int, ...],
    device_name: str,
    workers: int,
    reporter: Reporter,
    follow_links: bool = False,
) -> tuple[dict[str, float], ModelConfig]:
    """Recall@K, MAP@R, R-precision and NMI of a checkpoint's or a backbone's network on a
    dataset's test split, and the network's model config."""
    from pactl.checkpoint import open_network
    from pactl.config import TrainConfig
    from pactl.datasets import load_source
    from pactl.runtime import resolve_device
    from pactl.training.loop import evaluate

    manifest = load_source(source, reporter, follow_links=follow_links)
    evaluation = manifest.select(*manifest.eval_splits())
    if not len(evaluation):
        raise PactlError(f"{source} has no test split to evaluate on")
    model, network = open_network(model_from)
    device = resolve_device(device_name)
    model.to(device)
    cfg = TrainConfig(eval_ks=ks, workers=workers)
    scores = evaluate(model, evaluation, network.config, cfg, device, reporter, with_nmi=True)
    return scores, network.config


def calibrate_source(
    source: str,
    model_from: ModelSource,
    precision: float,
    device_name: str,
    workers: int,
    reporter: Reporter,
    follow_links: bool = False,
) -> Any:
    """The same-item calibration of a checkpoint's or a backbone's network on a dataset's
    held-out classes (its val split if it has one, else its test split); a checkpoint gets it
    stored, with calibration.png beside it. Returns the pactl.calibrate.Calibration."""
    from pactl.calibrate import CalibrationConfig, calibrate, describe
    from pactl.checkpoint import open_network
    from pactl.config import TrainConfig
    from pactl.datasets import load_source
    from pactl.runtime import resolve_device
    from pactl.training.loop import calibrate_checkpoint, split_vectors

    manifest = load_source(source, reporter, follow_links=follow_links)
    split = "val" if manifest.has_split("val") else "test"
    part = manifest.select("val") if split == "val" else manifest.select(*manifest.eval_splits())
    if not len(part):
        raise PactlError(f"{source} has no test split to calibrate on")
    device = resolve_device(device_name)
    cfg = TrainConfig(workers=workers, precision=precision)
    if isinstance(model_from, Path):
        return calibrate_checkpoint(model_from, part, split, cfg, device, reporter)
    model, network = open_network(model_from)
    model.to(device)
    vectors, labels = split_vectors(model, part, split, network.config, cfg, device, reporter)
    calibration = calibrate(vectors, labels, CalibrationConfig(precision=precision), split)
    reporter.log(f"{describe(calibration)} (not stored: no checkpoint)")
    return calibration


def registry_rows(what: str) -> tuple[list[str], list[list[str]]]:
    """`pactl list WHAT`: a header and one row per name the registry knows, in its order."""
    return _LISTINGS[what]()


def _backbone_rows() -> tuple[list[str], list[list[str]]]:
    from pactl.backbones import BACKBONES

    return ["name"], [[name] for name in BACKBONES] + [["timm:<model>"]]


def _preset_rows() -> tuple[list[str], list[list[str]]]:
    from pactl.config import PRESETS

    header = ["name", "backbone", "weights", "image_size", "epochs", "batch_size", "lr", "loss"]
    return [*header, "source"], [_preset_row(name, p) for name, p in PRESETS.items()]


def _preset_row(name: str, preset: Preset) -> list[str]:
    model, train = preset.model, preset.train
    sizes = [str(model.image_size), str(train.epochs), str(train.batch_size), f"{train.lr:g}"]
    return [name, model.backbone, model.weights, *sizes, train.loss, preset.source]


def _loss_rows() -> tuple[list[str], list[list[str]]]:
    from pactl.losses import LOSSES

    return ["name"], [[name] for name in LOSSES]


def _dataset_rows() -> tuple[list[str], list[list[str]]]:
    from pactl.datasets.catalog import CATALOG, status_rows

    def how(name: str, manual: bool) -> str:
        return "bundled" if CATALOG[name].offline else "--from (manual)" if manual else "download"

    header = ["name", "size", "classes", "images", "present", "how", "licence"]
    return header, [
        [row.name, row.size, str(row.classes), str(row.images), "yes" if row.present else "no"]
        + [how(row.name, row.manual), row.licence]
        for row in status_rows()
    ]


_LISTINGS = {
    "backbones": _backbone_rows,
    "presets": _preset_rows,
    "losses": _loss_rows,
    "datasets": _dataset_rows,
}
