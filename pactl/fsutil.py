"""Atomic file writes: a temporary file in the same folder, fsync, rename."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, else it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)


def atomic_write_text(path: Path, text: str) -> None:
    data = text.encode("utf-8")

    def write(f: IO[bytes]) -> None:
        f.write(data)

    atomic_write(path, write)
