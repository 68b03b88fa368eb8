"""The vectors folder's format, spelled once: what `pactl embed` writes and every reader checks.

One generation (pactl.store.generations) holds vectors.npy (float32, L2-normalised, row i is
item i), items.csv (`id,path,label,size,mtime_ns`), skipped.csv and meta.json (its `format`
VECTORS_FORMAT, `version` up to VECTORS_VERSION, `dimension` up to MAX_DIMENSION). A sharded
embed writes one such folder per shard under `shards/<i>-of-<n>/`. Writing is
pactl.embed.writing's, reading pactl.embed.folder's (and pactl.verbs.vector_sources's, which
also takes the clip-retrieval layout); both return a Vectors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from pactl.rules import MAX_DIMENSION

if TYPE_CHECKING:  # the names alone: pactl.store.generations spells its kinds from here
    import numpy as np

    from pactl.store.item_table import ItemTable

VECTORS_FORMAT = "pactl.vectors"
VECTORS_VERSION = 1
VECTORS_FILES = ("vectors.npy", "items.csv", "skipped.csv", "meta.json")
ITEMS_COLUMNS = ("id", "path", "label", "size", "mtime_ns")
SHARDS_DIR = "shards"  # shards/<i>-of-<n>/, each a vectors folder of its own
PROGRESS_PREFIX = ".pactl-progress-"
MAX_COUNT = 2**40
# per shard, in shard order: its vectors (memory-mapped) and its items
Parts: TypeAlias = "list[tuple[np.ndarray, ItemTable]]"

__all__ = [
    "ITEMS_COLUMNS",
    "MAX_COUNT",
    "MAX_DIMENSION",
    "PROGRESS_PREFIX",
    "SHARDS_DIR",
    "VECTORS_FILES",
    "VECTORS_FORMAT",
    "VECTORS_VERSION",
    "Parts",
    "Vectors",
]


class Vectors(NamedTuple):
    """A vectors folder read back: a record with names, and a tuple that unpacks as
    `vectors, items, meta`."""

    vectors: np.ndarray  # (N, D) float32 unit rows; memory-mapped for an unsharded folder
    items: ItemTable  # ids, paths, labels, sizes, mtimes: row i describes vectors[i]
    meta: dict[str, Any]  # meta.json (a sharded folder's count summed over its shards)
