"""manifest.csv: `path,label,split[,class_name]`, paths relative to the manifest's folder
or absolute.

Folders and manifests come from strangers: a link that leads outside the given folder is
skipped (a folder listing) or refused (a manifest row) unless the caller passes
`follow_links=True`, and a listing takes regular files only, so a FIFO named like an image
cannot stall a run. A relative row may not leave the manifest's folder, by `..` or by a link.
An absolute row (`/data/birds/1.jpg`) is the author's explicit choice and is read wherever it
points, links included, with or without `follow_links`: the rule guards against a relative
path or a link that quietly leads elsewhere, and an absolute path says where it leads.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.store.csv_cells import csv_text, unescape_cell
from pactl.store.generations import atomic_write_text
from pactl.store.home import NAME_ENCODING, NAME_ERRORS, pactl_home
from pactl.store.regular_files import KINDS

SPLITS = ("train", "val", "test", "query", "gallery")
ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, read by surrogateescape
IMAGE_EXTENSIONS = (
    *(".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm"),
    *(".heic", ".heif", ".avif"),  # HEIC/HEIF with the `heif` extra (pactl.images.heif_support)
)


@dataclass(frozen=True)
class Manifest:
    """Labelled images: row i is `root / paths[i]` with integer `labels[i]` in `splits[i]`."""

    root: Path
    paths: tuple[str, ...]
    labels: np.ndarray  # (N,) int64
    splits: tuple[str, ...]
    class_names: tuple[str, ...]  # (N,) the class name of each row
    source: str = ""  # what the manifest was built from, for messages and config.json
    duplicates: int = 0  # repeated rows that were dropped

    def __len__(self) -> int:
        return len(self.paths)

    def select(self, *splits: str) -> Manifest:
        keep = [i for i, s in enumerate(self.splits) if s in splits]
        return self.subset(keep)

    def subset(self, rows: Sequence[int]) -> Manifest:
        return Manifest(
            root=self.root,
            paths=tuple(self.paths[i] for i in rows),
            labels=self.labels[np.asarray(rows, dtype=np.int64)],
            splits=tuple(self.splits[i] for i in rows),
            class_names=tuple(self.class_names[i] for i in rows),
            source=self.source,
        )

    def files(self) -> list[Path]:
        return [self.root / p for p in self.paths]

    def has_split(self, split: str) -> bool:
        return split in self.splits

    def eval_splits(self) -> tuple[str, ...] | tuple[str, str]:
        """("query", "gallery") for In-Shop style manifests, else ("test",)."""
        if self.has_split("query") and self.has_split("gallery"):
            return ("query", "gallery")
        return ("test",)


def write_manifest(path: Path, rows: Iterable[tuple[str, int, str, str]]) -> None:
    """Write `(path, label, split, class_name)` rows atomically."""
    atomic_write_text(path, csv_text(["path", "label", "split", "class_name"], rows))


def read_manifest(path: Path, *, follow_links: bool = False, splits: bool = True) -> Manifest:
    """Read a manifest or a user CSV of `path,label[,split][,class_name][,group]`.

    Rows without a split get the class-disjoint default (split_by_class, stratified by
    `group` where the CSV has one); with `splits`
    False (embedding needs none) a CSV of fewer classes than that takes is read unsplit.

    A relative row whose path leaves the CSV's folder (`..`, or through a link leading
    outside) is refused; `follow_links` lets links lead anywhere. An absolute row is read as
    written, wherever it points. A manifest kept in pactl's home is pactl's own, links
    included: a dataset prepared with `--from FOLDER` links it in.
    """
    data, start = _read_bytes(path)
    text = data[start:].decode(NAME_ENCODING, NAME_ERRORS)  # names as write_manifest wrote them
    lines = list(io.StringIO(text, newline=""))  # as the reader takes them
    try:
        reader = csv.DictReader(iter(lines))
        fields = [c.strip() for c in reader.fieldnames or []]
        ends = [reader.line_num]  # where the header's lines, then each row's, end
        records = []
        for r in reader:
            records.append({k.strip(): unescape_cell((v or "").strip()) for k, v in r.items() if k})
            ends.append(reader.line_num)
    except csv.Error as e:
        raise PactlError(f"cannot read {path}: {e}") from None
    if ESCAPED_BYTE.search(text):
        _check_names(path, data[:start], lines, records, ends)
    missing = [c for c in ("path", "label") if c not in fields]
    if missing:
        raise PactlError(
            f"{path} lacks the column(s) {', '.join(missing)}: a manifest needs a header "
            f"'path,label[,split]' (it has: {', '.join(fields) or 'no header'})"
        )
    if not records:
        raise PactlError(f"{path} has a header but no rows")
    own = _inside(os.path.realpath(pactl_home()), os.path.realpath(path))
    checks = not (follow_links or own)
    return _build(path.parent, records, source=str(path), check_links=checks, splits_needed=splits)


def _read_bytes(path: Path) -> tuple[bytes, int]:
    """The file's bytes and where its text starts (after the byte-order mark spreadsheets
    write first, if there)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise PactlError(f"cannot read {path}: not a regular file")
        data = path.read_bytes()
    except OSError as e:
        raise PactlError(f"cannot read {path}: {e.strerror or e}") from None
    return data, len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0


