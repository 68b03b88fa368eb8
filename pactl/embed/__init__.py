"""Images -> L2-normalised float32 vectors, and the vectors folder that `pactl index` reads.

Three rooms: `forward` (the forward pass over batches of files), `fastpath` (the network
prepared once for many images) and `vectors` (the folder format: shards, meta.json, progress
commits, reading back). This module only hands on the names callers use.
"""

from __future__ import annotations

from pactl.embed.fastpath import PREPARE_MIN_IMAGES, inference_model
from pactl.embed.forward import Embedded, decode_files, embed_decoded, embed_files
from pactl.embed.vectors import (
    PROGRESS_PREFIX,
    VECTORS_FILES,
    VECTORS_FORMAT,
    Shard,
    embed_to_folder,
    parse_shard,
    read_embedded,
    read_vectors,
)

__all__ = [
    "PREPARE_MIN_IMAGES",
    "PROGRESS_PREFIX",
    "VECTORS_FILES",
    "VECTORS_FORMAT",
    "Embedded",
    "Shard",
    "decode_files",
    "embed_decoded",
    "embed_files",
    "embed_to_folder",
    "inference_model",
    "parse_shard",
    "read_embedded",
    "read_vectors",
]
