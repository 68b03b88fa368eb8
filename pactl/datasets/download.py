"""Resumable, checksummed HTTP downloads (safe archive extraction is pactl.datasets.archives').

`fetch` streams a file into `NAME.part`, resumes an interrupted transfer with an HTTP Range
request, tries each mirror in turn, verifies size and checksum, and only then renames the file
into place. `extract` unpacks the files and folders of a tar or zip archive member by member,
skipping links and refusing anything that would land outside the target folder, and writes a
marker only after the last member, so an extraction cut halfway is redone on the next run. A
local write that fails (a full disk) is one DiskError naming the file, never retried. A host
that cannot be reached at all on the first request (its name does not resolve, the connection
is refused, no route to it) is not retried either: offline, retries would only wait. `gather`
puts a dataset's published files into a folder from the network, from archives the user
fetched, or from a folder they extracted; when no address delivers a file, its one-line error
says where to put the file by hand.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import os
import shutil
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pactl.console import Advance, Reporter, visible
from pactl.datasets.archives import DiskError, copy_stream, extract, is_archive, writing_to
from pactl.errors import PactlError
from pactl.store.checksums import BLOCK_BYTES
from pactl.store.generations import atomic_path
from pactl.version import __version__

# Base URLs (space or comma separated) tried before the catalog's own addresses, for a local
# or institutional mirror that serves the archives under their published file names.
MIRROR_ENV = "PACTL_MIRROR"
# Client errors that another try at the same address will not fix.
_PERMANENT_HTTP = frozenset({400, 401, 403, 404, 405, 410, 451})


@dataclass(frozen=True)
class Archive:
    """One published file of a dataset: where it lives and how to recognise it."""

    name: str  # file name on disk, and under a PACTL_MIRROR base URL
    urls: tuple[str, ...] = ()  # live HTTP(S) addresses, tried in order
    size: int | None = None  # bytes, where published
    sha256: str | None = None  # where published
    md5: str | None = None  # published with the original; checked only where no sha256 is known
    retired: tuple[str, ...] = ()  # dead or non-HTTP former addresses: for the record, not tried
    manual: str = ""  # where to fetch it by hand when no direct address exists (licence page)


@dataclass(frozen=True)
class FetchOptions:
    """How hard to try each address before moving on to the next mirror."""

    attempts: int = 4  # requests per address; each one resumes where the last stopped
    retry_wait: float = 2.0  # seconds before retry n is n * retry_wait
    timeout: float = 60.0  # seconds without data before a connection counts as cut


@dataclass(frozen=True)
class Digests:
    """What a file on disk turned out to be."""

    size: int
    sha256: str
    md5: str


class ChecksumError(PactlError):
    """A file's size or digest differs from the published one."""


class FetchFailed(PactlError):
    """No address delivered the file; `failures` holds (url, reason) for each address tried."""

    def __init__(self, name: str, failures: Sequence[tuple[str, str]]) -> None:
        self.name = name
        self.failures = tuple(failures)
        super().__init__(f"could not download {name} ({failure_summary(self.failures)})")

    @property
    def offline(self) -> bool:
        """True when no host name resolved and no route led anywhere: no network, or no name
        service. (A refused connection means the network works and nothing listens there.)"""
        return all(reason in _OFFLINE for _, reason in self.failures)


class _TransferError(Exception):
    """A download attempt failed in a way a retry (or the next mirror) may fix."""


class _WrongAddress(_TransferError):
    """This address will not deliver the file (gone, forbidden, or another file): skip it."""


class _Unreachable(_WrongAddress):
    """The host did not answer the first request at all: skip it and its other addresses."""


# Why a host cannot be reached: a name the resolver does not know (socket.gaierror), or the
# errno of a connection that could not be made.
_NO_NAME = "name not resolved"
_NO_CONNECTION = {
    errno.ECONNREFUSED: "connection refused",
    errno.ENETUNREACH: "network unreachable",
    errno.EHOSTUNREACH: "no route to host",
}
_OFFLINE = frozenset(
    {_NO_NAME, _NO_CONNECTION[errno.ENETUNREACH], _NO_CONNECTION[errno.EHOSTUNREACH]}
)


def mirror_urls(archive: Archive) -> list[str]:
    """The addresses to try for `archive`: $PACTL_MIRROR bases first, then the catalog's."""
    bases = os.environ.get(MIRROR_ENV, "").replace(",", " ").split()
    return [f"{b.rstrip('/')}/{archive.name}" for b in bases] + list(archive.urls)