def _check_names(
    path: Path, bom: bytes, lines: list[str], records: list[dict[str, str]], ends: list[int]
) -> None:
    """A manifest is UTF-8 text, but a name Linux allows may hold bytes that are not UTF-8,
    and write_manifest writes those as they are (a folder's file or class name). They are
    read back in a row whose path holds such bytes and names a file that is there (its label
    too: the class folder's name); any other byte that is not UTF-8 (a spreadsheet's Latin-1
    saved as CSV, a header) is the one line saying so, at that row's first such byte."""
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    first = 0
    for record, last in zip([{}, *records], ends, strict=True):  # the header first
        found = ESCAPED_BYTE.search("".join(lines[first:last]))
        at, first = starts[first], last
        name = record.get("path", "")
        if found is None or (
            ESCAPED_BYTE.search(name) and os.path.lexists(os.path.join(path.parent, name))
        ):
            continue
        head = bom + "".join(lines)[: at + found.start()].encode(NAME_ENCODING, NAME_ERRORS)
        byte = ord(found.group()) - 0xDC00  # surrogateescape reads byte 0xNN as U+DCNN
        number = head.count(b"\n") + 1
        raise PactlError(
            f"{path} is not UTF-8 text: byte 0x{byte:02x} at offset {len(head):,} "
            f"(line {number}); save it as UTF-8"
        )


def _build(
    root: Path,
    records: list[dict[str, str]],
    source: str,
    check_links: bool,
    splits_needed: bool = True,
) -> Manifest:
    seen: dict[str, str] = {}  # path -> its label
    paths, raw_labels, splits, groups = [], [], [], []
    links = _LinkCheck(root, source) if check_links else None
    for line, r in enumerate(records, start=2):
        rel = _row_path(r["path"], source, line)
        if rel in seen:  # a duplicate row would count an image twice in every metric
            if seen[rel] != r["label"]:
                raise PactlError(
                    f"{source} line {line}: {rel} again, with label {r['label']!r} where an "
                    f"earlier row has {seen[rel]!r}: give each image one label"
                )
            continue
        seen[rel] = r["label"]
        if links is not None and not PurePosixPath(rel).is_absolute():
            links.check(rel, line)
        if not r["label"]:
            raise PactlError(f"{source} line {line}: empty label")
        split = r.get("split", "")
        if split and split not in SPLITS:
            raise PactlError(
                f"{source} line {line}: unknown split {split!r} (use one of {', '.join(SPLITS)})"
            )
        paths.append(rel)
        raw_labels.append(r.get("class_name") or r["label"])
        splits.append(split)
        groups.append(r.get("group", ""))
    labels = _encode_labels(raw_labels)
    if all(not s for s in splits):
        if splits_needed or len(np.unique(labels)) >= MIN_CLASSES:
            splits = split_by_class(raw_labels, groups)
    elif any(not s for s in splits):
        raise PactlError(f"{source}: some rows have a split and others do not")
    duplicates = len(records) - len(paths)
    return Manifest(
        root, tuple(paths), labels, tuple(splits), tuple(raw_labels), source, duplicates
    )


