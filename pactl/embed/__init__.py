"""Images -> L2-normalised float32 vectors, and the vectors folder that `pactl index` reads.

Four rooms, in reading order: `forward` (the forward pass over batches of files), `fastpath`
(the network prepared once for many images), `writing` (writing the folder: shards, meta.json,
progress commits) and `folder` (its shards and reading it back; the format itself is
pactl.store.vectors_folder's). This module only hands on the names callers use, each imported
when first asked for: reading a vectors folder imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pactl.embed.fastpath import PREPARE_MIN_IMAGES, inference_model
    from pactl.embed.folder import (
        PROGRESS_PREFIX,
        VECTORS_FILES,
        VECTORS_FORMAT,
        Shard,
        parse_shard,
        read_embedded,
        read_shards,
    )
    from pactl.embed.forward import Embedded, decode_files, embed_decoded, embed_files
    from pactl.embed.writing import embed_to_folder

_HOMES = {
    "fastpath": ("PREPARE_MIN_IMAGES", "inference_model"),
    "folder": (
        "PROGRESS_PREFIX",
        "VECTORS_FILES",
        "VECTORS_FORMAT",
        "Shard",
        "parse_shard",
        "read_embedded",
        "read_shards",
    ),
    "forward": ("Embedded", "decode_files", "embed_decoded", "embed_files"),
    "writing": ("embed_to_folder",),
}
_HOME = {name: room for room, names in _HOMES.items() for name in names}

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
    "read_shards",
]


def __getattr__(name: str) -> Any:
    """A name of __all__ from its room, or a room itself (`pactl.embed.fastpath`)."""
    room = _HOME.get(name, name if name in _HOMES else None)
    if room is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{room}")
    return module if room == name else getattr(module, name)
