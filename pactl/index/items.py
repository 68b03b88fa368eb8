"""The (id, path, label) rows of a bundle: read, written, looked up by id."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pactl.errors import PactlError

ITEMS_HEADER = ("id", "path", "label")


class ItemTable:
    """The (id, path, label) rows of a bundle as three arrays indexed by position.

    Ids map to positions through a sorted copy (or directly when ids are 0..n-1), so looking up
    the hits of many queries is one vectorised search, not a dict of millions of entries. Equal
    labels share one string object, so a label costs a pointer per row.
    """

    def __init__(self, ids: np.ndarray, paths: np.ndarray, labels: np.ndarray) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)  # (n,)
        self.paths = paths  # (n,) object array of str
        self.labels = labels  # (n,) object array of str; "" when unlabelled
        if not (len(self.ids) == len(paths) == len(labels)):
            raise ValueError("ids, paths and labels differ in length")
        n = len(self.ids)
        self._identity = bool(np.array_equal(self.ids, np.arange(n, dtype=np.int64)))
        self._order = np.empty(0, dtype=np.int64)
        self._sorted = np.empty(0, dtype=np.int64)
        if not self._identity:
            self._order = np.argsort(self.ids, kind="stable")
            self._sorted = self.ids[self._order]
            repeated = np.flatnonzero(self._sorted[1:] == self._sorted[:-1])
            if len(repeated):
                raise PactlError(f"item id {int(self._sorted[repeated[0]])} appears twice")

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[int, str, str]]) -> ItemTable:
        ids = np.fromiter((int(r[0]) for r in rows), dtype=np.int64, count=len(rows))
        labels = _strings([r[2] or "" for r in rows], share=True)
        return cls(ids, _strings([r[1] for r in rows]), labels)

    @classmethod
    def read(cls, path: Path) -> ItemTable:
        """Parse an `id,path,label` CSV (as `pactl embed` writes it)."""
        ids: list[str] = []
        paths: list[str] = []
        labels: list[str] = []
        # -sig: a spreadsheet's BOM; surrogateescape: file names that are not UTF-8
        with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None or tuple(h.strip() for h in header[:3]) != ITEMS_HEADER:
                raise PactlError(f"{path} does not start with the header id,path,label")
            for row in reader:
                if len(row) < 2:
                    if row:
                        raise PactlError(f"{path} line {reader.line_num}: expected id,path,label")
                    continue
                ids.append(row[0])
                paths.append(row[1])
                labels.append(row[2] if len(row) > 2 else "")
        return cls(_parse_ids(ids, path), _strings(paths), _strings(labels, share=True))

    def write(self, path: Path) -> None:
        from pactl.embed import ITEMS_ENCODING, csv_writer

        with open(path, "w", newline="", **ITEMS_ENCODING) as f:  # type: ignore[call-overload]
            writer = csv_writer(f)
            writer.writerow(ITEMS_HEADER)
            rows = zip(self.ids.tolist(), self.paths.tolist(), self.labels.tolist(), strict=True)
            writer.writerows(rows)

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
        return int(self.ids.max()) if len(self.ids) else -1

    def concat(self, other: ItemTable) -> ItemTable:
        return ItemTable.join([self, other])

    @classmethod
    def join(cls, tables: Sequence[ItemTable]) -> ItemTable:
        """The rows of `tables` in order, copied once (not once per table, as chained concat)."""
        return cls(
            np.concatenate([t.ids for t in tables]),
            np.concatenate([t.paths for t in tables]),
            np.concatenate([t.labels for t in tables]),
        )


def _strings(values: list[str], share: bool = False) -> np.ndarray:
    """An object array of `values`; with `share`, equal strings become one object (labels repeat
    a lot, paths do not)."""
    out = np.empty(len(values), dtype=object)
    if share:
        shared: dict[str, str] = {}
        values = [shared.setdefault(v, v) for v in values]
    out[:] = values
    return out


def _parse_ids(ids: list[str], path: Path) -> np.ndarray:
    if not ids:
        return np.empty(0, dtype=np.int64)
    try:
        return np.asarray(ids, dtype=str).astype(np.int64)
    except ValueError:
        for value in ids:
            try:
                int(value)
            except ValueError:
                raise PactlError(f"{path}: id {value!r} is not an integer") from None
        raise
