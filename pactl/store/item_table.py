"""The (id, path, label, size, mtime) rows of a bundle: read, written, looked up by id.

Two forms on disk. `items.csv` (`id,path,label,size,mtime_ns`) is what `pactl embed` writes
and every bundle keeps as an export. `items.bin` is the lean table a bundle is opened from:
fixed-width columns and UTF-8 blobs, memory-mapped, so opening it reads a header and a path is
decoded only when a caller asks for its row.

items.bin layout: 8 bytes magic, a little-endian uint64 header length, a JSON header
({"format": "pactl.store.item_table", "version": 1, "count": n, "identity": ..., "sections": {name:
[dtype, offset, count]}}), then the sections, each starting at a multiple of 64 bytes after
the first such multiple past the header (offsets count from there).
"""

from __future__ import annotations

import csv
import json
import mmap
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, overload

import numpy as np

from pactl.errors import PactlError
from pactl.store.csv_cells import unescape_cell, write_rows
from pactl.store.home import NAME_ENCODING, NAME_ERRORS

ITEMS_HEADER = ("id", "path", "label")
STAT_COLUMNS = ("size", "mtime_ns")  # after ITEMS_HEADER; -1 where unknown
UNKNOWN = -1
ENCODING, ERRORS = NAME_ENCODING, NAME_ERRORS  # file names keep their bytes

TABLE_FILE = "items.bin"  # a bundle's lean table; its items.csv stays as the export
TABLE_FORMAT = "pactl.store.item_table"
TABLE_VERSION = 1
MAGIC = b"PACTLIT\x00"
ALIGN = 64
MAX_HEADER = 1 << 20
DECODE_CHUNK = 1 << 16  # rows decoded per slice of the blob when iterating
FIX = "rebuild the bundle with `pactl index`"


ID_MAX = 2**63 - 1  # ids are int64; a larger number names no item


