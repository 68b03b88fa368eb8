"""The heavy libraries pactl imports when a verb needs them (torch, torchvision, timm, faiss):
when one fails to import (mismatched builds, e.g. `operator torchvision::nms does not exist`),
one line naming it, the versions installed and how to install matching ones, instead of the
traceback of its import."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import traceback

# import name -> distribution names that may provide it
HEAVY = {
    "torch": ("torch",),
    "torchvision": ("torchvision",),
    "timm": ("timm",),
    "faiss": ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "faiss-gpu-cu11", "faiss"),
}


def installed_versions() -> str:
    """`torch 2.4.0, torchvision 0.19.0, ...` for those installed (read from their metadata,
    without importing them)."""
    found = []
    for name, distributions in HEAVY.items():
        for dist in distributions:
            try:
                found.append(f"{name} {importlib.metadata.version(dist)}")
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        else:
            found.append(f"{name} not installed")
    return ", ".join(found)


def broken_import(error: BaseException) -> str | None:
    """The one-line message for an exception raised while one of HEAVY was being imported
    (a frame of its module-level code in the traceback, the innermost one named), else None."""
    broken = None
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.name != "<module>":
            continue
        owner = _owner(frame.filename)
        if owner is not None:
            broken = owner
    if broken is None:
        return None
    why = " ".join(f"{type(error).__name__}: {error}".split())[:160]
    return (
        f"{broken} fails to import ({why}); installed: {installed_versions()}. These builds do "
        "not match: install versions made for each other, e.g. `pip install --force-reinstall "
        "torch torchvision` from one index (https://pytorch.org/get-started/locally/)"
    )


def _owner(filename: str) -> str | None:
    """Which of HEAVY the file belongs to (by where each package lies), or None."""
    path = os.path.realpath(filename)
    for name in HEAVY:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            if path.startswith(os.path.realpath(folder) + os.sep):
                return name
    return None
