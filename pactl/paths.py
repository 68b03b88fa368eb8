"""Where pactl keeps datasets and looks for runs."""

from __future__ import annotations

import os
from pathlib import Path


def pactl_home() -> Path:
    """`$PACTL_HOME`, or the platform's user data folder."""
    env = os.environ.get("PACTL_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("pactl", appauthor=False))


def datasets_dir() -> Path:
    return pactl_home() / "datasets"


def runs_dir() -> Path:
    """`$PACTL_RUNS`, or `runs/` in the current folder."""
    return Path(os.environ.get("PACTL_RUNS", "runs"))
