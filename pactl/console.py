"""Consoles and progress: results go to stdout, everything else to stderr.

On a terminal, progress is a live bar. Where stderr is not a terminal (a log file, `docker
logs`, CI) a bar would be invisible or garble the log, so long work writes a plain line every
PROGRESS_EVERY seconds instead, and work shorter than that writes none.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from time import monotonic
from typing import Literal, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

# Seconds between plain progress lines when stderr is not a terminal; the first comes after as
# long, so a short job stays silent.
PROGRESS_EVERY = 10.0

# Created once per process by the CLI; library code receives them as arguments.
# No file= argument: rich then writes to whatever sys.stdout / sys.stderr is at print time.


class _Console(Console):
    """rich's Console, except that a reader going away (`pactl query | head`) is a normal end:
    exit 0 with nothing more said, as for the csv and jsonl formats, where rich exits 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        stream = sys.stderr if self.stderr else sys.stdout
        os.dup2(devnull, stream.fileno())  # later writes (and the exit's flush) go nowhere
        raise SystemExit(0)


out = _Console(soft_wrap=True)
err = _Console(stderr=True, soft_wrap=True)


# Characters whose escape has a name; everything else that needs one is written in hex.
_NAMED = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def visible(text: str) -> str:
    r"""`text` as it can safely be shown on a terminal: what a terminal would act on or hide is
    written out as an escape, so a file name can neither move the cursor, recolour the screen,
    reorder what follows (bidi overrides) nor pass for another name.

    Escaped: every character that str.isprintable() rejects (C0 and C1 controls, DEL, format
    characters such as U+202E, line and paragraph separators, spaces other than U+0020, lone
    surrogates), and the backslash itself, doubled, so that each escape reads one way only:

    - `\\`, `\t`, `\n`, `\r`: a backslash, tab, newline, carriage return;
    - `\xNN` below 80: that ASCII control character (`\x1b` is ESC);
    - `\xNN` from 80 up: a byte of the name that is not UTF-8 (Python holds it as the lone
      surrogate U+DC00 + byte), shown as the byte instead of failing to encode;
    - `\uNNNN`, `\UNNNNNNNN`: any other such character (`\u0085` is the C1 control NEL).

    Printable text (letters of any script, U+0020 spaces, punctuation) is kept as it is.
    """
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escape(c) if c == "\\" or not c.isprintable() else c for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def quoted(value: object, most: int = 80) -> str:
    """A user's string in quotes for a message, cut to `most` characters; not repr(), whose
    own escapes visible() would escape again (a newline would show as `\\n`)."""
    text = str(value)
    return f"'{text[:most]}'" + ("..." if len(text) > most else "")


def literal(message: str) -> Text:
    """A message for console.print() shown exactly as written: no markup, no :emoji: codes, no
    highlighting, and control characters made visible(). For any line that holds a path, label
    or other user string; a log line is one line (a newline in it shows as `\\n`)."""
    return Text(visible(message))


class Advance(Protocol):
    """A progress callback: `advance(n)` records n more units done."""

    def __call__(self, n: int = 1) -> None: ...


class Reporter:
    """Progress and log lines on stderr: bars on a terminal, a plain line every `every` seconds
    elsewhere; no progress at all when quiet."""

    def __init__(
        self, console: Console | None = None, quiet: bool = False, every: float = PROGRESS_EVERY
    ) -> None:
        self.console = console if console is not None else err
        self.quiet = quiet
        self.show_bars = not quiet and self.console.is_terminal
        self.every = every  # seconds between plain progress lines

    def log(self, message: str) -> None:
        if not self.quiet:
            self.console.print(literal(message))  # paths, labels: data, never markup

    def warn(self, message: str) -> None:
        """A warning is shown even when quiet: it says the result may not be what was wanted."""
        self.console.print(literal(f"warning: {message}"))

    @contextmanager
    def bar(self, description: str, total: int | None) -> Iterator[Advance]:
        """A progress bar over `total` units; yields the callback that advances it."""
        if not self.show_bars:
            yield self.progress_lines(description, total)
            return
        progress = Progress(
            TextColumn("{task.description}", style="bold", markup=False),  # names: not markup
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        with progress:
            task = progress.add_task(visible(description), total=total)

            def advance(n: int = 1) -> None:
                progress.advance(task, n)

            yield advance

    def progress_lines(
        self,
        description: str,
        total: int | None,
        completed: int = 0,
        unit: Literal["items", "bytes"] = "items",
    ) -> Advance:
        """The callback for progress without a bar: a plain line at most every `every` seconds
        where stderr is not a terminal, nothing when quiet or on a terminal (a bar shows it)."""
        if self.quiet or self.console.is_terminal:
            return _no_advance
        return _ProgressLines(self, description, total, completed, unit).advance


class _ProgressLines:
    """`embedding: 1,234/10,000 (12%), 35 s elapsed, about 4 min left`, now and then."""

    def __init__(
        self,
        reporter: Reporter,
        description: str,
        total: int | None,
        completed: int,
        unit: Literal["items", "bytes"],
    ) -> None:
        self.reporter = reporter
        self.description = description
        self.total = total
        self.done = self.first = completed  # a resumed download's rate counts from here
        self.amount = _bytes if unit == "bytes" else _items
        self.start = monotonic()
        self.due = self.start + reporter.every

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = monotonic()
        if now >= self.due:
            self.due = now + self.reporter.every
            self.reporter.log(self.line(now - self.start))

    def line(self, elapsed: float) -> str:
        done = self.amount(self.done)
        if not self.total:
            return f"{self.description}: {done}, {duration_words(elapsed)} elapsed"
        share = min(100, 100 * self.done // self.total)
        text = f"{self.description}: {done}/{self.amount(self.total)} ({share}%), "
        text += f"{duration_words(elapsed)} elapsed"
        rate = (self.done - self.first) / elapsed if elapsed > 0 else 0.0
        if rate > 0 and self.done < self.total:
            text += f", about {duration_words((self.total - self.done) / rate)} left"
        return text


def _items(n: int) -> str:
    return f"{n:,}"


def counted(n: int, noun: str) -> str:
    """`n` and the noun in the number it takes: "1 item", "2,048 items"."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _bytes(n: int) -> str:
    """Decimal units, as the terminal's download bar shows them."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def duration_words(seconds: float) -> str:
    """Seconds as every line on stderr says them (progress, the time budget): 45 s, 1.5 min,
    2.1 h, in the units `--time-budget` takes."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:  # 90 s reads 1.5 min, not 2
        return f"{seconds / 60:.1f}".removesuffix(".0") + " min"
    return f"{seconds / 3600:.1f} h"


def _no_advance(n: int = 1) -> None:
    return None


QUIET = Reporter(quiet=True)
