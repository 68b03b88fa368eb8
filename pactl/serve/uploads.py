"""Files a request brings or names: uploads to a private scratch folder, images to add under
the upload folder (never overwriting; a folder still being added carries a locked marker, so a
service killed meanwhile leaves nothing the next one does not sweep), and paths opened under the
--allow-root folders without following a link."""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi import HTTPException

from pactl.datasets.manifest import IMAGE_EXTENSIONS
from pactl.errors import NoSpace
from pactl.store.generations import FULL_DISK, make_folder
from pactl.store.regular_files import NotRegular, check_regular

SAFE = re.compile(r"[^\w.-]+")  # letters and digits of any script are kept
NAME_BYTES = 150  # of a kept name's end, in UTF-8: well inside a file system's 255
LABEL_BYTES = 255  # a label is a folder's name: a file system's longest, in UTF-8
PENDING = ".pactl-pending"  # in a folder of uploads not added yet; flocked while its request runs
FORMAT_SUFFIX = {"JPEG": ".jpg", "PNG": ".png", "GIF": ".gif", "BMP": ".bmp", "WEBP": ".webp"}
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


@contextmanager
def full_disk_is_507(folder: Path) -> Iterator[None]:
    """A full device (or quota) while writing under `folder` is NoSpace (507), naming it."""
    try:
        yield
    except OSError as e:
        if e.errno not in FULL_DISK:
            raise
        raise NoSpace(
            f"no space left on the device writing {folder}: nothing of this request was kept"
        ) from None


def write_scratch(uploads: list[Any], folder: Path) -> list[Path]:
    """Each upload's bytes as `folder/<n>`: decoded later, by embed's own loader and limits."""
    files = []
    with full_disk_is_507(folder):
        for n, upload in enumerate(uploads):
            target = folder / str(n)
            upload.file.seek(0)
            with open(target, "wb") as f:
                shutil.copyfileobj(upload.file, f, 1 << 20)
            files.append(target)
    return files


