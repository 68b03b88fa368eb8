"""Where pactl keeps datasets and looks for runs."""

from __future__ import annotations

import os
from pathlib import Path

from pactl.errors import PactlError

# File names are bytes: one that is not UTF-8 round-trips through its surrogate escapes in
# every file that lists names (items.csv, skipped.csv, items.bin).
NAME_ENCODING, NAME_ERRORS = "utf-8", "surrogateescape"


def pactl_home() -> Path:
    """`$PACTL_HOME`, or the platform's user data folder."""
    env = os.environ.get("PACTL_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("pactl", appauthor=False))


def datasets_dir() -> Path:
    return pactl_home() / "datasets"


def writable_datasets_dir() -> Path:
    """`datasets_dir()`, created: a PACTL_HOME that is a file, cannot be created or is
    read-only is one line naming it, not a traceback from the first write below it."""
    home = pactl_home()
    what = f"PACTL_HOME={home}" if os.environ.get("PACTL_HOME") else f"the data folder {home}"
    for folder in (home, home / "datasets"):
        _writable_folder(folder, what)
    return home / "datasets"


def _writable_folder(folder: Path, what: str) -> None:
    hint = "point PACTL_HOME at a folder pactl may write to"
    if folder.exists() and not folder.is_dir():
        raise PactlError(f"{what}: {folder} is a file, not a folder; {hint}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PactlError(f"{what}: cannot create {folder} ({e.strerror or e}); {hint}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PactlError(f"{what}: {folder} is read-only; {hint}")


def runs_dir() -> Path:
    """`$PACTL_RUNS`, or `runs/` in the current folder."""
    return Path(os.environ.get("PACTL_RUNS", "runs"))
