"""`pactl index`: a bundle built from a vectors folder, from images in one go, or from the
latest run's test images; a rebuild keeps the ids and the deletions of the bundle it replaces.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pactl.config import EmbedConfig, IndexConfig
from pactl.console import Reporter, counted
from pactl.errors import PactlError
from pactl.verbs.embed import embed_bundle_files
from pactl.verbs.lineage import calibration_to_copy
from pactl.verbs.sources import source_items
from pactl.verbs.vector_sources import read_parts

if TYPE_CHECKING:
    from pactl.checkpoint import ModelSource

# (vectors folder, its (vectors, ids) parts, settings, reporter, the bundle's new generation,
# item ids -> item rows: where floats.npy keeps each) -> (index, tuning record): a float index
# built elsewhere (pactl.engines.indexing)
FloatBuild = Callable[
    [Path, list[Any], IndexConfig, Reporter, Path, Callable[[Any], Any]],
    tuple[Any, dict[str, Any]],
]


def index_vectors(
    vectors_dir: Path,
    out: Path | None,
    config: IndexConfig,
    reporter: Reporter,
    overwrite: bool = False,
    build: FloatBuild | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Build a bundle from an embed output folder; returns (bundle folder, meta).

    Shards are joined in memory, or, with on-disk merging (config.on_disk), indexed one at a time
    into an IVF whose lists go to index.ivfdata. A rebuild of a bundle that has items deleted
    keeps them deleted (by path): they are tombstones again in the new bundle, so a later
    rebuild still knows them, and the items a compaction removed stay listed as removed. A
    rebuild that would drop live items of the bundle (added with --add, or another set of
    images) is refused unless `overwrite`. `build` builds a float index elsewhere (another
    engine's shard tasks: pactl.engines.indexing) into the bundle's new generation.
    """
    from pactl.index import (
        BUNDLE_FILES,
        BUNDLE_FORMAT,
        ItemTable,
        rebuild_facts,
        write_bundle,
    )
    from pactl.index.binary.build import build_binary
    from pactl.store.generations import check_replaceable, new_generation

    parts, meta = read_parts(vectors_dir)
    if meta["count"] == 0:
        raise PactlError(f"{vectors_dir} holds no vectors (every image was skipped?)")
    binary = binary_config(config, meta, int(parts[0][0].shape[1]))
    if binary is not None and build is not None:
        raise PactlError(
            "--engine ray fills float IVF or Flat lists shard by shard; binary codes are built "
            "here (their rotation is learned and measured on all the vectors at once): drop "
            "--engine ray, or give --no-binary"
        )
    out = out or default_bundle_dir(meta.get("checkpoint"))
    check_apart(vectors_dir, out)
    check_replaceable(out, BUNDLE_FORMAT, BUNDLE_FILES)
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
    with new_generation(out, BUNDLE_FILES, staged=True) as gen:
        tables = [table for _, table in parts]
        items = ItemTable.join(tables) if len(tables) > 1 else tables[0]
        shards = [(vectors, part_items.ids) for vectors, part_items in parts]
        if binary is not None:  # codes, rescored from a float copy in the bundle
            index, tuning = build_binary(shards, binary, reporter, gen, items.positions)
        elif build is not None:
            index, tuning = build(vectors_dir, shards, config, reporter, gen, items.positions)
        else:
            index, tuning = build_float(shards, config, reporter, gen, items.positions)
        if gone:
            dead = items.ids[_named(items, gone)]
            reporter.log(f"keeping {counted(len(dead), 'deleted image')} of {out} deleted")
        bundle_meta = {
            **{k: meta[k] for k in ("dimension", "count", "metric", "checkpoint", "fingerprint")},
            "checkpoint_relative": _relative(meta.get("checkpoint"), out),
            "model_config": meta["model_config"],
            "vectors": str(vectors_dir.resolve()),
            "calibration": calibration_to_copy(meta, reporter),
            **tuning,
            **({"next_id": before.next_id} if before is not None else {}),
        }
        write_bundle(gen, index, items, bundle_meta, deleted=dead, removed=removed)
    bundle_meta["count"] = len(items) - (len(dead) if dead is not None else 0)
    return out, bundle_meta


