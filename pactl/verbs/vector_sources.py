"""A source of vectors read back: pactl's vectors folder (pactl.embed.folder: one generation, or
its shards in order) or the clip-retrieval layout (pactl.interop.parquet), kept apart in parts
or joined into one Vectors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pactl.store.item_table import ItemTable
from pactl.store.vectors_folder import Parts, Vectors


def gather_vectors(folder: Path) -> Vectors:
    """Vectors, items and meta of an embed folder, its shards joined in shard order (in
    memory; read_parts keeps them apart)."""
    parts, meta = read_parts(folder)
    vectors, items = _join_parts(parts)
    return Vectors(vectors, items, meta)


def read_parts(folder: Path) -> tuple[Parts, dict[str, Any]]:
    """Per shard, in shard order, its memory-mapped vectors and ItemTable, and the set's meta
    (count summed); a folder without shards/ is one part, and so is each shard of the Parquet
    layout (pactl.interop.parquet). Nothing is joined or copied."""
    from pactl.embed.folder import read_shards
    from pactl.interop.parquet import is_parquet_folder, read_parquet

    if is_parquet_folder(folder):
        return read_parquet(folder)
    return read_shards(folder)


def _join_parts(parts: Parts) -> tuple[np.ndarray, ItemTable]:
    """One matrix and one ItemTable; more than one part is copied into memory."""
    if len(parts) == 1:
        return parts[0]
    vectors = np.concatenate([np.asarray(v) for v, _ in parts])
    return vectors, ItemTable.join([table for _, table in parts])
