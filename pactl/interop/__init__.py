"""pactl's networks, vectors and bundles in the formats of other tools: an ONNX file of the
network (onnx_model), vectors as the clip-retrieval Parquet layout (parquet), a bundle handed to
a Qdrant collection (qdrant). Each needs an extra (`pip install 'pactl[onnx]'`, ...), checked by
`require` before any work."""

from __future__ import annotations

import importlib.util

from pactl.errors import PactlError


def require(what: str, extra: str, *modules: str) -> None:
    """One line naming the extra when a module `what` needs is not installed."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise PactlError(f"{what} needs {', '.join(missing)}: pip install 'pactl[{extra}]'")
