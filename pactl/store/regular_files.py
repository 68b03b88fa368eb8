"""Opening a file a user names: a regular file only, and why not in one short phrase.

Opening a FIFO blocks until a writer comes (forever), and opening a device may act on the
device, so anything but a regular file is refused before it is opened. Standard library only:
the image decoder (pactl.images) and the `pactl query --server` client, which must not load
torch, open their files the same way and give the same reasons.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # absent on Windows
KINDS = {  # what a file that is not regular is, for messages
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class NotRegular(Exception):
    """A name that is a folder, a FIFO, a socket or a device; str() is the reason."""


def open_regular(path: Path | str) -> BinaryIO:
    """Open `path` for reading only if it is a regular file: checked before the open, and again
    on the open file (opened without blocking) in case the name changed in between. Raises
    NotRegular, or OSError (os_reason words it)."""
    check_regular(os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        check_regular(os.fstat(fd).st_mode)
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular(mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise NotRegular("is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise NotRegular(f"not a regular file ({KINDS.get(stat.S_IFMT(mode), 'special')})")


def os_reason(e: OSError) -> str:
    """Why a file could not be opened or read, in a few words."""
    reasons = {
        errno.ENOENT: "file not found",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EISDIR: "is a directory, not a file",
    }
    return reasons.get(e.errno or 0, e.strerror or one_line(e))


def one_line(e: BaseException, limit: int = 160) -> str:
    """An exception's message on one line, at most `limit` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_present(files: Sequence[Path], where: str) -> None:
    """Every file of a list the user gave (a CSV's rows, a dataset's manifest) is there and
    regular: one stat each, before anything heavy starts, so that a wrong row or root is one
    line at once rather than after a network has loaded. Raises PactlError naming the first."""
    from pactl.errors import PactlError

    bad: list[tuple[Path, str]] = []
    for path in files:
        try:
            check_regular(os.stat(path).st_mode)
        except OSError as e:
            bad.append((path, os_reason(e)))
        except NotRegular as e:
            bad.append((path, str(e)))
    if bad:
        path, reason = bad[0]
        count = f"{len(bad):,} of the {len(files):,} images" if len(bad) > 1 else "an image"
        raise PactlError(f"{path}: {reason} ({count} {where} names): fix or remove those rows")