def fetch(
    urls: Sequence[str],
    dest: Path,
    reporter: Reporter,
    *,
    size: int | None = None,
    sha256: str | None = None,
    md5: str | None = None,
    options: FetchOptions = FetchOptions(),
) -> Digests:
    """Download `dest` from the first of `urls` that delivers the expected bytes."""
    if dest.is_file():
        with contextlib.suppress(ChecksumError):
            return verify(dest, reporter, size=size, sha256=sha256, md5=md5)
        dest.unlink()
    if not urls:
        raise PactlError(f"no address to download {dest.name} from")
    with writing_to(dest.parent):
        dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    # Bytes from one mirror may only be continued from another when a checksum will vouch
    # for the spliced result.
    splice_ok = sha256 is not None or md5 is not None
    failures: list[tuple[str, str]] = []
    unreachable: set[str] = set()  # hosts: their other addresses fail the same way at once
    for url in urls:
        if host(url) in unreachable:
            continue
        try:
            digests = _from_address(url, part, reporter, size, sha256, md5, options)
        except ChecksumError as e:
            part.unlink(missing_ok=True)
            failures.append((url, str(e)))
            continue
        except DiskError:
            part.unlink(missing_ok=True)  # gives the space back; nothing is left behind
            raise
        except _TransferError as e:
            if isinstance(e, _Unreachable):
                unreachable.add(host(url))
            if not splice_ok:
                part.unlink(missing_ok=True)
            failures.append((url, str(e)))
            continue
        os.replace(part, dest)
        reporter.log(f"{dest.name}: {digests.size:,} bytes verified, from {url}")
        return digests
    raise FetchFailed(dest.name, failures)


def host(url: str) -> str:
    """`host[:port]` of a URL, for messages: no scheme, path, query or credentials."""
    parts = urllib.parse.urlsplit(url)
    name = parts.hostname or url
    return f"{name}:{parts.port}" if parts.port else name


def failure_summary(failures: Sequence[tuple[str, str]]) -> str:
    """`host, host: reason; host: reason`: one clause per reason, hosts in the order tried."""
    by_reason: dict[str, list[str]] = {}
    for url, reason in failures:
        hosts = by_reason.setdefault(reason, [])
        if host(url) not in hosts:
            hosts.append(host(url))
    return "; ".join(f"{', '.join(hosts)}: {reason}" for reason, hosts in by_reason.items())


def _from_address(
    url: str,
    part: Path,
    reporter: Reporter,
    size: int | None,
    sha256: str | None,
    md5: str | None,
    options: FetchOptions,
) -> Digests:
    """`part` completed from `url` and verified; a resumed file that fails is fetched afresh."""
    resumed = part.is_file() and part.stat().st_size > 0
    _download(url, part, reporter, size, options)
    try:
        return verify(part, reporter, size=size, sha256=sha256, md5=md5)
    except ChecksumError:
        if not resumed:
            raise
    reporter.log(f"{part.name[:-5]}: the resumed file does not verify; downloading it afresh")
    part.unlink()
    _download(url, part, reporter, size, options)
    return verify(part, reporter, size=size, sha256=sha256, md5=md5)


def _download(
    url: str, part: Path, reporter: Reporter, size: int | None, options: FetchOptions
) -> None:
    """Bring `part` up to the full file from `url`, resuming after each cut connection.

    A host that does not answer the first request at all is given up at once; one that fails
    later (a reset, a timeout, a name that stops resolving mid-transfer) is retried.
    """
    last: Exception | None = None
    attempts = options.attempts
    for attempt in range(1, attempts + 1):
        try:
            _stream(url, part, reporter, size, options.timeout)
            return
        except urllib.error.HTTPError as e:
            if e.code in _PERMANENT_HTTP:
                raise _WrongAddress(f"HTTP {e.code} {e.reason}") from None
            last = e
        except _WrongAddress:
            raise
        except (OSError, http.client.HTTPException, _TransferError) as e:
            why = _unreachable(e)
            if why is not None and attempt == 1:
                raise _Unreachable(why) from None
            last = e
        if attempt < attempts:
            reporter.log(f"{part.name[:-5]}: {_why(last)}; retrying ({attempt}/{attempts - 1})")
            time.sleep(options.retry_wait * attempt)
    raise _TransferError(f"gave up after {attempts} tries ({_why(last)})")


def _unreachable(error: BaseException) -> str | None:
    """Why the host cannot be reached at all, or None for a failure another try may fix."""
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(reason, socket.gaierror):
        return _NO_NAME
    if isinstance(reason, OSError) and reason.errno is not None:
        return _NO_CONNECTION.get(reason.errno)
    return None


def _why(error: BaseException | None) -> str:
    """A failure as a short phrase: urllib's `<urlopen error [Errno 104] ...>` unwrapped."""
    if error is None:
        return "no reason given"
    if isinstance(error, urllib.error.URLError) and not isinstance(error, urllib.error.HTTPError):
        return _unreachable(error) or str(error.reason)
    return str(error)


