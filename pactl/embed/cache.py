"""A run's embeddings, computed once per checkpoint and reused by every verb that embeds the
run's images (`eval`, `plot`, `index`): a vectors folder under `runs/<run>/embeddings/<key>/`.

The key is the checkpoint's fingerprint (sha256 of its weights) with a digest of what else
shapes a vector (the model config: image size, normalisation, pooling; the autocast; full
decoding, as evaluation decodes), so other weights or settings never share a folder. Inside,
a row is reused while its image keeps its path, size and modification time; only new or
changed images go through the network. The folder holds the union of what the verbs asked
for (an `index` of the gallery after an `eval` of the test split keeps both), is written as a
new generation (pactl.store.generations), and is a cache: removing it costs one embedding.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pactl.checkpoint import ModelSource, Network
from pactl.config import to_dict
from pactl.console import Reporter
from pactl.embed.folder import VECTORS_FILES
from pactl.embed.forward import Embedded, embed_files
from pactl.embed.writing import (
    ITEMS_COLUMNS,
    Previous,
    file_stats,
    plan,
    read_previous,
    vectors_meta,
)
from pactl.errors import PactlError
from pactl.store.csv_cells import write_rows
from pactl.store.generations import KeepCurrent, new_generation, record_files

CACHE_DIR = "embeddings"  # runs/<run>/embeddings/<key>/
CACHE_VERSION = 1  # part of the key: a change to what a cached vector means starts anew


@dataclass(frozen=True)
class RunCache:
    """Where a run's vectors by one network, with one set of settings, are kept."""

    folder: Path
    network: Network
    amp: str  # the autocast the vectors were made under (part of the key)


