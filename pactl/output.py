r"""Query results on stdout: a table, CSV or JSON Lines, or bare paths for xargs.

Paths, labels and query names are data: a file name may hold any character but NUL and `/`,
and bytes that are not UTF-8 (which Python holds as lone surrogates, U+DC80 to U+DCFF). What
each format does with them:

- table, for people: each name through console.visible() in a rich Text, so markup, :emoji:
  codes, control characters and bidi overrides are shown, never acted on.
- csv: exact, and never a formula. A field holding a line break (a lone `\r` too), a comma or a
  quote is quoted, and bytes that are not UTF-8 are written as themselves (surrogateescape):
  read it back with newline="" and errors="surrogateescape", undo the formula escape
  (pactl.store.csv_cells.unescape_cell) and os.fsencode gives each name's bytes. Every CSV pactl
  writes goes through pactl.store.csv_cells.CsvWriter, which escapes text cells that a spreadsheet
  would take for a formula.
- jsonl: exact and ASCII. json.dumps escapes every non-ASCII character (a lone surrogate as
  "\udce9"), so each line is valid JSON in valid UTF-8; json.loads gives back the same str.
- paths only: each path's own bytes (os.fsencode), then NUL (-0) or a newline, so `xargs -0`
  gets the real file names. A name with a newline is still written as it is; newline-separated,
  it reads as two, so stderr gets one warning that suggests -0.
"""

from __future__ import annotations

import io
import json
import math
import os
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pactl.console import Reporter, visible
from pactl.store.csv_cells import CsvWriter, csv_text


class HitWriter:
    """Writes hit rows as they come; CSV gets its header once."""

    columns: tuple[str, ...] = ("query", "rank", "id", "path", "label", "score")

    def __init__(
        self,
        console: Console,
        stream: TextIO,
        fmt: str,
        paths_only: bool,
        null: bool,
        reporter: Reporter | None = None,
    ) -> None:
        """`reporter` (stderr by default) gets the warning about newlines in --paths-only."""
        self.console, self.stream, self.fmt = console, stream, fmt
        self.paths_only, self.end = paths_only, "\0" if null else "\n"
        self.reporter = reporter if reporter is not None else Reporter()
        self.header_done = self.newline_warned = False

    def write(self, hits: list[list[Any]]) -> None:
        rows = [h for per_query in hits for h in per_query]
        if self.paths_only:
            self._paths(rows)
        elif self.fmt == "table":
            self._table(hits)
        elif self.fmt == "csv":
            self._csv(rows)
        else:
            for h in rows:  # ensure_ascii (the default): see the module's docstring
                self.stream.write(
                    json.dumps(dict(zip(self.columns, self._json_values(h), strict=True))) + "\n"
                )
        self.stream.flush()

    def _values(self, hit: Any) -> list[Any]:
        return [hit.query, hit.rank, hit.id, hit.path, hit.label, round(float(hit.score), 6)]

    def _json_values(self, hit: Any) -> list[Any]:
        """A row's values for JSON Lines (where a cell may be a list, not its CSV text)."""
        return self._values(hit)

    def _paths(self, rows: list[Any]) -> None:
        """Newline-separated output cannot tell a newline in a name from the end of one: the
        name is still written as it is (the bytes are the data), with one warning that names -0.
        """
        if self.end == "\n" and not self.newline_warned:
            broken = next((h.path for h in rows if "\n" in h.path), None)
            if broken is not None:
                self.reporter.warn(
                    f"hit path {broken} holds a newline, so newline-separated --paths-only output "
                    "is ambiguous; use -0 (with xargs -0) for NUL-separated paths"
                )
                self.newline_warned = True
        self._write_exact("".join(h.path + self.end for h in rows))

    def _csv(self, rows: list[Any]) -> None:
        buffer = io.StringIO()
        plain = CsvWriter(buffer, quote=False)
        # The writer quotes \n but not a lone \r, which a reader takes for a line end.
        quoted = CsvWriter(buffer)
        if not self.header_done:
            plain.writerow(self.columns)
            self.header_done = True
        for values in map(self._values, rows):
            has_cr = any(isinstance(v, str) and "\r" in v for v in values)
            (quoted if has_cr else plain).writerow(values)
        self._write_exact(buffer.getvalue())

    def _write_exact(self, text: str) -> None:
        """`text` with bytes that are not UTF-8 (lone surrogates) written as those bytes, to the
        binary stream under `stream` where there is one; a text-only stream gets the str."""
        binary = getattr(self.stream, "buffer", None)
        if binary is None:
            self.stream.write(text)
            return
        self.stream.flush()  # what went out as text comes first
        binary.write(os.fsencode(text))

    def _table(self, hits: list[list[Any]]) -> None:
        for per_query in hits:
            if not per_query:
                continue
            table = Table(title=Text(visible(per_query[0].query)), title_justify="left")
            table.add_column("rank", justify="right")
            table.add_column("score", justify="right")
            for name in ("label", "path"):  # folded when long, never cut short with an ellipsis
                table.add_column(name, overflow="fold")
            for h in per_query:
                table.add_row(
                    str(h.rank), f"{h.score:.4f}", Text(visible(h.label)), Text(visible(h.path))
                )
            self.console.print(table)

    def close(self) -> None:
        self.stream.flush()