def _stream(url: str, part: Path, reporter: Reporter, size: int | None, timeout: float) -> None:
    """One HTTP request: append to `part` from where it stops (or restart when refused)."""
    have = part.stat().st_size if part.is_file() else 0
    if size is not None and have > size:
        part.unlink()  # longer than the published file: not ours to continue
        have = 0
    if size is not None and have == size:
        return
    headers = {"User-Agent": f"pactl/{__version__}"}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # range past the end: what we hold cannot be continued
            part.unlink()
            raise _TransferError("server refused to resume; starting over") from None
        raise
    with response:
        start = _resume_offset(response, have)
        length = response.headers.get("Content-Length")
        served = start + int(length) if length and length.isdigit() else None
        if size is not None and served is not None and served != size:
            # An HTML error or consent page, or another file: retrying will not help.
            raise _WrongAddress(f"serves {served:,} bytes, not the published {size:,}")
        total = size if size is not None else served
        with _byte_bar(reporter, part.name[:-5], total, start) as advance:
            copy_stream(response, part, "ab" if start else "wb", advance)
    got = part.stat().st_size
    if total is not None and got < total:
        raise _TransferError(f"connection closed at byte {got:,} of {total:,}")


def _resume_offset(response: http.client.HTTPResponse, have: int) -> int:
    """Where the response body starts: `have` for a matching 206, else 0 (a full restart)."""
    if not have or response.status != 206:
        return 0
    content_range = response.headers.get("Content-Range", "")  # "bytes START-END/TOTAL"
    try:
        start = int(content_range.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return 0
    return have if start == have else 0


@contextlib.contextmanager
def _byte_bar(
    reporter: Reporter, description: str, total: int | None, completed: int
) -> Iterator[Advance]:
    """A transfer bar (bytes, speed, time left) on the reporter's console; where stderr is not
    a terminal, a plain progress line now and then instead."""
    if not reporter.show_bars:
        yield reporter.progress_lines(description, total, completed, unit="bytes")
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}", style="bold", markup=False),  # names: not markup
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=reporter.console,
        transient=True,
    )
    with progress:
        task = progress.add_task(visible(description), total=total, completed=completed)

        def advance(n: int = 1) -> None:
            progress.advance(task, n)

        yield advance


def digest(path: Path, reporter: Reporter) -> Digests:
    """Size, sha256 and md5 of a file, in one pass."""
    sha, md5 = hashlib.sha256(), hashlib.md5()
    size = path.stat().st_size
    with open(path, "rb") as f, _byte_bar(reporter, f"checking {path.name}", size, 0) as advance:
        while block := f.read(BLOCK_BYTES):
            sha.update(block)
            md5.update(block)
            advance(len(block))
    return Digests(size=size, sha256=sha.hexdigest(), md5=md5.hexdigest())


def verify(
    path: Path,
    reporter: Reporter,
    *,
    size: int | None = None,
    sha256: str | None = None,
    md5: str | None = None,
) -> Digests:
    """The file's digests, or ChecksumError when they differ from the published ones."""
    actual = path.stat().st_size
    if size is not None and actual != size:
        raise ChecksumError(f"{path.name} is {actual:,} bytes, the published file {size:,}")
    found = digest(path, reporter)
    if sha256 is not None and found.sha256 != sha256.lower():
        raise ChecksumError(f"{path.name}: sha256 {found.sha256} is not the published {sha256}")
    if sha256 is None and md5 is not None and found.md5 != md5.lower():
        raise ChecksumError(f"{path.name}: md5 {found.md5} is not the published {md5}")
    return found


@dataclass(frozen=True)
class Provenance:
    """Where one file of a prepared dataset came from, for `sources.json`."""

    name: str
    origin: str  # the local path it was taken from (for a download: where it was saved)
    digests: Digests | None  # None for a linked folder
    downloaded: bool  # True when pactl fetched it (and may delete it after preparing)


