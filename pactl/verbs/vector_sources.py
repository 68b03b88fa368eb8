"""An embed output folder read back: its shards in order (memory-mapped, kept apart), or joined."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pactl.errors import PactlError


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
