"""pactl: Proxy-Anchor metric learning and FAISS retrieval from the command line.

The Python API (pactl.api, docs/api.md) is importable from here: `pactl.open_index(...)`.
Its names load pactl.api on first use, so `import pactl` (and `pactl --help`) stays light.
"""

import importlib
from typing import Any

__version__ = "0.1.0"

_API = (
    "Hit",
    "Index",
    "Vectors",
    "build_index",
    "embed_folder",
    "load_model",
    "open_index",
    "read_vectors",
)
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """`pactl.open_index` and the rest of _API, from pactl.api on first use. By name, not an
    import statement: every module imports this package for __version__, and none of them may
    depend on the API layer (.importlinter), which only a user's `pactl.NAME` loads."""
    if name in _API:
        return getattr(importlib.import_module("pactl.api"), name)
    raise AttributeError(f"module 'pactl' has no attribute {name!r}")
