"""Atomic file writes: a temporary file in the same folder, fsync, rename."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from pactl.errors import PactlError


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, else it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        stale.unlink(missing_ok=True)  # left by a process killed mid-write
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise PactlError(
                f"no space left on the device writing {path}; the previous file is kept, "
                "free some space and run again"
            ) from None
        raise


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)


def atomic_write_text(path: Path, text: str) -> None:
    data = text.encode("utf-8")

    def write(f: IO[bytes]) -> None:
        f.write(data)

    atomic_write(path, write)