class Strings(Sequence[str]):
    """n strings as one UTF-8 blob (surrogateescape) and the end offset of each; a row is
    decoded when it is asked for, so a memory-mapped blob costs only the pages read."""

    def __init__(self, blob: np.ndarray, ends: np.ndarray) -> None:
        self._blob = blob  # (bytes,) uint8
        self._ends = ends  # (n,) int64, non-decreasing

    @classmethod
    def of(cls, values: Iterable[str]) -> Strings:
        encoded = [v.encode(ENCODING, ERRORS) for v in values]
        ends = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8), ends.astype(np.int64))

    @classmethod
    def join(cls, parts: Sequence[Strings]) -> Strings:
        """One column of `parts` in order: blobs and ends copied, nothing decoded."""
        shift = np.cumsum([0] + [p.nbytes for p in parts[:-1]])
        ends = [p._ends + s for p, s in zip(parts, shift.tolist(), strict=True)]
        return cls(
            np.concatenate([p._blob[: p.nbytes] for p in parts] or [np.empty(0, np.uint8)]),
            np.concatenate(ends or [np.empty(0, np.int64)]).astype(np.int64),
        )

    @property
    def nbytes(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, i: int | np.integer) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    @overload
    def __getitem__(self, i: np.ndarray) -> Strings: ...
    def __getitem__(self, i: int | np.integer | slice | np.ndarray) -> str | list[str] | Strings:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if isinstance(i, np.ndarray):
            return self.take(i)
        n = len(self._ends)
        at = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= at < n:
            raise IndexError(f"row {i} of {n}")
        start = int(self._ends[at - 1]) if at else 0
        return self._blob[start : int(self._ends[at])].tobytes().decode(ENCODING, ERRORS)

    def take(self, rows: np.ndarray) -> Strings:
        """The strings at `rows` (positions, or a boolean mask), copied as bytes."""
        rows = _positions(rows, len(self))
        stops = self._ends[rows]
        starts = np.where(rows > 0, self._ends[np.maximum(rows - 1, 0)], 0)
        data = self._blob.data
        spans = zip(starts.tolist(), stops.tolist(), strict=True)
        blob = b"".join(data[a:b] for a, b in spans)
        return Strings(np.frombuffer(blob, dtype=np.uint8), np.cumsum(stops - starts))

    def __iter__(self) -> Iterator[str]:
        n = len(self._ends)
        for a in range(0, n, DECODE_CHUNK):
            b = min(n, a + DECODE_CHUNK)
            base = int(self._ends[a - 1]) if a else 0
            chunk = self._blob[base : int(self._ends[b - 1])].tobytes()
            start = 0
            for end in (self._ends[a:b] - base).tolist():
                yield chunk[start:end].decode(ENCODING, ERRORS)
                start = end

    def tolist(self) -> list[str]:
        return list(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.empty(len(self), dtype=object)
        out[:] = self.tolist()
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"Strings({len(self)} rows, {self.nbytes:,} bytes)"


class Labels(Sequence[str]):
    """A label per row as a code into a table of distinct labels (labels repeat a lot)."""

    def __init__(self, codes: np.ndarray, names: Strings) -> None:
        self.codes = codes  # (n,) int32 into names
        self.names = names  # distinct labels, "" for unlabelled

    @classmethod
    def of(cls, values: Iterable[str]) -> Labels:
        seen: dict[str, int] = {}
        codes = [seen.setdefault(v, len(seen)) for v in values]
        return cls(np.asarray(codes, dtype=np.int32), Strings.of(seen))

    @classmethod
    def join(cls, parts: Sequence[Labels]) -> Labels:
        seen: dict[str, int] = {}
        codes = []
        for part in parts:
            remap = np.asarray([seen.setdefault(v, len(seen)) for v in part.names], np.int32)
            codes.append(remap[part.codes] if len(remap) else part.codes[:0])
        joined = np.concatenate(codes or [np.empty(0, np.int32)]).astype(np.int32)
        return cls(joined, Strings.of(seen))

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, i: int | np.integer) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    @overload
    def __getitem__(self, i: np.ndarray) -> Labels: ...
    def __getitem__(self, i: int | np.integer | slice | np.ndarray) -> str | list[str] | Labels:
        if isinstance(i, slice):
            names = self.names.tolist()
            return [names[c] for c in self.codes[i].tolist()]
        if isinstance(i, np.ndarray):
            return self.take(i)
        return self.names[int(self.codes[int(i)])]

    def take(self, rows: np.ndarray) -> Labels:
        """The labels at `rows` (positions, or a boolean mask)."""
        return Labels(self.codes[_positions(rows, len(self))], self.names)

    def __iter__(self) -> Iterator[str]:
        names = self.names.tolist()  # equal labels come out as one string object
        return (names[c] for c in self.codes.tolist())

    def tolist(self) -> list[str]:
        return list(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.names, dtype=dtype)[self.codes]

    def __repr__(self) -> str:
        return f"Labels({len(self)} rows, {len(self.names)} distinct)"


