"""Safe archive extraction: `extract` unpacks the files and folders of a tar or zip archive
member by member, skipping links and refusing anything that would land outside the target
folder, and writes a marker only after the last member, so an extraction cut halfway is redone
on the next run. A local write that fails (a full disk) is one DiskError naming the file."""

from __future__ import annotations

import contextlib
import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Protocol

from pactl.console import Advance, Reporter
from pactl.errors import PactlError
from pactl.store.checksums import BLOCK_BYTES
from pactl.store.generations import FULL_DISK, atomic_write_text

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


class UnsafeArchive(PactlError):
    """An archive member would land outside the target folder, is a device file, or names both
    a file and a folder."""


class DiskError(PactlError):
    """A local file could not be written (full disk, read-only folder): no retry will help."""


def is_archive(path: Path) -> bool:
    return path.name.lower().endswith(ARCHIVE_SUFFIXES)


def extract(archive: Path, target: Path, reporter: Reporter) -> bool:
    """Unpack `archive` into `target` once; False when a finished extraction is already there.

    The marker is written after the last member, so a run cut halfway leaves no marker and the
    next run rewrites every member instead of trusting what it finds. A failed extraction
    removes what it wrote: nothing half-extracted is left to be trusted or to fill the disk.
    """
    marker = target / f".{archive.name}.extracted"
    stamp = f"{archive.name} {archive.stat().st_size}\n"
    if marker.is_file() and marker.read_text(encoding="utf-8") == stamp:
        return False
    with writing_to(target):
        marker.unlink(missing_ok=True)
        target.mkdir(parents=True, exist_ok=True)
    unpacker = _Unpacker(Path(os.path.realpath(target)), archive)
    try:
        if archive.name.lower().endswith(".zip"):
            _extract_zip(archive, unpacker, reporter)
        else:
            _extract_tar(archive, unpacker, reporter)
    except Exception:
        unpacker.undo()
        raise
    if unpacker.links:
        links = f"{unpacker.links:,} link" + ("s" if unpacker.links > 1 else "")
        reporter.warn(
            f"{archive.name}: skipped {links} (symbolic or hard); pactl unpacks files and "
            "folders only"
        )
    atomic_write_text(marker, stamp)
    return True


def _extract_tar(archive: Path, unpacker: _Unpacker, reporter: Reporter) -> None:
    try:
        with (
            tarfile.open(archive, "r:*") as tf,
            reporter.bar(f"extracting {archive.name}", total=None) as advance,
        ):
            for member in tf:  # streamed: a .tgz is decompressed once
                _extract_member(tf, member, unpacker)
                advance()
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError) as e:
        # OSError: gzip and bz2 report corrupt streams as one; local write errors are DiskError.
        raise PactlError(f"{archive} is not a readable tar archive ({e})") from None


def _extract_member(tf: tarfile.TarFile, member: tarfile.TarInfo, unpacker: _Unpacker) -> None:
    if member.isdir():
        unpacker.folder(member.name)
    elif member.isfile():
        source = tf.extractfile(member)
        assert source is not None  # a regular member always has data
        with source:
            unpacker.file(member.name, source)
    elif member.issym() or member.islnk():
        unpacker.links += 1
    else:
        raise UnsafeArchive(
            f"{unpacker.archive}: {member.name!r} is a device file or fifo; refused"
        )


def _extract_zip(archive: Path, unpacker: _Unpacker, reporter: Reporter) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            for info in infos:  # the whole listing is known up front: refuse before writing
                unpacker.parts(info.filename)
                kind = stat.S_IFMT(info.external_attr >> 16)
                if kind not in (0, stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
                    raise UnsafeArchive(f"{archive}: {info.filename!r} is a device file; refused")
            with reporter.bar(f"extracting {archive.name}", total=len(infos)) as advance:
                for info in infos:
                    _extract_zip_member(zf, info, unpacker)
                    advance()
    except (zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError) as e:
        raise PactlError(f"{archive} is not a readable zip archive ({e})") from None
    except (RuntimeError, NotImplementedError) as e:  # encrypted, or an unknown compression
        raise PactlError(f"{archive} cannot be unpacked: {e}") from None


def _extract_zip_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, unpacker: _Unpacker) -> None:
    if info.is_dir():
        unpacker.folder(info.filename)
    elif stat.S_ISLNK(info.external_attr >> 16):
        unpacker.links += 1
    else:
        with zf.open(info) as source:
            unpacker.file(info.filename, source)