def _row_path(value: str, source: str, line: int) -> str:
    """A row's path as Linux reads it: absolute as written, or relative and inside the
    manifest's folder (a `..` part refused). Only `/` separates: a backslash or a colon is a
    character of a name (`10:30/a.png`, `a\\b.png`), as `pactl embed` and the kernel read it."""
    if not value:
        raise PactlError(f"{source} line {line}: empty path")
    posix = PurePosixPath(value)
    if posix.is_absolute():
        return str(posix)
    if ".." in posix.parts:
        raise PactlError(
            f"{source} line {line}: path {value!r} leaves the manifest's folder; "
            "paths must be relative to the CSV's folder (no `..`) or absolute"
        )
    return str(posix)


class _LinkCheck:
    """Refuses rows that a link takes outside the manifest's folder, as `..` rows are.

    Each row's folder is resolved once and its last part looked at alone, so a manifest of a
    million rows in a few thousand folders costs about one lstat per row.
    """

    def __init__(self, root: Path, source: str) -> None:
        self.root = root
        self.real_root = os.path.realpath(root)
        self.source = source
        self.folders: dict[str, str] = {}  # row folder -> its real path

    def check(self, rel: str, line: int) -> None:
        path = os.path.join(self.root, rel)
        folder, name = os.path.split(path)
        if folder not in self.folders:
            self.folders[folder] = os.path.realpath(folder)
        real = os.path.join(self.folders[folder], name)
        if os.path.islink(real):
            real = os.path.realpath(real)
        if not _inside(self.real_root, real):
            raise PactlError(
                f"{self.source} line {line}: path {rel!r} is a link leading outside the "
                f"manifest's folder (to {real}); links are followed only with --follow-links"
            )


def _inside(real_root: str, real: str) -> bool:
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def _encode_labels(names: list[str]) -> np.ndarray:
    """Labels 0..C-1 from class names, integers in numeric order before other names."""
    unique = sorted(set(names), key=_label_key)
    index = {name: i for i, name in enumerate(unique)}
    return np.array([index[n] for n in names], dtype=np.int64)


def _label_key(name: str) -> tuple[int, int, str]:
    try:
        return (0, int(name), "")
    except ValueError:
        return (1, 0, name)


MIN_CLASSES = 4  # the default split: two classes at least on each side
SPLIT_SEED = "pactl-split-1"  # the default split's draw; a new one would move every user's classes


def split_by_class(names: Sequence[str], groups: Sequence[str] = ()) -> list[str]:
    """The default class-disjoint split of a user's folder or CSV: half the classes train, half
    test, drawn at random with a fixed seed, never by the order of their names (sorted names put
    families of similar classes, `man-*` and `woman-*`, all on one side, so that validation
    classes drawn from the train half say little about the test half).

    Each class's place in the draw is a hash of its name, so every verb that reads the same
    folder finds the same split (the run folder's split.csv records it too). With `groups` (a
    CSV's `group` column), the classes of each group are split half and half.
    """
    group_of: dict[str, str] = {}
    for name, group in zip(names, groups or [""] * len(names), strict=True):
        if group_of.setdefault(name, group) != group:
            raise PactlError(
                f"class {name!r} is in the groups {group_of[name]!r} and {group!r}: "
                "give each class one group"
            )
    if len(group_of) < MIN_CLASSES:
        raise PactlError(
            f"only {len(group_of)} classes: a class-disjoint train/test split needs at least 4"
        )
    # Alternating along (group, draw) gives each group half its classes, give or take one.
    order = sorted(group_of, key=lambda name: (group_of[name], _draw(name)))
    train = set(order[0::2])
    return ["train" if name in train else "test" for name in names]


def _draw(name: str) -> str:
    return hashlib.sha256(f"{SPLIT_SEED}\0{name}".encode("utf-8", "surrogateescape")).hexdigest()