class ItemTable:
    """The rows of a bundle as columns indexed by position: `ids`, `sizes` and `mtimes` int64
    arrays (-1 size or mtime when unknown), `paths` and `labels` sequences of str decoded per
    row (`paths[i]`, `.tolist()`, iteration).

    Ids map to positions through a sorted copy (or directly when ids are 0..n-1), so looking up
    the hits of many queries is one vectorised search, not a dict of millions of entries. A
    table opened from items.bin reads that sorted copy from the file as well.
    """

    def __init__(
        self,
        ids: np.ndarray,
        paths: Strings | Sequence[str],
        labels: Labels | Sequence[str],
        sizes: np.ndarray | None = None,
        mtimes: np.ndarray | None = None,
        lookup: tuple[bool, np.ndarray, np.ndarray] | None = None,
    ) -> None:
        n = len(ids)
        self.ids = np.asarray(ids, dtype=np.int64)  # (n,)
        self.paths = paths if isinstance(paths, Strings) else Strings.of(paths)
        self.labels = labels if isinstance(labels, Labels) else Labels.of(labels)
        self.sizes = _stat(sizes, n)  # (n,) file size in bytes, -1 when unknown
        self.mtimes = _stat(mtimes, n)  # (n,) st_mtime_ns, -1 when unknown
        if not (n == len(self.paths) == len(self.labels) == len(self.sizes) == len(self.mtimes)):
            raise ValueError("ids, paths, labels, sizes and mtimes differ in length")
        # (ids are 0..n-1, argsort of ids, ids sorted); given when read from items.bin
        self._identity, self._order, self._sorted = lookup or _lookup(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[Any, ...]]) -> ItemTable:
        """From (id, path, label) or (id, path, label, size, mtime_ns) rows."""
        ids = np.fromiter((int(r[0]) for r in rows), dtype=np.int64, count=len(rows))
        sizes, mtimes = (
            np.fromiter((_int(r, at) for r in rows), dtype=np.int64, count=len(rows))
            for at in (3, 4)
        )
        paths = Strings.of(r[1] for r in rows)
        return cls(ids, paths, Labels.of(r[2] or "" for r in rows), sizes, mtimes)

    @classmethod
    def read(cls, path: Path) -> ItemTable:
        """Parse an `id,path,label[,size,mtime_ns]` CSV (as `pactl embed` writes it) row by
        row into the compact columns, never holding a str per row."""
        # -sig: a spreadsheet's BOM; surrogateescape: file names that are not UTF-8
        with open(path, newline="", encoding="utf-8-sig", errors=ERRORS) as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None or tuple(h.strip() for h in header[:3]) != ITEMS_HEADER:
                raise PactlError(f"{path} does not start with the header id,path,label")
            names = [h.strip() for h in header]
            at_size, at_mtime = (names.index(c) if c in names else 1 << 30 for c in STAT_COLUMNS)
            at = (at_size, at_mtime)
            return _parse_rows(reader, path, at)

    def write(self, path: Path) -> None:
        """The `id,path,label,size,mtime_ns` CSV export."""
        write_rows(
            path,
            ITEMS_HEADER + STAT_COLUMNS,
            zip(
                self.ids.tolist(),
                self.paths,
                self.labels,
                self.sizes.tolist(),
                self.mtimes.tolist(),
                strict=True,
            ),
        )

    def save(self, path: Path) -> None:
        """Write the lean table (items.bin) that `open` maps."""
        sections = {
            "ids": self.ids,
            "sizes": self.sizes,
            "mtimes": self.mtimes,
            "path_ends": self.paths._ends,
            "path_bytes": self.paths._blob[: self.paths.nbytes],
            "label_codes": self.labels.codes,
            "label_ends": self.labels.names._ends,
            "label_bytes": self.labels.names._blob[: self.labels.names.nbytes],
            "order": self._order,
            "sorted": self._sorted,
        }
        with open(path, "wb") as f:
            _write_sections(f, {"count": len(self), "identity": self._identity}, sections)

    @classmethod
    def open(cls, path: Path) -> ItemTable:
        """Map a lean table (items.bin): the header is read now, the rows when used."""
        header, column = _map_sections(path)
        n, identity = header["count"], header["identity"]
        names = Strings(column("label_bytes"), column("label_ends"))
        paths = Strings(column("path_bytes"), column("path_ends"))
        for strings, what in ((paths, "path"), (names, "label")):
            if strings.nbytes > len(strings._blob) or (len(strings) and strings._ends[0] < 0):
                raise PactlError(f"{path}: its {what} offsets run past its data: {FIX}")
        counts = {"order": 0 if identity else n, "sorted": 0 if identity else n}
        for name in ("ids", "sizes", "mtimes", "path_ends", "label_codes", *counts):
            if len(column(name)) != counts.get(name, n):
                raise PactlError(f"{path}: section {name} does not hold {n:,} rows: {FIX}")
        for strings, what in ((paths, "path"), (names, "label")):
            if len(strings) > 1 and (strings._ends[1:] < strings._ends[:-1]).any():
                raise PactlError(f"{path} is damaged: its {what} offsets go backwards: {FIX}")
        codes = column("label_codes")
        if n and (int(codes.min()) < 0 or int(codes.max()) >= len(names)):
            raise PactlError(
                f"{path} is damaged: a label code is outside its {len(names):,} labels: {FIX}"
            )
        return cls(
            column("ids"),
            paths,
            Labels(codes, names),
            column("sizes"),
            column("mtimes"),
            lookup=(identity, column("order"), column("sorted")),
        )

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Row position of each id (any shape), -1 where the table has no such id."""
        wanted = np.asarray(ids, dtype=np.int64)
        n = len(self.ids)
        if self._identity:
            return np.where((wanted >= 0) & (wanted < n), wanted, -1)
        if n == 0:
            return np.full(wanted.shape, -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._sorted, wanted), n - 1)
        return np.where(self._sorted[at] == wanted, self._order[at], -1)

    def max_id(self) -> int:
        if not len(self.ids):
            return -1
        return len(self.ids) - 1 if self._identity else int(self._sorted[-1])

    def take(self, rows: np.ndarray) -> ItemTable:
        """The rows at `rows` (positions, or a boolean mask), in that order."""
        rows = _positions(rows, len(self))
        return ItemTable(
            self.ids[rows],
            self.paths.take(rows),
            self.labels.take(rows),
            self.sizes[rows],
            self.mtimes[rows],
        )

    def concat(self, other: ItemTable) -> ItemTable:
        return ItemTable.join([self, other])

    @classmethod
    def join(cls, tables: Sequence[ItemTable]) -> ItemTable:
        """The rows of `tables` in order, copied once (not once per table, as chained concat)."""
        return cls(
            np.concatenate([t.ids for t in tables] or [np.empty(0, np.int64)]),
            Strings.join([t.paths for t in tables]),
            Labels.join([t.labels for t in tables]),
            np.concatenate([t.sizes for t in tables] or [np.empty(0, np.int64)]),
            np.concatenate([t.mtimes for t in tables] or [np.empty(0, np.int64)]),
        )


def _positions(rows: np.ndarray, n: int) -> np.ndarray:
    """Row positions from positions or a boolean mask of length n."""
    rows = np.asarray(rows)
    if rows.dtype == bool:
        if rows.shape != (n,):
            raise IndexError(f"a mask of {rows.shape} rows for {n}")
        return np.flatnonzero(rows)
    rows = rows.astype(np.int64).ravel()
    if len(rows) and (rows.min() < -n or rows.max() >= n):
        raise IndexError(f"rows out of range for {n}")
    return np.where(rows < 0, rows + n, rows)


def _lookup(ids: np.ndarray) -> tuple[bool, np.ndarray, np.ndarray]:
    """(ids are 0..n-1, argsort, sorted ids); refuses a repeated id."""
    empty = np.empty(0, dtype=np.int64)
    if np.array_equal(ids, np.arange(len(ids), dtype=np.int64)):
        return True, empty, empty
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    repeated = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(repeated):
        raise PactlError(f"item id {int(ordered[repeated[0]])} appears twice")
    return False, order.astype(np.int64), ordered


# ------------------------------------------------------------------------------ items.bin


SECTION_DTYPES = {
    "ids": "<i8",
    "sizes": "<i8",
    "mtimes": "<i8",
    "path_ends": "<i8",
    "path_bytes": "|u1",
    "label_codes": "<i4",
    "label_ends": "<i8",
    "label_bytes": "|u1",
    "order": "<i8",
    "sorted": "<i8",
}


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def _write_sections(f: IO[bytes], fields: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    at, offsets, places = 0, {}, {}
    for name, dtype in SECTION_DTYPES.items():
        offsets[name] = at
        places[name] = [dtype, at, len(arrays[name])]
        at = _aligned(at + len(arrays[name]) * np.dtype(dtype).itemsize)
    header = {"format": TABLE_FORMAT, "version": TABLE_VERSION, **fields, "sections": places}
    text = json.dumps(header).encode()
    f.write(MAGIC + len(text).to_bytes(8, "little") + text)
    start = _aligned(len(MAGIC) + 8 + len(text))
    for name, dtype in SECTION_DTYPES.items():
        f.write(b"\0" * (start + offsets[name] - f.tell()))
        f.write(np.ascontiguousarray(arrays[name], dtype=dtype).data)


def _map_sections(path: Path) -> tuple[dict[str, Any], Any]:
    """items.bin's checked header and a function from section name to its mapped array."""
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
        raise PactlError(f"{path} cannot be read ({e}): {FIX}") from None
    size = int.from_bytes(mapped[8:16], "little") if len(mapped) >= 16 else -1
    if mapped[:8] != MAGIC or not 0 < size <= min(MAX_HEADER, len(mapped) - 16):
        raise PactlError(f"{path} is not a pactl item table, or is truncated: {FIX}")
    try:
        header = json.loads(mapped[16 : 16 + size])
    except ValueError:
        raise PactlError(f"{path} has a corrupt header: {FIX}") from None
    if not isinstance(header, dict) or header.get("format") != TABLE_FORMAT:
        raise PactlError(f"{path} is not a pactl item table: {FIX}")
    if header.get("version") != TABLE_VERSION:
        raise PactlError(
            f"{path} has item table version {header.get('version')!r}, this pactl reads "
            f"version {TABLE_VERSION}: {FIX}"
        )
    places = header.get("sections")
    count, identity = header.get("count"), header.get("identity")
    if not (isinstance(places, dict) and isinstance(count, int) and isinstance(identity, bool)):
        raise PactlError(f"{path} has a corrupt header: {FIX}")
    start = _aligned(16 + size)

    def column(name: str) -> np.ndarray:
        place = places.get(name)
        if not (isinstance(place, list) and len(place) == 3 and place[0] == SECTION_DTYPES[name]):
            raise PactlError(f"{path} lacks section {name}: {FIX}")
        if not all(isinstance(v, int) and v >= 0 for v in place[1:]):
            raise PactlError(f"{path} has a corrupt header: {FIX}")
        dtype, offset, n = np.dtype(place[0]), int(place[1]), int(place[2])
        if start + offset + n * dtype.itemsize > len(mapped):
            raise PactlError(
                f"{path} is truncated or corrupt ({len(mapped):,} bytes; section {name} ends at "
                f"{start + offset + n * dtype.itemsize:,}): {FIX}"
            )
        return np.frombuffer(mapped, dtype=dtype, count=n, offset=start + offset)

    return header, column


