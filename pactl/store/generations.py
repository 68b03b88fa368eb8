"""Crash-consistent writes: atomic files, and folders whose files change together.

A file is written to a temporary name in its folder, fsynced and renamed over the old one.

A folder of files that belong together (an embed output, an index bundle) is written as a
*generation*: a fresh hidden folder `.pactl-gen-<stamp>/` that receives every file, and then one
symbolic link, `.pactl-current`, is switched to it by a rename. Readers resolve the link once
and read every file from that generation, so a kill at any moment leaves the old generation or
the new one, never a mix. The folder's visible names (`meta.json`, `items.csv`, ...) are links
through `.pactl-current`, so tools that open `vectors/vectors.npy` keep working. One writer at a
time holds `.pactl-lock` (flock); readers never lock.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import secrets
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from pactl.errors import Busy, NoSpace, PactlError, ReadOnly
from pactl.store.targets import refuse_special
from pactl.store.vectors_folder import VECTORS_FORMAT

CURRENT = ".pactl-current"  # the link naming the current generation
GENERATION_PREFIX = ".pactl-gen-"
LOCK_FILE = ".pactl-lock"
SCRATCH_NAMES = (".add", ".merge", ".index.ivfdata.pending", ".fresh.npy.tmp")  # older layouts
READ_ATTEMPTS = 5  # a reader retries when a writer switched generations under it
CRASH_ENV = "PACTL_CRASH_AT"  # tests: SIGKILL this process at the Nth crash point

T = TypeVar("T")
_crash_count = 0
# (thread, folder) -> [fd, depth]: re-entrant within a thread; another thread of the same
# process (a service's request) opens its own descriptor, which flock refuses like a process
_held_locks: dict[tuple[int, str], list[int]] = {}


def crash_point() -> None:
    """A point between two steps of a write where a kill must leave a usable result.

    With `$PACTL_CRASH_AT=N` the process kills itself (SIGKILL: no cleanup runs) at the Nth
    point it reaches; the fault tests walk N over every point of a command.
    """
    global _crash_count
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    _crash_count += 1
    if _crash_count == int(wanted):
        os.kill(os.getpid(), signal.SIGKILL)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)  # a full device, or a user's quota spent


def no_space(error: BaseException, what: Path) -> NoSpace | None:
    """The one-line error for a full disk (or quota), or None for any other failure."""
    if isinstance(error, OSError) and error.errno in FULL_DISK:
        return NoSpace(
            f"no space left on the device writing {what}; the previous output is kept, "
            "free some space and run again"
        )
    if isinstance(error, RuntimeError) and "No space left on device" in str(error):
        return no_space(OSError(errno.ENOSPC, "no space"), what)  # FAISS's writers
    return None


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, else it is removed.

    The file gets the permissions an ordinary `open()` would give it (0666 less the umask), not
    the 0600 of a temporary file. A `path` that is a link, a FIFO, a device or a folder is
    refused (pactl.store.targets), before the write and again before the rename, which would
    replace it.
    """
    refuse_special(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        stale.unlink(missing_ok=True)  # left by a process killed mid-write
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        refuse_special(path)  # made meanwhile: the rename would replace it
        os.replace(tmp, path)
        crash_point()
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        full = no_space(e, path)
        if full is not None:
            raise full from None
        raise


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)


def atomic_write_text(path: Path, text: str) -> None:
    data = text.encode("utf-8", errors="surrogateescape")  # file names that are not UTF-8

    def write(f: IO[bytes]) -> None:
        f.write(data)

    atomic_write(path, write)


def allocate(path: Path, size: int) -> None:
    """Reserve `size` bytes for `path` now, so a memory-mapped write cannot meet a full disk
    later (a mapped page that cannot be backed kills the process with SIGBUS, not an error)."""
    if not hasattr(os, "posix_fallocate") or size <= 0:
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- locking