def manifest_from_folder(
    folder: Path, *, follow_links: bool = False, reporter: Reporter = QUIET
) -> Manifest:
    """A folder of class sub-folders (`folder/<class>/<image>`) as a manifest split by class.

    Listed as `list_images` lists, and what it skips is said the same way.
    """
    if not folder.is_dir():
        raise PactlError(f"{folder} is not a folder")
    records = [
        {"path": p.relative_to(folder).as_posix(), "label": p.relative_to(folder).parts[0]}
        for p in list_images(folder, follow_links=follow_links, reporter=reporter)
        if len(p.relative_to(folder).parts) >= 2
    ]
    if not records:
        raise PactlError(
            f"{folder} has no images in class sub-folders "
            f"(expected {folder}/<class>/<image>{IMAGE_EXTENSIONS[0]})"
        )
    # The listing has already left out the links leading outside (unless they are followed).
    return _build(folder, records, source=str(folder), check_links=False)


def list_images(
    folder: Path, *, follow_links: bool = False, reporter: Reporter = QUIET
) -> list[Path]:
    """Every image below `folder`, sorted: regular files named like images.

    A link leading outside `folder` is skipped, and a link to a folder is entered, only with
    `follow_links` (each folder once, so a loop of links ends). What was skipped is said on
    the reporter as a warning, which shows even when quiet.
    """
    listing = _Listing()
    _scan(folder, os.path.realpath(folder), follow_links, listing)
    if listing.outside:
        first, target = min(listing.outside)
        reporter.warn(
            f"{folder}: skipped {_count(listing.outside, 'link')} leading outside it (first: "
            f"{first} -> {target}); links are followed only with --follow-links"
        )
    if listing.special:
        first, kind = min(listing.special)
        reporter.warn(
            f"{folder}: skipped {_count(listing.special, 'entry', 'entries')} named like an "
            f"image but not a regular file (first: {first}, {kind})"
        )
    return sorted(listing.files)


@dataclass
class _Listing:
    files: list[Path] = field(default_factory=list)
    outside: list[tuple[Path, str]] = field(default_factory=list)  # (link, where it leads)
    special: list[tuple[Path, str]] = field(default_factory=list)  # (FIFO, device..., kind)
    entered: set[tuple[int, int]] = field(default_factory=set)  # (device, inode) of folders


def _scan(folder: Path, real_root: str, follow_links: bool, listing: _Listing) -> None:
    """Add what is below `folder` to `listing`, one folder at a time (no recursion limit)."""
    pending = [folder]
    while pending:
        current = pending.pop()
        try:
            info = os.stat(current)
            if (info.st_dev, info.st_ino) in listing.entered:
                continue
            listing.entered.add((info.st_dev, info.st_ino))
            with os.scandir(current) as it:
                entries = list(it)
        except OSError:
            continue  # unreadable or vanished: as rglob did, nothing to list there
        for entry in entries:
            below = _sort_entry(entry, real_root, follow_links, listing)
            if below is not None:
                pending.append(below)


def _sort_entry(
    entry: os.DirEntry[str], real_root: str, follow_links: bool, listing: _Listing
) -> Path | None:
    """File `entry` into `listing`; returns it when it is a folder to enter."""
    path = Path(entry.path)
    try:
        mode = entry.stat().st_mode  # follows links
    except OSError:
        mode = 0  # a broken link, or a loop of links
    is_dir = stat.S_ISDIR(mode)
    if not is_dir and path.suffix.lower() not in IMAGE_EXTENSIONS:
        return None
    if entry.is_symlink() and not follow_links:
        target = os.path.realpath(path)
        if not _inside(real_root, target):
            listing.outside.append((path, target))
            return None
        if is_dir:
            return None  # the images there are listed where they are, once
    if is_dir:
        return path
    if stat.S_ISREG(mode):
        listing.files.append(path)
    else:
        listing.special.append((path, _KINDS.get(stat.S_IFMT(mode), "not a file")))
    return None


_KINDS = {0: "a broken link", **KINDS}


def _count(items: Sequence[object], one: str, many: str = "") -> str:
    return f"{len(items):,} {one if len(items) == 1 else many or one + 's'}"
