"""pactl's version: a leaf every record pactl writes reads it from."""

from __future__ import annotations

__version__ = "0.1.0"
