"""The one rule for every file a user names for pactl to write (a report, a grid, a contact
sheet, a manifest, an .onnx file) and for every file pactl replaces by a rename.

A write goes to a temporary name beside the target and is renamed over it, and a rename
replaces whatever holds the name: a FIFO, a device node (`/dev/null`, as root), a link (the
link, not what it points to). So, checked before any work and again just before the rename:

- a name that is a link, a FIFO, a socket, a device or a folder is refused, never replaced;
- a regular file is replaced only when the user asked (`--overwrite`);
- a file the command reads (its source, a --drop list, a query image, a checkpoint) is never
  its output, even with `--overwrite`: the output would destroy its own input.

Standard library only, so that every layer can check a target the same way.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from pactl.errors import PactlError, UsageError
from pactl.store.regular_files import KINDS

OVERWRITE_HINT = "pass --overwrite to replace it"


def kind_of(path: Path | str) -> str | None:
    """What `path` is, in words, when it is something pactl must never replace (a link, a FIFO,
    a socket, a device or a folder); None when it is a regular file or absent."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # absent (the parent is said elsewhere)
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return None
    return KINDS.get(stat.S_IFMT(mode), "a special file")


def refuse_special(path: Path | str, what: str = "") -> None:
    """Raise PactlError when `path` is a link or anything but a regular file: writing would
    replace it (a device node, a FIFO a reader waits on, a link to someone's file)."""
    kind = kind_of(path)
    if kind is not None:
        name = f"{what} {path}".strip()
        raise PactlError(f"{name} is {kind}; pactl writes only regular files: name a new file")


def check_target(
    path: Path, option: str, overwrite: bool, inputs: Iterable[Path | str] = ()
) -> None:
    """Refuse, before any work, to write the file `path` (named by `option`) where it would
    replace something not meant to go: see the module's rule. `inputs` are the files and folders
    the command reads; a target inside an input folder is refused only when it exists there
    (the folder's own files are what the command reads)."""
    refuse_special(path, option)
    source = input_named(path, inputs)
    if source is not None:
        raise UsageError(
            f"{option} {path} is {source}, which this command reads: write to another file"
        )
    if os.path.lexists(path) and not overwrite:
        raise PactlError(f"{path} exists; {OVERWRITE_HINT}, or {option} PATH for another file")


def input_named(path: Path, inputs: Iterable[Path | str]) -> str | None:
    """The input `path` is (or lies inside, for a folder), in words; None when it is none."""
    here = os.path.realpath(path)
    exists = os.path.lexists(path)
    for source in inputs:
        if not os.path.lexists(source):  # a dataset's name, not a path
            continue
        there = os.path.realpath(source)
        if here == there or (exists and _same_file(path, source)):
            return f"the input {source}"
        if exists and os.path.isdir(there) and here.startswith(there.rstrip(os.sep) + os.sep):
            return f"a file of the input {source}"
    return None


def _same_file(a: Path | str, b: Path | str) -> bool:
    """One file under two names (a hard link, a bind mount)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
