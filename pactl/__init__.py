"""pactl: Proxy-Anchor metric learning and FAISS retrieval from the command line.

The Python API (pactl.api, docs/api.md) is importable from here: `pactl.train(...)`,
`pactl.open_index(...)`, `pactl.ProxyAnchorLoss(...)`.
Its names load pactl.api on first use, so `import pactl` (and `pactl --help`) stays light.
"""

import importlib
from typing import Any

from pactl.version import __version__

_API = (
    "ContrastiveLoss",
    "CosineContrastiveLoss",
    "Hit",
    "Index",
    "MultiSimilarityLoss",
    "ProxyAnchorLoss",
    "ProxyNCALoss",
    "Run",
    "TripletLoss",
    "TripletMarginLoss",
    "Vectors",
    "build_index",
    "embed_folder",
    "evaluate",
    "load_model",
    "open_index",
    "optimizer_groups",
    "read_vectors",
    "train",
)
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """`pactl.open_index` and the rest of _API (pactl.api's __all__), from pactl.api on first
    use: `import pactl` loads nothing heavy, and no module inside pactl imports this one (its
    __version__ is pactl.version's)."""
    if name in _API:
        return getattr(importlib.import_module("pactl.api"), name)
    raise AttributeError(f"module 'pactl' has no attribute {name!r}")
