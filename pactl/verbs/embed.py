"""`pactl embed`: a source (or one shard of it) into a vectors folder, resumably."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pactl.config import EmbedConfig
from pactl.console import Reporter
from pactl.verbs.sources import source_items

if TYPE_CHECKING:
    from pactl.checkpoint import ModelSource


def embed_source(
    source: str,
    model_from: ModelSource,
    out_dir: Path,
    split: str | None,
    config: EmbedConfig,
    reporter: Reporter,
    shard: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Embed a source with a checkpoint or a backbone (`model_from`) into `out_dir`, or with
    `shard` ("i/n", "auto") one slice of it into `out_dir/shards/<i>-of-<n>/`; ids are positions
    in the whole (sorted) input list. Progress is committed every config.commit_every images.
    Vectors of another network in `out_dir` are replaced only with `overwrite`."""
    from pactl.embed import VECTORS_FILES, VECTORS_FORMAT, Shard, parse_shard
    from pactl.store.generations import check_replaceable

    part = parse_shard(shard) if shard else Shard()  # a usage mistake before any listing
    target = out_dir / "shards" / part.name if part.count > 1 else out_dir
    check_replaceable(target, VECTORS_FORMAT, VECTORS_FILES)
    files, labels = source_items(source, split, reporter, config.follow_links)
    ids = np.arange(len(files), dtype=np.int64)
    if part.count > 1:
        start, stop = part.bounds(len(files))
        files, labels, ids = files[start:stop], labels[start:stop], ids[start:stop]
        out_dir = out_dir / "shards" / part.name
        reporter.log(f"shard {part.index}/{part.count}: items {start} to {stop - 1}")
    return embed_source_files(
        files, labels, ids, model_from, out_dir, config, reporter, replace_other=overwrite
    )


def embed_source_files(
    files: list[Path],
    labels: list[str],
    ids: np.ndarray,
    model_from: ModelSource,
    out_dir: Path,
    config: EmbedConfig,
    reporter: Reporter,
    scratch: bool = False,
    replace_other: bool = False,
) -> dict[str, Any]:
    """Embed `files` (with explicit `ids`) with a checkpoint's or a backbone's network
    (`scratch`: into a private folder; `replace_other`: over vectors of another network;
    pactl.embed.embed_to_folder)."""
    from pactl.checkpoint import open_network
    from pactl.embed import embed_to_folder
    from pactl.runtime import resolve_device

    model, network = open_network(model_from)
    device = resolve_device(config.device)
    model.to(device)
    return embed_to_folder(
        model, network, files, labels, ids, out_dir, device, reporter, config,
        scratch=scratch, replace_other=replace_other,
    )  # fmt: skip


def embed_bundle_files(
    files: list[Path],
    labels: list[str],
    model_from: ModelSource,
    out_dir: Path,
    config: EmbedConfig,
    reporter: Reporter,
) -> None:
    """A bundle's own vectors folder `out_dir` (vectors of another network replaced): for a
    checkpoint in a run folder, from the run's embeddings (pactl.embed.cache), which `eval` and
    `plot` share, so images they embedded are not embedded again; else embed_source_files."""
    from pactl.checkpoint import open_network
    from pactl.embed.cache import embed_cached, in_run, run_cache, write_vectors
    from pactl.runtime import resolve_device

    if not in_run(model_from):
        ids = np.arange(len(files), dtype=np.int64)
        embed_source_files(
            files, labels, ids, model_from, out_dir, config, reporter, replace_other=True
        )
        return
    model, network = open_network(model_from)
    cache = run_cache(model_from, network, config.amp)
    assert cache is not None  # in_run
    device = resolve_device(config.device)
    model.to(device)
    done = embed_cached(cache, model, files, device, reporter, config.workers)
    if done.failed:
        reporter.log(f"skipped {len(done.failed):,} unreadable images (listed in skipped.csv)")
    write_vectors(out_dir, network, files, labels, done)