def gather(
    archives: Sequence[Archive],
    work: Path,
    cache: Path,
    reporter: Reporter,
    *,
    dataset: str,
    source: Path | None = None,
    is_tree: Callable[[Path], bool] = lambda path: False,
    options: FetchOptions = FetchOptions(),
) -> list[Provenance]:
    """Put the dataset's files into `work`: downloaded, from `source` archives, or linked.

    `source` may be one archive, a folder holding the archives (searched a few levels deep,
    as a browser or cloud-drive download leaves them), or a folder the user already extracted
    (recognised by `is_tree`), which is linked rather than copied.
    """
    if source is not None and source.is_dir() and is_tree(source):
        return [_link_tree(source, work)]
    local = _find_local(archives, source)
    if source is not None and not local:
        if source.is_dir():
            names = ", ".join(a.name for a in archives)
            raise PactlError(
                f"{source} holds none of {names} and is not an extracted {dataset} folder"
            )
        # One file under another name (a repackaged archive): unpack it and let the parser judge.
        return [_place(source, work, reporter, digest(source, reporter), downloaded=False)]
    done = []
    for archive in archives:
        path = local.get(archive.name)
        if path is not None:
            found = _verify_local(path, archive, reporter)
            done.append(_place(path, work, reporter, found, downloaded=False))
            continue
        urls = mirror_urls(archive)
        if not urls:
            raise PactlError(_manual_hint(dataset, archive, source))
        dest = cache / archive.name
        known = f" ({archive.size:,} bytes)" if archive.size else ""
        reporter.log(f"downloading {archive.name}{known}")
        try:
            found = fetch(
                urls, dest, reporter, size=archive.size, sha256=archive.sha256, md5=archive.md5,
                options=options,
            )  # fmt: skip
        except FetchFailed as e:
            # Every file still to come, so that one trip to another machine fetches them all.
            have = {p.name for p in done} | set(local) | _files_in(cache)
            wanted = [a.name for a in archives if a.name not in have]
            raise PactlError(_by_hand_hint(dataset, e, cache, wanted)) from None
        done.append(_place(dest, work, reporter, verified=found, downloaded=True))
    return done


def _verify_local(path: Path, archive: Archive, reporter: Reporter) -> Digests:
    try:
        return verify(path, reporter, size=archive.size, sha256=archive.sha256, md5=archive.md5)
    except ChecksumError as e:
        raise ChecksumError(
            f"{e}; if it is another packaging of the same images, pass the folder you "
            "extracted it to instead"
        ) from None


def _files_in(folder: Path) -> set[str]:
    with contextlib.suppress(OSError):
        return {p.name for p in folder.iterdir() if p.is_file()}
    return set()


def _by_hand_hint(dataset: str, failed: FetchFailed, cache: Path, wanted: Sequence[str]) -> str:
    """One line: what failed, where pactl looks for the files, and the mirror variable."""
    offline = " (offline?)" if failed.offline else ""
    if len(wanted) == 1:
        place = f"put the file at {cache / wanted[0]}"
    else:
        place = f"put {', '.join(wanted[:-1])} and {wanted[-1]} in {cache}"
    return (
        f"cannot download {failed.name} for {dataset}{offline}: "
        f"{failure_summary(failed.failures)}; {place}, or run "
        f"`pactl download {dataset} --from FOLDER`, or set {MIRROR_ENV} to a mirror URL"
    )


def _manual_hint(dataset: str, archive: Archive, source: Path | None) -> str:
    where = f" (not found in {source})" if source is not None else ""
    page = f" from {archive.manual}" if archive.manual else ""
    return (
        f"{archive.name}{where} has no direct download: fetch it by hand{page} and run "
        f"`pactl download {dataset} --from FOLDER` with the folder holding it"
    )


def _find_local(archives: Sequence[Archive], source: Path | None) -> dict[str, Path]:
    """Archive name -> the user's copy of it, from a single file or a folder searched 3 deep."""
    if source is None:
        return {}
    names = {a.name for a in archives}
    if source.is_file():
        return {source.name: source} if source.name in names else {}
    found: dict[str, Path] = {}
    level = [source]
    for _ in range(4):
        below = []
        for folder in level:
            with contextlib.suppress(OSError):
                for entry in sorted(folder.iterdir()):
                    if entry.name in names and entry.is_file():
                        found.setdefault(entry.name, entry)
                    elif entry.is_dir() and not entry.name.startswith("."):
                        below.append(entry)
        level = below
    return found


def _place(
    path: Path, work: Path, reporter: Reporter, verified: Digests | None, downloaded: bool
) -> Provenance:
    """Unpack an archive into `work`, or copy a plain file (an annotation file) beside it."""
    if is_archive(path):
        extract(path, work, reporter)
    else:
        with writing_to(work / path.name), atomic_path(work / path.name) as tmp:
            shutil.copyfile(path, tmp)
    return Provenance(path.name, str(path), verified, downloaded)


def _link_tree(source: Path, work: Path) -> Provenance:
    """Point `work/<name>` at a folder the user extracted, so nothing is copied."""
    real = source.resolve()
    work.mkdir(parents=True, exist_ok=True)
    link = work / (real.name or "data")
    if link.is_symlink() or link.exists():
        link.unlink()
    try:
        link.symlink_to(real, target_is_directory=True)
    except OSError as e:
        raise PactlError(
            f"cannot link {real} into {work} ({e}); pass the archives with --from instead"
        ) from None
    return Provenance(link.name, str(real), None, downloaded=False)
