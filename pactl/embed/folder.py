"""The vectors folder's format and reading it back: the names of its files, shards, and the
memory-mapped vectors with their items and meta.json. No torch here: `pactl index VECTORS`
reads a folder without importing it."""

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

VECTORS_FORMAT = "pactl.vectors"
VECTORS_VERSION = 1
VECTORS_FILES = ("vectors.npy", "items.csv", "skipped.csv", "meta.json")


ITEMS_COLUMNS = ("id", "path", "label", "size", "mtime_ns")
PROGRESS_PREFIX = ".pactl-progress-"
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


MAX_DIMENSION = 65_536
MAX_COUNT = 2**40


def read_vectors(folder: Path) -> tuple[np.ndarray, dict[str, Any]]:
    """The vectors (memory-mapped) and meta of an embed output folder's current generation."""
    return read_current(folder, lambda gen: read_vectors_in(gen, folder))


def read_embedded(folder: Path) -> tuple[np.ndarray, Any, dict[str, Any]]:
    """Vectors (memory-mapped), ItemTable and meta of an embed output folder, all three from
    one generation."""
    from pactl.store.item_table import ItemTable

    def read(gen: Path) -> tuple[np.ndarray, Any, dict[str, Any]]:
        vectors, meta = read_vectors_in(gen, folder)
        items = ItemTable.read(gen / "items.csv")
        if len(items) != len(vectors):
            raise PactlError(
                f"{folder}: items.csv has {len(items):,} rows for {len(vectors):,} vectors: "
                "run `pactl embed` again"
            )
        return vectors, items, meta

    return read_current(folder, read)


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