@contextlib.contextmanager
def writer_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s writer lock: a second writer is refused at once, with one line.

    The lock is an flock on `folder/.pactl-lock`, released by the kernel if the holder dies.
    Re-entrant within a thread; other threads are refused as other processes are. Where flock
    does not exist (Windows), nothing is locked.
    """
    key = (threading.get_ident(), os.path.realpath(folder))
    held = _held_locks.get(key)
    if held is not None:
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = _open_lock(folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise Busy(
            f"{folder} is being written by another pactl process; run again when it has finished"
        ) from None
    _held_locks[key] = [fd, 1]
    try:
        yield
    finally:
        del _held_locks[key]
        os.close(fd)  # closing releases the flock


READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def _open_lock(folder: Path) -> int:
    """The lock file's descriptor; ReadOnly when the folder cannot be written (a read-only
    mount, or no permission), since then nothing in it can be changed either."""
    try:
        return os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        if e.errno not in READ_ONLY:
            raise
        raise ReadOnly(
            f"{folder} is read-only ({e.strerror}): pactl cannot change it; reads still work"
        ) from None


KINDS = {
    "pactl.bundle": "an index bundle",
    "pactl.bundle_set": "a bundle set",
    VECTORS_FORMAT: "embedded vectors",
    "pactl.parquet": "vectors in the Parquet layout",
}


def check_replaceable(folder: Path, kind: str, names: Collection[str]) -> None:
    """Refuse, before any work, to write a `kind` folder (a meta.json format) where it would
    replace something else: another kind of pactl folder, or files by the names it writes that
    pactl did not write (a manifest called items.csv). A folder of the same kind is rewritten
    (a rebuild, an embed going on); a missing or unrelated one is fine."""
    if not folder.is_dir():
        return
    meta = folder / "meta.json"
    if os.path.lexists(meta):
        try:
            found = json.loads(meta.read_text(encoding="utf-8")).get("format")
        except (OSError, ValueError, AttributeError):
            found = None
        if found == kind:
            return
        held = KINDS.get(str(found), "a meta.json that pactl did not write")
        raise PactlError(
            f"{folder} holds {held}; writing {KINDS[kind]} there would replace it: "
            "give another output folder"
        )
    clash = sorted(n for n in names if os.path.lexists(folder / n))
    if clash:
        raise PactlError(
            f"{folder} holds {clash[0]}, which pactl did not write; writing {KINDS[kind]} there "
            "would replace it: give another output folder"
        )


def make_folder(folder: Path) -> None:
    """Create `folder` (and parents), or say in one line why it cannot be."""
    if folder.exists() and not folder.is_dir():
        raise PactlError(f"{folder} exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise no_space(e, folder) or PactlError(
            f"cannot create the folder {folder}: {e.strerror}"
        ) from None


# ---------------------------------------------------------------------------- generations


def current_dir(folder: Path) -> Path:
    """The folder that holds `folder`'s current files: its current generation, or `folder`
    itself when it was written flat (by pactl before generations, or copied without links)."""
    link = folder / CURRENT
    if link.is_symlink():
        return folder / os.readlink(link)
    if link.is_dir():  # copied by a tool that follows links
        return link
    return folder


def _pointer(folder: Path) -> str | None:
    try:
        return os.readlink(folder / CURRENT)
    except OSError:
        return None


def read_current(folder: Path, read: Callable[[Path], T]) -> T:
    """`read(current generation folder)`; again if a writer switched generations meanwhile,
    since the generation being read may then have been removed under the reader."""
    for _ in range(READ_ATTEMPTS - 1):
        before = _pointer(folder)
        try:
            return read(current_dir(folder))
        except (PactlError, OSError, ValueError):
            if _pointer(folder) == before:
                raise
    return read(current_dir(folder))


def generation_of(folder: Path) -> str | None:
    """The name of `folder`'s current generation, or None for a flat folder."""
    return _pointer(folder)


class KeepCurrent(Exception):
    """Raised inside new_generation() when there is nothing to write: the new generation is
    dropped, the current one stays, and the exception goes no further."""


@contextlib.contextmanager
def new_generation(
    folder: Path, managed: Collection[str], links: bool = True, staged: bool = False
) -> Iterator[Path]:
    """A fresh generation folder to write all of `folder`'s files into; when the block ends
    without error it becomes current in one rename, else it is removed and `folder` is as it
    was. `managed` names every visible file this kind of folder may hold: they become links
    through `.pactl-current`, and those the new generation lacks are removed (`links=False`:
    a private scratch folder, read through .pactl-current only).

    Holds the writer lock throughout; generations left by killed writers are removed first.
    With `staged`, a folder that does not exist yet is made whole beside its name and renamed
    to it at the end: a process killed outright (FAISS crashing on an index it was given) then
    leaves no `folder` behind, only a hidden staging folder the next write removes.
    """
    if staged and not os.path.lexists(folder):
        with _staged(folder) as staging, _generation(staging, managed, links) as gen:
            yield gen
        return
    made = not folder.exists()
    make_folder(folder)
    try:
        with _generation(folder, managed, links) as gen:
            yield gen
    except KeepCurrent:
        return
    except BaseException:
        if made:  # a first write that failed leaves no folder behind
            with contextlib.suppress(OSError):
                (folder / LOCK_FILE).unlink(missing_ok=True)
                folder.rmdir()  # only if empty: never anything but what was made here
        raise


STAGING_PREFIX = ".pactl-new-"  # a first generation made beside its folder's name


