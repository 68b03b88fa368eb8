"""CSV cells that no spreadsheet runs: the one way pactl writes CSV.

A cell that a spreadsheet would take for a formula (it starts with = + - @ TAB or CR) gets a
leading single quote (escape_cell); unescape_cell gives back every str exactly. Names are data:
bytes that are not UTF-8 are written as themselves (surrogateescape), and every str cell is
quoted by default, so a line break inside a name stays inside its field.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pactl.store.home import NAME_ENCODING, NAME_ERRORS

# A spreadsheet takes a cell starting with one of these for a formula (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
ESCAPE = "'"  # the prefix OWASP recommends: the cell is shown as text, the quote hidden
# A text cell that is a plain decimal number ("-0.5", "1e-06") is read as that number, never
# as a formula, so it keeps its sign unescaped (scores and metrics written as text).
PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def escape_cell(value: Any) -> Any:
    """`value` as a CSV cell that no spreadsheet runs: a str that starts with = + - @ TAB or CR
    gets a leading single quote. Numbers (int, float) and text that is a plain decimal number
    are left as they are: a spreadsheet reads them as numbers. A str that starts with a quote
    and then one of those characters (or a second quote) gets one too, so that unescape_cell
    gives back every str exactly."""
    if not isinstance(value, str) or not value or PLAIN_NUMBER.fullmatch(value):
        return value
    if value.startswith(FORMULA_START) or _escaped(value):
        return ESCAPE + value
    return value


def unescape_cell(text: str) -> str:
    """The str that escape_cell turned into `text`."""
    return text[1:] if _escaped(text) else text


def _escaped(text: str) -> bool:
    return len(text) > 1 and text[0] == ESCAPE and text[1:].startswith((*FORMULA_START, ESCAPE))


class CsvWriter:
    """csv.writer with every cell through escape_cell: the one way pactl writes CSV. `quote`
    (QUOTE_NONNUMERIC) quotes every str, so a CR or LF inside a name stays inside its field
    (unquoted, a lone CR would end the row for every CSV reader)."""

    def __init__(self, stream: Any, quote: bool = True) -> None:
        quoting = csv.QUOTE_NONNUMERIC if quote else csv.QUOTE_MINIMAL
        self._writer = csv.writer(stream, lineterminator="\n", quoting=quoting)  # type: ignore[arg-type]

    def writerow(self, row: Iterable[Any]) -> None:
        self._writer.writerow([escape_cell(v) for v in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def csv_text(
    header: Sequence[str] | None, rows: Iterable[Iterable[Any]], quote: bool = False
) -> str:
    """A CSV file's text (the header, unless None, then the rows), for an atomic write."""
    buffer = io.StringIO()
    writer = CsvWriter(buffer, quote)
    if header is not None:
        writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def write_rows(path: Path, header: Sequence[str], rows: Iterable[Iterable[Any]]) -> None:
    """A CSV file of names (strings quoted, bytes that are not UTF-8 kept as they are)."""
    with open(path, "w", newline="", encoding=NAME_ENCODING, errors=NAME_ERRORS) as f:
        writer = CsvWriter(f)
        writer.writerow(header)
        writer.writerows(rows)