def run_cache(source: ModelSource, network: Network, amp: str = "none") -> RunCache | None:
    """The cache of a checkpoint that lies in a run folder (beside its config.json); None for
    a backbone or a checkpoint elsewhere (nothing is written beside a user's own file)."""
    if not in_run(source):
        return None
    assert isinstance(source, Path)  # in_run's
    settings = {
        "version": CACHE_VERSION,
        "model_config": to_dict(network.config),
        "amp": amp,
        "decode": "full",
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    key = f"{network.fingerprint[:16]}-{digest[:8]}"
    return RunCache(source.parent / CACHE_DIR / key, network, amp)


def in_run(source: ModelSource) -> bool:
    """Whether `source` is a checkpoint in a run folder (beside its config.json)."""
    return isinstance(source, Path) and (source.parent / "config.json").is_file()


@dataclass
class Lookup:
    """Per input file, the cached row to reuse (-1: embed it), and the files' stats."""

    reuse: np.ndarray  # (N,) int64
    stats: list[tuple[int, int]]
    previous: Previous | None


def look_up(cache: RunCache, files: Sequence[Path]) -> Lookup:
    """Which of `files` the cache holds unchanged (same path, size and modification time)."""
    stats = file_stats(files)
    previous = read_previous(cache.folder, cache.network.fingerprint)
    ids = np.arange(len(files), dtype=np.int64)
    return Lookup(plan(files, ids, stats, previous).reuse, stats, previous)


def embed_cached(
    cache: RunCache,
    model: nn.Module,
    files: Sequence[Path],
    device: torch.device,
    reporter: Reporter,
    workers: int = 0,
    channels_last: bool = True,
    prepare: bool | None = None,
) -> Embedded:
    """embed_files(files, draft=False) through the run's cache: the cached vectors of unchanged
    images, the network's of the others (which then join the cache). A cache that cannot be
    written (a read-only run, a full disk) costs a line, never the result."""
    found = look_up(cache, files)
    todo = np.flatnonzero(found.reuse < 0)
    dim = cache.network.config.dimension or cache.network.config.embedding_dim
    fresh = Embedded(np.empty((0, dim), np.float32), np.empty(0, np.int64))
    if len(todo):
        fresh = embed_files(
            model, [files[i] for i in todo.tolist()], cache.network.config, device, reporter,
            workers=workers, amp=cache.amp, channels_last=channels_last, prepare=prepare,
            draft=False,
        )  # fmt: skip
    if len(todo) < len(files):
        reporter.log(f"{len(files) - len(todo):,} of {len(files):,} images from {cache.folder}")
    source = np.full(len(files), -1, dtype=np.int64)  # row of `fresh`, where embedded now
    source[todo[fresh.rows]] = np.arange(len(fresh.rows))
    rows = np.flatnonzero((found.reuse >= 0) | (source >= 0))
    vectors = np.empty((len(rows), dim), dtype=np.float32)
    old = found.reuse[rows] >= 0
    if found.previous is not None and old.any():
        vectors[old] = found.previous.vectors[found.reuse[rows[old]]]
    vectors[~old] = fresh.vectors[source[rows[~old]]]
    failed = [(int(todo[i]), reason) for i, reason in fresh.failed]
    result = Embedded(vectors, rows, failed)
    try:
        keep_in_cache(cache, files, found, result, len(fresh.rows))
    except (PactlError, OSError) as e:
        reporter.log(f"the vectors were not kept in {cache.folder}: {e}")
    return result


def keep_in_cache(
    cache: RunCache, files: Sequence[Path], found: Lookup, result: Embedded, embedded: int
) -> None:
    """Write the cache anew: `result`'s rows, then the earlier rows of other images that are
    still unchanged on disk; nothing is written when that is what the cache already holds."""
    paths = [os.path.abspath(files[i]) for i in result.rows.tolist()]
    first: dict[str, int] = {}
    for i, path in enumerate(paths):
        first.setdefault(path, i)  # a file named twice is kept once
    ours = sorted(first.values())
    others = still_there(found.previous, set(paths) | {os.path.abspath(f) for f in files})
    previous = found.previous
    if previous is not None and not embedded and len(ours) + len(others) == len(previous.rows):
        return  # nothing new, nothing gone
    items = [(paths[i], *found.stats[int(result.rows[i])]) for i in ours]
    items += [(path, size, mtime) for path, (_, _, size, mtime) in others.items()]
    count = len(items)
    with new_generation(cache.folder, VECTORS_FILES, links=False) as gen:
        dim = result.vectors.shape[1]
        out = np.lib.format.open_memmap(
            gen / "vectors.npy", mode="w+", dtype=np.float32, shape=(count, dim)
        )
        out[: len(ours)] = result.vectors[ours]
        if previous is not None and others:
            out[len(ours) :] = previous.vectors[[row for row, *_ in others.values()]]
        out.flush()
        del out
        rows = [(i, path, "", size, mtime) for i, (path, size, mtime) in enumerate(items)]
        write_rows(gen / "items.csv", ITEMS_COLUMNS, rows)
        write_rows(gen / "skipped.csv", ("path", "reason"), [])
        meta = vectors_meta(
            cache.network, count=count, embedded=embedded, reused=count - embedded, resumed=0,
            skipped=0,
        )  # fmt: skip
        meta = record_files(gen, {**meta, "cache": {"amp": cache.amp, "decode": "full"}})
        (gen / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def still_there(previous: Previous | None, named: set[str]) -> dict[str, tuple[int, int, int, int]]:
    """The cache's rows of images not in `named` whose files are unchanged on disk."""
    if previous is None:
        return {}
    kept = {}
    for path, known in previous.rows.items():
        if path in named:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue  # gone: dropped from the cache
        if (st.st_size, st.st_mtime_ns) == known[2:]:
            kept[path] = known
    return kept


def write_vectors(
    out_dir: Path,
    network: Network,
    files: Sequence[Path],
    labels: Sequence[str],
    done: Embedded,
) -> None:
    """`out_dir` as the vectors folder `pactl embed` would make of `files`, from vectors at hand
    (the run's cache): an image keeps the id it had there, new ones get ids after the largest;
    vectors of another network are replaced (the bundle's own folder, which `index` rebuilds)."""
    stats = file_stats(files)
    with new_generation(out_dir, VECTORS_FILES) as gen:
        previous = read_previous(out_dir, network.fingerprint)
        job = plan(files, np.arange(len(files), dtype=np.int64), stats, previous)
        rows = done.rows.tolist()
        unchanged = previous is not None and len(previous.rows) == len(rows) == len(files)
        if unchanged and (job.reuse >= 0).all():
            raise KeepCurrent
        np.save(gen / "vectors.npy", np.ascontiguousarray(done.vectors, dtype=np.float32))
        items = [(int(job.ids[i]), os.path.abspath(files[i]), labels[i], *stats[i]) for i in rows]
        write_rows(gen / "items.csv", ITEMS_COLUMNS, items)
        skipped = [(str(files[i]), reason) for i, reason in done.failed]
        write_rows(gen / "skipped.csv", ("path", "reason"), skipped)
        reused = int((job.reuse >= 0).sum())
        meta = vectors_meta(
            network, count=len(rows), embedded=len(rows) - reused, reused=reused, resumed=0,
            skipped=len(skipped),
        )  # fmt: skip
        meta = record_files(gen, meta)
        (gen / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