class Staged:
    """A new folder of uploads under the upload folder, marked pending (and the marker locked)
    until `keep` (they were added) or `drop` (they were not: the folder goes)."""

    def __init__(self, root: Path) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=root))
        self.marker = _locked(self.folder / PENDING, os.O_CREAT)

    def keep(self) -> None:
        os.unlink(self.folder / PENDING)
        os.close(self.marker)

    def drop(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        os.close(self.marker)


def _locked(marker: Path, flags: int = 0) -> int:
    """`marker` opened and flocked (released by the kernel if the process dies); OSError
    (EWOULDBLOCK) while another holds it."""
    import fcntl

    fd = os.open(marker, os.O_RDWR | _CLOEXEC | _NOFOLLOW | flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def store_for_add(uploads: list[Any], label: str, root: Path) -> Staged:
    """Check that every upload decodes (embed's limits), then keep them in a new folder under
    `root` (`root/<time>-<random>/<label>/<n>-<name>`), marked pending. Nothing is kept when
    one of them cannot be read, or the disk is full."""
    check_label(label)
    with full_disk_is_507(root):
        make_folder(root)
        staged = Staged(root)
        try:
            folder = staged.folder / label if label else staged.folder
            folder.mkdir(exist_ok=True)
            for n, upload in enumerate(uploads):
                _store(upload, folder / _safe_name(upload.filename or "", n))
        except BaseException:
            staged.drop()
            raise
    return staged


def _store(upload: Any, target: Path) -> None:
    from pactl.images import ImageError, load_image

    upload.file.seek(0)
    with open(target, "xb") as f:  # x: a new name, never another file replaced
        shutil.copyfileobj(upload.file, f, 1 << 20)
    try:
        load_image(target)
    except ImageError as e:
        raise HTTPException(400, f"cannot read {upload.filename}: {e.reason}") from None
    _fix_suffix(target)


def sweep_uploads(root: Path, lookup: Any) -> int:
    """Remove the folders of uploads a killed service left pending (their marker unlocked)
    whose images the bundle does not hold; one whose images it holds keeps them (the kill came
    after the add). Returns how many were removed."""
    removed = 0
    for marker in sorted(root.glob(f"*/{PENDING}")) if root.is_dir() else []:
        try:
            fd = _locked(marker)
        except OSError:
            continue  # a request of a running service holds it
        try:
            images = [os.path.abspath(p) for p in marker.parent.rglob("*") if p.is_file()]
            if (lookup.ids([p for p in images if p != str(marker)]) >= 0).any():
                marker.unlink()
            else:
                shutil.rmtree(marker.parent)
                removed += 1
        finally:
            os.close(fd)
    return removed


def check_label(label: str) -> None:
    """A label becomes a folder name: one plain path component."""
    if not label:
        return
    if label in (".", "..") or any(c in label for c in "/\\\0"):
        raise HTTPException(400, "label must be one name: no slashes")
    if any(ord(c) < 32 for c in label):
        raise HTTPException(400, "label must not hold control characters")
    size = len(label.encode("utf-8", "surrogateescape"))
    if size > LABEL_BYTES:
        raise HTTPException(
            400, f"label is {size:,} bytes in UTF-8: at most {LABEL_BYTES} (it names a folder)"
        )


def _safe_name(filename: str, n: int) -> str:
    """`<n>-<name>`: the upload's base name, its letters and digits kept (of any script) and
    anything else made `_`, with an image suffix."""
    base = SAFE.sub("_", os.path.basename(filename.replace("\\", "/")))
    while len(base.encode()) > NAME_BYTES:  # the end holds the suffix: cut from the front
        base = base[1:]
    base = base.lstrip(".")
    stem, suffix = os.path.splitext(base or "upload")
    if suffix.lower() not in IMAGE_EXTENSIONS:
        stem, suffix = stem + suffix.replace(".", "_"), ".img"
    return f"{n:03d}-{stem or 'upload'}{suffix}"


def _fix_suffix(target: Path) -> None:
    """A name without an image suffix gets the one of its format, so folder listings see it."""
    from PIL import Image

    if target.suffix != ".img":
        return
    with Image.open(target) as image:
        suffix = FORMAT_SUFFIX.get(image.format or "", ".png")
    final = target.with_suffix(suffix)
    os.link(target, final)  # fails rather than replace an existing file
    os.unlink(target)


def open_allowed(wanted: str, roots: tuple[Path, ...]) -> int:
    """A descriptor of the regular file `wanted` names inside one of the --allow-root folders,
    opened once, from the root's own descriptor down, never following a link (O_NOFOLLOW on
    every component): a link swapped in meanwhile is refused, never read. 403 outside the
    roots or through a link, 404 for no such file, 400 for one that is not regular."""
    if not roots:
        raise HTTPException(403, "queries by path are off: start the service with --allow-root")
    if "\0" in wanted:
        raise HTTPException(400, "a path must not hold NUL")
    path = os.path.abspath(wanted)  # lexical: no component below the root is a link, or it fails
    for root in roots:
        for base in dict.fromkeys((os.path.abspath(root), os.path.realpath(root))):
            if os.path.commonpath([base, path]) == base and path != base:
                return _open_beneath(base, os.path.relpath(path, base).split(os.sep), wanted)
    raise HTTPException(403, f"{wanted} is outside the --allow-root folders")


def _open_beneath(base: str, parts: list[str], wanted: str) -> int:
    folder = os.open(base, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        for part in parts[:-1]:
            inner = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=folder
            )
            os.close(folder)
            folder = inner
        fd = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=folder)
    except OSError as e:
        raise _refusal(e, wanted) from None
    finally:
        os.close(folder)
    try:
        check_regular(os.fstat(fd).st_mode)
    except NotRegular as e:
        os.close(fd)
        raise HTTPException(400, f"{wanted}: {e}") from None
    os.set_blocking(fd, True)
    return fd


def _refusal(error: OSError, wanted: str) -> HTTPException:
    if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return HTTPException(403, f"{wanted} leads through a link (or a file) under --allow-root")
    if error.errno == errno.ENOENT:
        return HTTPException(404, f"{wanted}: file not found")
    return HTTPException(403, f"{wanted}: {error.strerror or error}")


def fd_path(fd: int) -> Path:
    """A name that opens the very file `fd` holds (Linux /proc, or /dev/fd elsewhere), for a
    decoder that takes names."""
    base = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    return Path(f"{base}/{fd}")
