"""Reading a vectors folder back (its format is pactl.store.vectors_folder's): one generation's
memory-mapped vectors with their items and meta.json, or a sharded folder's shards in order; and
the shards themselves. No torch here: `pactl index VECTORS` reads a folder without importing it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.config import ModelConfig, read_config
from pactl.errors import PactlError, UsageError
from pactl.store import json_fields
from pactl.store.generations import check_files, read_current
from pactl.store.item_table import ItemTable
from pactl.store.vectors_folder import (
    MAX_COUNT,
    MAX_DIMENSION,
    PROGRESS_PREFIX,
    SHARDS_DIR,
    VECTORS_FILES,
    VECTORS_FORMAT,
    VECTORS_VERSION,
    Parts,
    Vectors,
)

# The format's names that pactl.embed hands on are pactl.store.vectors_folder's.
__all__ = [
    "MAX_SHARDS",
    "PROGRESS_PREFIX",
    "VECTORS_FILES",
    "VECTORS_FORMAT",
    "Shard",
    "parse_shard",
    "read_embedded",
    "read_shards",
    "read_vectors_in",
]

MAX_SHARDS = 99_999  # shard names have five digits


@dataclass(frozen=True)
class Shard:
    """Slice `index` of `count` equal slices of the input list (`--shard i/n`)."""

    index: int = 0
    count: int = 1

    def bounds(self, n: int) -> tuple[int, int]:
        return n * self.index // self.count, n * (self.index + 1) // self.count

    @property
    def name(self) -> str:  # zero-padded: merge order never depends on how names sort
        return f"{self.index:05d}-of-{self.count:05d}"


def parse_shard(text: str) -> Shard:
    """`i/n` (0-based), or `auto` for this process's rank under torchrun."""
    if text == "auto":
        text = f"{os.environ.get('RANK', '0')}/{os.environ.get('WORLD_SIZE', '1')}"
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard takes i/n or auto, e.g. 0/4 (got {text!r})") from None
    if not 0 <= index < count or count > MAX_SHARDS:
        raise UsageError(f"--shard {text}: need 0 <= i < n <= {MAX_SHARDS:,}")
    return Shard(index, count)


def read_embedded(folder: Path) -> Vectors:
    """Vectors (memory-mapped), ItemTable and meta of an embed output folder, all three from
    one generation (a sharded folder's shards are read by read_shards)."""

    def read(gen: Path) -> Vectors:
        vectors, meta = read_vectors_in(gen, folder)
        items = ItemTable.read(gen / "items.csv")
        if len(items) != len(vectors):
            raise PactlError(
                f"{folder}: items.csv has {len(items):,} rows for {len(vectors):,} vectors: "
                "run `pactl embed` again"
            )
        return Vectors(vectors, items, meta)

    return read_current(folder, read)


def read_shards(folder: Path) -> tuple[Parts, dict[str, Any]]:
    """Per shard, in shard order, its memory-mapped vectors and ItemTable, and the set's meta
    (count summed); a folder without shards/ is one part. Nothing is joined or copied."""
    shards = sorted((folder / SHARDS_DIR).glob("*-of-*/meta.json"))
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
    if len({part.meta["fingerprint"] for part in read}) != 1:
        raise PactlError(f"the shards in {folder}/shards were embedded with different models")
    parts = [(part.vectors, part.items) for part in read]
    return parts, {**read[0].meta, "count": sum(len(v) for v, _ in parts)}


def read_vectors_in(gen: Path, folder: Path) -> tuple[np.ndarray, dict[str, Any]]:
    """read_vectors on one generation `gen` of `folder` (named in messages)."""
    fix = "run `pactl embed` again"
    for name in ("vectors.npy", "items.csv", "meta.json"):
        if not (gen / name).is_file():
            raise PactlError(f"{folder} lacks {name}: is it the output of `pactl embed`?")
    meta_path = folder / "meta.json"
    meta = json_fields.read_json_object(gen / "meta.json", meta_path, "a pactl vectors meta.json")
    if meta.get("format") != VECTORS_FORMAT:
        raise PactlError(f"{meta_path} is not a pactl vectors file")
    version = json_fields.field(meta, "version", int, meta_path)
    if version > VECTORS_VERSION:
        raise PactlError(f"{meta_path} was written by a newer pactl (version {version})")
    dim = json_fields.field(meta, "dimension", int, meta_path, 1, MAX_DIMENSION)
    count = json_fields.field(meta, "count", int, meta_path, 0, MAX_COUNT)
    json_fields.field(meta, "fingerprint", str, meta_path)
    read_config(
        ModelConfig,
        json_fields.field(meta, "model_config", dict, meta_path),
        f"{meta_path}: model_config",
    )
    json_fields.field(meta, "checkpoint", str, meta_path, optional=True)
    check_files(gen, meta, folder, fix)
    try:
        vectors = np.load(gen / "vectors.npy", mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise PactlError(f"{folder}/vectors.npy is not a float32 .npy array ({e}): {fix}") from None
    if vectors.ndim != 2 or vectors.shape != (count, dim) or vectors.dtype != np.float32:
        raise PactlError(
            f"{folder}/vectors.npy ({vectors.dtype} {vectors.shape}) does not match its "
            f"meta.json ({count:,} x {dim} float32): {fix}"
        )
    return vectors, meta