def index_set(
    vectors_dir: Path,
    out: Path | None,
    config: IndexConfig,
    reporter: Reporter,
    shard_items: int | None = None,
) -> tuple[Path, dict[str, Any]]:
    """`pactl index VECTORS --keep-shards`: a bundle set (pactl.index.sets), one shard bundle
    per shard of the vectors folder, each cut into bundles of `shard_items` rows where given;
    returns (set folder, its meta.json). The set is written whole or not at all, over a set
    of the same folder or none."""
    from pactl.index import SET_FILES, SET_FORMAT, build_set
    from pactl.store.generations import check_replaceable

    parts, meta = read_parts(vectors_dir)
    if meta["count"] == 0:
        raise PactlError(f"{vectors_dir} holds no vectors (every image was skipped?)")
    if binary_config(config, meta, int(parts[0][0].shape[1])) is not None:
        raise PactlError(
            "a bundle set holds float bundles: give --no-binary (and a float --factory), or "
            "build a binary bundle without --keep-shards"
        )
    if config.on_disk == "yes":
        raise PactlError("--on-disk yes merges one bundle's lists; a set keeps one per shard")
    out = out or default_bundle_dir(meta.get("checkpoint"))
    check_apart(vectors_dir, out)
    check_replaceable(out, SET_FORMAT, SET_FILES)
    if shard_items is not None:
        parts = cut_parts(parts, shard_items)
    common = {k: meta[k] for k in ("dimension", "metric", "checkpoint", "fingerprint")}
    common |= {
        "checkpoint_relative": _relative(meta.get("checkpoint"), out),
        "model_config": meta["model_config"],
        "vectors": str(vectors_dir.resolve()),
        "calibration": calibration_to_copy(meta, reporter),
    }
    return out, build_set(parts, out, config, reporter, common)


def cut_parts(parts: list[Any], most: int) -> list[Any]:
    """Each part cut into pieces of at most `most` rows, in order (views of its vectors)."""
    if most < 1:
        raise PactlError(f"--shard-items {most}: give at least 1")
    return [
        (vectors[start : start + most], table.take(np.arange(start, min(start + most, len(table)))))
        for vectors, table in parts
        for start in range(0, len(table), most)
    ]


def build_float(
    shards: list[Any],
    config: IndexConfig,
    reporter: Reporter,
    gen: Path,
    positions: Callable[[Any], Any],
) -> tuple[Any, dict[str, Any]]:
    """A float index over the shards: with its lists merged on disk (config.on_disk), else in
    memory, the shards read in turn and never joined, lossy codes rescored from a copy of the
    float vectors in `gen` (pactl.index.rescoring)."""
    from pactl.index import build_ondisk_index, build_parts, wants_on_disk
    from pactl.index.rescoring import FLOATS_FILE

    count, dim = sum(len(v) for v, _ in shards), int(shards[0][0].shape[1])
    if wants_on_disk(config, count, dim, sharded=len(shards) > 1):
        return build_ondisk_index(shards, config, reporter, gen)
    floats = (gen / FLOATS_FILE, positions)
    return build_parts(shards, config, reporter, floats=floats)