def format_rows(header: list[str], rows: list[list[str]], fmt: str) -> str:
    """A listing (`pactl list`) as `fmt`: text (aligned columns under a header, for people),
    tsv (tab-separated, no header: for `cut -f1`), csv (a header, then rows) or json (a list of
    objects, one per row)."""
    if fmt == "json":
        return json.dumps([dict(zip(header, row, strict=True)) for row in rows], indent=2) + "\n"
    if fmt == "csv":
        return csv_text(header, rows)
    if fmt == "tsv":
        return "".join("\t".join(row) + "\n" for row in rows)
    shown = [[visible(cell) for cell in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in shown) for i in range(len(header))]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        for row in shown
    )


class GroupWriter(HitWriter):
    """`pactl dedup`'s rows, group by group: group, id, path, score (cosine to the group's
    first member); written like query hits (the same escaping, exact CSV, ASCII JSON Lines,
    bare paths)."""

    columns: tuple[str, ...] = ("group", "id", "path", "score")

    def _values(self, hit: Any) -> list[Any]:
        return [hit.group, hit.id, hit.path, round(float(hit.score), 6)]

    def _table(self, hits: list[list[Any]]) -> None:
        table = Table(title="same item", title_justify="left")
        for name in ("group", "id", "score"):
            table.add_column(name, justify="right")
        table.add_column("path", overflow="fold")  # never cut short with an ellipsis
        for group in hits:
            for m in group:
                table.add_row(str(m.group), str(m.id), f"{m.score:.4f}", Text(visible(m.path)))
        if table.rows:
            self.console.print(table)


class FindingWriter(HitWriter):
    """`pactl audit`'s rows, list by list (suspected labels, outliers, copies, the image
    checks): kind, rank, score, path, split, label, suggested, other, other_split, other_label,
    then the evidence (appended, so that readers of the first ten keep working): id,
    class_share, neighbour_share, neighbours, box, box_in, reason. Written like query hits (the
    same escaping, exact CSV, ASCII JSON Lines, bare paths). In JSON Lines `neighbours` is a
    list of {id, label, cosine} and `box` a list [left, top, right, bottom]; in CSV they are
    one cell each: `id:cosine:label;...` (in a label, `%`, `;` written %25, %3B) and
    `left top right bottom`; a share not known is empty (null in JSON)."""

    columns: tuple[str, ...] = (
        "kind", "rank", "score", "path", "split", "label", "suggested", "other", "other_split",
        "other_label", "id", "class_share", "neighbour_share", "neighbours", "box", "box_in",
        "reason",
    )  # fmt: skip
    titles = {
        "label": "suspected wrong labels (score: doubt of the label)",
        "outlier": "outliers (score: 1 - cosine to the nearest class or neighbour)",
        "leak": "copies across splits (score: aligned likeness)",
        "conflict": "copies with two labels (score: aligned likeness)",
        "copy": "copies within the set (score: aligned likeness)",
        "unreadable": "unreadable images",
    }

    def _json_values(self, hit: Any) -> list[Any]:
        values = self._plain(hit)
        values[13] = [{"id": j, "label": name, "cosine": c} for j, name, c in hit.neighbours]
        values[14] = list(hit.box) if hit.box is not None else None
        return values

    def _values(self, hit: Any) -> list[Any]:
        values = self._plain(hit)
        values[11:13] = ["" if v is None else v for v in values[11:13]]
        values[13] = ";".join(f"{j}:{c:.4f}:{cell_label(name)}" for j, name, c in hit.neighbours)
        values[14] = " ".join(f"{v:.4f}" for v in hit.box) if hit.box is not None else ""
        return values

    def _plain(self, hit: Any) -> list[Any]:
        values = [getattr(hit, c) for c in self.columns]
        values[2] = round(float(hit.score), 6)
        values[11:13] = [round(float(v), 6) if math.isfinite(v) else None for v in values[11:13]]
        return values

    def _table(self, hits: list[list[Any]]) -> None:
        for rows in hits:
            if not rows:
                continue
            table = Table(title=self.titles.get(rows[0].kind, rows[0].kind), title_justify="left")
            table.add_column("rank", justify="right")
            table.add_column("score", justify="right")
            paired = rows[0].kind in ("leak", "conflict", "copy")
            names = (
                ("label", "path", "other_label", "other", "reason")
                if paired
                else ("label", "suggested", "path", "reason")
            )
            for name in ("split", *names):  # folded when long, never cut short with an ellipsis
                table.add_column(name, overflow="fold")
            for h in rows:
                cells = [Text(visible(str(getattr(h, name)))) for name in ("split", *names)]
                table.add_row(str(h.rank), f"{h.score:.4f}", *cells)
            self.console.print(table)


def cell_label(label: str) -> str:
    """A label inside the neighbours' CSV cell: `%` and `;` escaped, so that the cell splits at
    `;` and each part at its first two `:` (the label may hold `:`)."""
    return label.replace("%", "%25").replace(";", "%3B")
