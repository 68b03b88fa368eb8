"""Query results on stdout: a table, CSV or JSON Lines, or bare paths for xargs."""

from __future__ import annotations

import csv
import json
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table


class HitWriter:
    """Writes hit rows as they come; CSV gets its header once."""

    columns = ("query", "rank", "id", "path", "label", "score")

    def __init__(
        self, console: Console, stream: TextIO, fmt: str, paths_only: bool, null: bool
    ) -> None:
        self.console, self.stream, self.fmt = console, stream, fmt
        self.paths_only, self.end = paths_only, "\0" if null else "\n"
        self.csv = csv.writer(stream, lineterminator="\n") if fmt == "csv" else None
        self.header_done = False

    def write(self, hits: list[list[Any]]) -> None:
        rows = [h for per_query in hits for h in per_query]
        if self.paths_only:
            self.stream.write("".join(h.path + self.end for h in rows))
        elif self.fmt == "table":
            self._table(hits)
        elif self.csv is not None:
            if not self.header_done:
                self.csv.writerow(self.columns)
                self.header_done = True
            self.csv.writerows([self._values(h) for h in rows])
        else:
            for h in rows:
                self.stream.write(
                    json.dumps(dict(zip(self.columns, self._values(h), strict=True))) + "\n"
                )
        self.stream.flush()

    def _values(self, hit: Any) -> list[Any]:
        return [hit.query, hit.rank, hit.id, hit.path, hit.label, round(float(hit.score), 6)]

    def _table(self, hits: list[list[Any]]) -> None:
        for per_query in hits:
            if not per_query:
                continue
            table = Table(title=per_query[0].query, title_justify="left")
            for name in ("rank", "score", "label", "path"):
                table.add_column(name, justify="right" if name in ("rank", "score") else "left")
            for h in per_query:
                table.add_row(str(h.rank), f"{h.score:.4f}", h.label, h.path)
            self.console.print(table)

    def close(self) -> None:
        self.stream.flush()