def binary_config(config: IndexConfig, meta: dict[str, Any], dim: int) -> IndexConfig | None:
    """The settings of a binary bundle of these vectors, or None for a float one. Binary when
    asked (--binary), or by default for the vectors of a network that makes codes (`pactl
    train --bits N`: model_config bits N), whose signs are then the codes (rotation none, N
    bits) unless other settings are given. Checked before any work."""
    from pactl.codes.rotation import check_bits

    network_bits = int((meta.get("model_config") or {}).get("bits", 0) or 0)
    if config.binary is False or (config.binary is None and not network_bits):
        named = {"--bits": config.bits != 0, "--rotation": config.rotation != "auto"}
        named["--factory " + str(config.factory)] = str(config.factory).startswith("B")
        for option in (option for option, on in named.items() if on):
            raise PactlError(f"{option} is for binary bundles: give --binary too")
        return None
    if config.factory is not None and not config.factory.startswith("B"):
        raise PactlError(
            f"--factory {config.factory!r} is a float index; a binary bundle takes BFlat, "
            "BIVF<nlist>[_HNSW<m>] or BHNSW<m> (or none: chosen by size)"
        )
    if config.on_disk == "yes":
        raise PactlError(
            "--on-disk yes merges a float IVF's lists; a binary bundle keeps its codes in "
            "memory (32x smaller) and its float vectors on disk already: drop one of them"
        )
    if network_bits and config.rotation == "auto" and config.bits in (0, network_bits):
        config = dataclasses.replace(config, rotation="none")
    binary = dataclasses.replace(config, binary=True, bits=config.bits or network_bits or dim)
    check_bits(binary.bits, dim, binary.rotation)
    return binary


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


def check_apart(vectors_dir: Path, out: Path) -> None:
    """A bundle folder may hold its vectors folder (`pactl index IMAGES` makes out/vectors), but
    must not be it, nor lie inside it: the bundle would replace its own input."""
    source, target = vectors_dir.resolve(), out.resolve()
    if target == source or source in target.parents:
        raise PactlError(
            f"the bundle {out} would overwrite its own input {vectors_dir}: "
            "give --out another folder"
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
    embedding: EmbedConfig,
    reporter: Reporter,
    overwrite: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Embed `source` with a checkpoint or a backbone, then index it, in one go. A bundle
    already there is checked first: one of another kind, or whose live items `source` lacks
    (without `overwrite`), is refused before any embedding."""
    from pactl.embed import VECTORS_FILES, VECTORS_FORMAT
    from pactl.index import BUNDLE_FILES, BUNDLE_FORMAT, rebuild_facts
    from pactl.store.generations import check_replaceable

    bundle = out or default_bundle_dir(model_from if isinstance(model_from, Path) else None)
    check_replaceable(bundle, BUNDLE_FORMAT, BUNDLE_FILES)  # before minutes of embedding
    vectors_dir = bundle / "vectors"
    check_replaceable(vectors_dir, VECTORS_FORMAT, VECTORS_FILES)
    files, labels = source_items(source, split, reporter, embedding.follow_links)
    if not overwrite:
        try:
            live = rebuild_facts(bundle).live
        except PactlError:
            live = set()  # damaged: index_vectors says so, and rebuilds it
        check_nothing_dropped(bundle, live, {os.path.abspath(f) for f in files}, source)
    # the bundle's own vectors: rebuilt with it, whatever network made the old ones
    embed_bundle_files(files, labels, model_from, vectors_dir, embedding, reporter)
    return index_vectors(vectors_dir, bundle, config, reporter, overwrite=True)


def index_latest_run(
    runs: Path,
    config: IndexConfig,
    embedding: EmbedConfig,
    reporter: Reporter,
    overwrite: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Right after `pactl train NAME`: index that dataset's test (gallery) images, following
    links where asked or where the run itself followed them."""
    from pactl.datasets import load_source
    from pactl.runs import latest_run, resumed_configs

    run = latest_run(runs)
    best = run / "best.pt"
    if not best.is_file():
        raise PactlError(f"{run} has no best.pt yet: let training finish an evaluated epoch")
    source, _, cfg = resumed_configs(run)
    follow = embedding.follow_links or cfg.follow_links
    manifest = load_source(source, reporter, follow_links=follow)
    split = "gallery" if manifest.has_split("gallery") else "test"
    reporter.log(f"indexing the {split} split of {source} with {best}")
    embedding = dataclasses.replace(embedding, follow_links=follow)
    return index_images(
        source, best, run / "index", split, config, embedding, reporter, overwrite=overwrite
    )