@contextlib.contextmanager
def _staged(folder: Path) -> Iterator[Path]:
    """A hidden folder beside `folder` to build it in; renamed to `folder` when the block ends
    without error, else removed. Staging folders of killed writers (their lock free) go first."""
    parent = folder.parent
    make_folder(parent)
    prefix = f"{STAGING_PREFIX}{folder.name}-"
    for stale in parent.glob(f"{glob.escape(prefix)}*"):
        with contextlib.suppress(Busy, OSError), writer_lock(stale):
            shutil.rmtree(stale)
    staging = parent / f"{prefix}{secrets.token_hex(4)}"
    make_folder(staging)
    try:
        with writer_lock(staging):  # held up to the rename: no other writer clears it first
            yield staging
            try:
                os.rename(staging, folder)  # refused where `folder` was made meanwhile
            except OSError as e:
                raise Busy(f"{folder} was made by another process meanwhile: run again") from e
        _sync_dir(parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextlib.contextmanager
def _generation(folder: Path, managed: Collection[str], links: bool) -> Iterator[Path]:
    with writer_lock(folder):
        remove_stale(folder)
        gen = folder / f"{GENERATION_PREFIX}{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
        try:
            gen.mkdir()
            yield gen
            _sync_folder(gen)
            crash_point()
            _switch(folder, gen.name)
            crash_point()
            if links:
                link_names(folder, gen, managed)
            remove_stale(folder)
        except BaseException as e:
            if _pointer(folder) != gen.name:
                shutil.rmtree(gen, ignore_errors=True)
            full = no_space(e, folder)
            if full is not None:
                raise full from None
            raise


def _sync_folder(folder: Path) -> None:
    """fsync every file of `folder` and the folder itself: the data is on disk before the
    switch makes it current."""
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _sync_dir(folder)


def _sync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a folder be fsynced
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _symlink_over(target: str, path: Path) -> None:
    """Make `path` a link to `target` in one rename (a link made beside it, then moved)."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _switch(folder: Path, name: str) -> None:
    link = folder / CURRENT
    if link.is_dir() and not link.is_symlink():  # a copied folder: retire the copy first
        link.rename(folder / f"{GENERATION_PREFIX}copied-{secrets.token_hex(4)}")
    try:
        _symlink_over(name, link)
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            raise PactlError(
                f"the filesystem of {folder} does not allow symbolic links, which pactl uses to "
                "switch an output to its new version in one step: write it somewhere else"
            ) from None
        raise
    _sync_dir(folder)


def link_names(folder: Path, gen: Path, managed: Collection[str]) -> None:
    """Visible names: a link `name -> .pactl-current/name` per file of the generation; managed
    names it lacks (files of an older layout, or of an earlier kind of output) go."""
    names = {e.name for e in os.scandir(gen) if not e.name.startswith(".")}
    for name in sorted(names):
        path, target = folder / name, f"{CURRENT}/{name}"
        if path.is_symlink() and os.readlink(path) == target:
            continue
        if path.is_dir() and not path.is_symlink():
            raise PactlError(f"{path} is a folder: pactl needs that name for a file")
        _symlink_over(target, path)
        crash_point()
    for name in sorted(set(managed) - names):
        path = folder / name
        if path.is_symlink() or path.is_file():
            path.unlink()
            crash_point()


def remove_stale(folder: Path) -> None:
    """Remove what killed writers left in `folder`: generations other than the current one,
    half-made links and pactl's scratch files. Call with the writer lock held."""
    current = _pointer(folder)
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    removed = False
    for entry in entries:
        name = entry.name
        if name.startswith(GENERATION_PREFIX) and name != current:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed = True
        elif name in SCRATCH_NAMES or (name.startswith(".") and _is_link_temp(entry)):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
            removed = True
    if removed:
        crash_point()


def _is_link_temp(entry: os.DirEntry[str]) -> bool:
    """A link made by _symlink_over that a kill left behind (`.NAME.XXXXXXXX.tmp` -> ...)."""
    return entry.name.endswith(".tmp") and entry.is_symlink()


def record_files(gen: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` with the generation's name and the size of each of its files: a loader checks
    them, so files that do not belong together are refused rather than read."""
    files = {
        e.name: e.stat().st_size
        for e in sorted(os.scandir(gen), key=lambda e: e.name)
        if e.is_file(follow_symlinks=False) and not e.name.startswith(".") and e.name != "meta.json"
    }
    return {**meta, "generation": gen.name, "files": files}


def check_files(gen: Path, meta: dict[str, Any], where: Path, fix: str) -> None:
    """Refuse a generation whose files are not the ones its meta.json records (a file from
    another write, truncated or swapped by hand). A meta.json without a record (older pactl)
    is taken as it is."""
    files = meta.get("files")
    if files is None:
        return
    if not isinstance(files, dict):
        raise PactlError(f"{where}/meta.json: 'files' should be a mapping of names to sizes")
    recorded = meta.get("generation")
    if gen.name.startswith(GENERATION_PREFIX) and recorded != gen.name:
        raise PactlError(f"{where}/meta.json belongs to another version of the folder: {fix}")
    for name, size in files.items():
        try:
            actual = (gen / str(name)).stat().st_size
        except OSError:
            raise PactlError(f"{where} lacks {name}: {fix}") from None
        if actual != size:
            raise PactlError(
                f"{where}/{name} is truncated or corrupt, or from another write ({actual:,} "
                f"bytes, meta.json records {size:,}): {fix}"
            )


def is_regular_file(path: Path) -> bool:
    """A regular file (following links): not a FIFO, socket or device, which may block."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False