class _Unpacker:
    """Writes an archive's files and folders below `root`, and nothing else.

    No link is ever made: a chain of links that each point inside (`a -> b/..`, `b -> .`) can
    still resolve outside, and the benchmarks hold none. A link already in the target is
    replaced, never followed. A name the archive uses for both a file and a folder is refused.
    """

    def __init__(self, root: Path, archive: Path) -> None:
        self.root = root
        self.archive = archive
        self.links = 0  # link members skipped
        self.files: set[str] = set()  # member names written as files, "a/b.txt"
        self.folders: set[str] = set()  # member names used as folders
        self.written: list[Path] = []  # files written, removed again by undo()
        self.made: list[Path] = []  # folders created, in order, removed again by undo()

    def parts(self, name: str) -> tuple[str, ...]:
        """A member's path below the root; absolute names, drive letters and `..` are refused."""
        posix = PurePosixPath(name.replace("\\", "/"))
        parts = tuple(p for p in posix.parts if p not in ("", "."))
        if posix.is_absolute() or ".." in parts or (parts and ":" in parts[0]):
            raise UnsafeArchive(
                f"{self.archive}: member {name!r} would land outside {self.root}; refused"
            )
        return parts

    def folder(self, name: str) -> None:
        self._folders(self._claim(name, folder=True))

    def file(self, name: str, source: Readable) -> None:
        parts = self._claim(name, folder=False)
        if not parts:
            raise UnsafeArchive(f"{self.archive}: file member {name!r} has no name; refused")
        dest = self._folders(parts[:-1]) / parts[-1]
        with writing_to(dest):
            if dest.is_symlink():
                dest.unlink()  # never write through a link found in the target
        self.written.append(dest)
        copy_stream(source, dest, "wb")

    def undo(self) -> None:
        for path in self.written:
            with contextlib.suppress(OSError):
                path.unlink()
        for path in reversed(self.made):
            with contextlib.suppress(OSError):
                path.rmdir()

    def _claim(self, name: str, folder: bool) -> tuple[str, ...]:
        """Record a member's name; refuse one the archive also uses for the other kind."""
        parts = self.parts(name)
        key = "/".join(parts)
        parents = ["/".join(parts[:i]) for i in range(1, len(parts))]
        clashes = [p for p in parents if p in self.files]
        if key in (self.files if folder else self.folders):
            clashes.append(key)
        if clashes:
            raise UnsafeArchive(
                f"{self.archive}: {clashes[0]!r} is both a file and a folder in the archive; "
                "refused"
            )
        self.folders.update(parents)
        (self.folders if folder else self.files).add(key)
        return parts

    def _folders(self, parts: tuple[str, ...]) -> Path:
        """Create root/parts one folder at a time, replacing links instead of following them."""
        path = self.root
        for part in parts:
            path = path / part
            with writing_to(path):
                if path.is_symlink():
                    path.unlink()
                if not path.is_dir():
                    path.mkdir()
                    self.made.append(path)
        return path


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


def copy_stream(source: Readable, dest: Path, mode: str, advance: Advance | None = None) -> None:
    """Copy `source` into `dest`: a failed read stays the source's error, a failed write is
    the disk's (DiskError), which no retry and no other mirror will fix."""
    with writing_to(dest):
        f = open(dest, mode)  # noqa: SIM115 - closed below, where its last flush is checked
    try:
        while block := source.read(BLOCK_BYTES):
            with writing_to(dest):
                f.write(block)
            if advance is not None:
                advance(len(block))
    finally:
        with writing_to(dest):
            f.close()


@contextlib.contextmanager
def writing_to(path: Path) -> Iterator[None]:
    """A local write that fails (full disk, read-only folder) as one DiskError naming `path`."""
    try:
        yield
    except OSError as e:
        if e.errno in FULL_DISK:
            raise DiskError(
                f"no space left on the device writing {path}; free some space and run again"
            ) from None
        raise DiskError(f"cannot write {path} ({e.strerror or e})") from None