# ------------------------------------------------------------------------------ CSV cells


def _stat(values: np.ndarray | None, n: int) -> np.ndarray:
    if values is None:
        return np.full(n, UNKNOWN, dtype=np.int64)
    return np.asarray(values, dtype=np.int64)


def _int(row: tuple[Any, ...], at: int) -> int:
    """Column `at` of a row as an int; -1 when the row is shorter or the cell empty."""
    if len(row) <= at or row[at] is None or row[at] == "":
        return UNKNOWN
    return int(row[at])


def _parse_rows(reader: Any, path: Path, at: tuple[int, int]) -> ItemTable:
    """The rows of a CSV reader (past its header) straight into compact columns: bytes of
    the paths, label codes, int64 arrays. One loop with its appends bound: it runs per row."""
    ids, sizes, mtimes, ends = (array("q") for _ in range(4))
    codes, blob, seen = array("i"), bytearray(), dict[str, int]()
    add_id, add_size, add_mtime, add_end = ids.append, sizes.append, mtimes.append, ends.append
    add_code, code_of = codes.append, seen.setdefault
    at_size, at_mtime = at
    for row in reader:
        n = len(row)
        if n < 2:
            if row:
                raise PactlError(f"{path} line {reader.line_num}: expected id,path,label")
            continue
        try:
            add_id(int(row[0]))
            add_size(int(row[at_size]) if at_size < n and row[at_size] else UNKNOWN)
            add_mtime(int(row[at_mtime]) if at_mtime < n and row[at_mtime] else UNKNOWN)
        except ValueError:
            raise PactlError(f"{path}: {_bad_cell(row, at)}") from None
        blob += unescape_cell(row[1]).encode(ENCODING, ERRORS)  # CsvWriter's formula escape
        add_end(len(blob))
        add_code(code_of(unescape_cell(row[2]) if n > 2 else "", len(seen)))

    def int64(values: array[int]) -> np.ndarray:
        return np.frombuffer(values, dtype=np.int64) if values else np.empty(0, np.int64)

    paths = Strings(np.frombuffer(blob, dtype=np.uint8), int64(ends))
    labels = Labels(
        np.frombuffer(codes, dtype=np.int32) if codes else np.empty(0, np.int32), Strings.of(seen)
    )
    return ItemTable(int64(ids), paths, labels, int64(sizes), int64(mtimes))


def _bad_cell(row: list[str], at: tuple[int, int]) -> str:
    """Which cell of a row that failed to parse is not an integer."""
    for name, i in (("id", 0), *zip(STAT_COLUMNS, at, strict=True)):
        if i < len(row) and (name == "id" or row[i]):
            try:
                int(row[i])
            except ValueError:
                return f"{name} {row[i]!r} is not an integer"
    return f"row {row!r} cannot be read"
