"""`pactl embed --engine ray`: the driver lists the source in today's order (ids are positions
in the whole list, as for `--shard i/n`), cuts it into shards, skips the shards already
committed in `--out` and runs one Ray task per other shard (on a GPU where the cluster has
them); each task writes `--out/shards/<i>-of-<n>/` exactly as `pactl embed --shard i/n` does,
as one generation, so a shard is there whole or not at all."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pactl.config import EmbedConfig, EngineConfig
from pactl.console import QUIET, Reporter, counted
from pactl.engines.cluster import (
    ITEMS_PER_SHARD,
    Fault,
    connected,
    need_ray,
    slots,
    task_options,
    wait_all,
)
from pactl.errors import PactlError

if TYPE_CHECKING:
    from pactl.checkpoint import ModelSource

SHARD_NAME = re.compile(r"\d{5}-of-(\d{5})")


def embed_on_ray(
    source: str,
    model_from: ModelSource,
    out_dir: Path,
    split: str | None,
    config: EmbedConfig,
    engine: EngineConfig,
    reporter: Reporter,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Embed `source` into `out_dir/shards/` as one Ray task per shard; shards committed by an
    earlier run of the same job (same network, same files unchanged, same cut) are kept as they
    are. Returns the set's count, dimension, embedded (this run), skipped, and per shard the
    GPUs its task held (`placement`)."""
    from pactl.checkpoint import open_network
    from pactl.embed import Shard
    from pactl.verbs.sources import source_items

    need_ray(engine)
    files, labels = source_items(source, split, reporter, config.follow_links)
    files = [Path(os.path.abspath(f)) for f in files]  # workers start elsewhere
    model_from = model_from.resolve() if isinstance(model_from, Path) else model_from
    network = open_network(model_from)[1]
    count = shard_count(out_dir, engine, len(files), None)
    with connected(engine, reporter) as ray:
        count = count or shard_count(out_dir, engine, len(files), slots(ray, gpus=True))
        shards = [Shard(i, count) for i in range(count)]
        cuts = [shard.bounds(len(files)) for shard in shards]
        todo = [
            i
            for i, (start, stop) in enumerate(cuts)
            if not committed(out_dir / "shards" / shards[i].name, network.fingerprint,
                             files[start:stop])
        ]  # fmt: skip
        reporter.log(
            f"{counted(len(files), 'image')} in {counted(count, 'shard')}: "
            f"{count - len(todo)} committed already, {len(todo)} to embed"
        )
        task = ray.remote(embed_shard).options(**task_options(ray, gpus=True))
        fault = Fault.from_env()
        refs = [
            task.remote(
                files[cuts[i][0] : cuts[i][1]], labels[cuts[i][0] : cuts[i][1]], cuts[i][0],
                model_from, out_dir.resolve() / "shards" / shards[i].name, config, overwrite,
                (i, fault),
            )
            for i in todo
        ]  # fmt: skip
        names = [f"shard {i}/{count}" for i in todo]

        def done(j: int, result: dict[str, Any]) -> None:
            reporter.log(f"{names[j]} committed: {counted(result['count'], 'vector')}")

        results = wait_all(ray, refs, names, reporter, done)
    return summary(out_dir, count, dict(zip(todo, results, strict=True)))


def embed_shard(
    files: list[Path],
    labels: list[str],
    first_id: int,
    model_from: ModelSource,
    shard_dir: Path,
    config: EmbedConfig,
    overwrite: bool,
    fault: tuple[int, Fault | None],
) -> dict[str, Any]:
    """The task: one shard's files into `shard_dir` (pactl.verbs.embed.embed_source_files),
    ids from `first_id` on. Returns its meta and the GPUs Ray gave it."""
    import ray

    from pactl.verbs.embed import embed_source_files

    shard, injected = fault
    if injected is not None:
        injected.strike(shard)
    ids = np.arange(first_id, first_id + len(files), dtype=np.int64)
    meta = embed_source_files(
        files, labels, ids, model_from, shard_dir, config, QUIET, replace_other=overwrite
    )
    return {**meta, "gpus": [str(g) for g in ray.get_gpu_ids()]}


def shard_count(out_dir: Path, engine: EngineConfig, items: int, workers: int | None) -> int:
    """--shards, else the cut already in `out_dir/shards/` (a resumed run keeps it), else (with
    the cluster's `workers` known) one shard per worker, at least one per ITEMS_PER_SHARD items;
    0 while that is still to be asked. A --shards other than the cut already there is
    refused: the two sets would mix."""
    found = {
        int(m.group(1))
        for p in (out_dir / "shards").glob("*-of-*")
        if (m := SHARD_NAME.fullmatch(p.name))
    }
    if len(found) > 1 or (found and engine.shards and found != {engine.shards}):
        raise PactlError(
            f"{out_dir}/shards holds a cut into {' and '.join(map(str, sorted(found)))} shards: "
            f"give --shards {min(found)} to go on with it, or another --out"
        )
    if engine.shards or found:
        return engine.shards or found.pop()
    if workers is None:
        return 0
    return max(1, min(items, max(workers, -(-items // ITEMS_PER_SHARD))))


def committed(shard_dir: Path, fingerprint: str, files: list[Path]) -> bool:
    """Whether `shard_dir` holds this shard whole: vectors of the same network, every file of
    the shard there (or listed as skipped) with the size and time it has now."""
    import csv

    from pactl.embed import read_embedded
    from pactl.embed.writing import file_stats
    from pactl.store.item_table import ItemTable

    if not (shard_dir / "meta.json").is_file():
        return False
    try:
        _, items, meta = read_embedded(shard_dir)
        with open(shard_dir / "skipped.csv", encoding="utf-8", newline="") as f:
            skipped = len(list(csv.DictReader(f)))
    except (PactlError, OSError, ValueError):
        return False
    if meta.get("fingerprint") != fingerprint or len(items) + skipped != len(files):
        return False
    assert isinstance(items, ItemTable)
    now = dict(zip(map(str, files), file_stats(files), strict=True))
    held = zip(items.paths, items.sizes.tolist(), items.mtimes.tolist(), strict=True)
    return all(now.get(path) == (size, mtime) for path, size, mtime in held)


def summary(out_dir: Path, count: int, fresh: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """What the CLI prints: the whole set's count and dimension (read back from the shards),
    the vectors embedded by this run, the images skipped, and each new shard's GPUs."""
    from pactl.verbs.vector_sources import read_parts

    parts, meta = read_parts(out_dir)
    if len(parts) != count:
        raise PactlError(f"{out_dir}/shards holds {len(parts)} of {count} shards after the run")
    return {
        "count": meta["count"],
        "dimension": meta["dimension"],
        "embedded": sum(int(r.get("embedded", 0)) for r in fresh.values()),
        "skipped": sum(int(r.get("skipped", 0)) for r in fresh.values()),
        "shards": count,
        "placement": {i: r["gpus"] for i, r in fresh.items()},
    }
