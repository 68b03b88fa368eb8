"""Consoles and progress bars: results go to stdout, everything else to stderr."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

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

# Created once per process by the CLI; library code receives them as arguments.
# No file= argument: rich then writes to whatever sys.stdout / sys.stderr is at print time.
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


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


def literal(message: str) -> Text:
    """A message for console.print() shown exactly as written: no markup, no :emoji: codes, no
    highlighting, and control characters made visible(). For any line that holds a path, label
    or other user string; a log line is one line (a newline in it shows as `\\n`)."""
    return Text(visible(message))


class Advance(Protocol):
    """A progress callback: `advance(n)` records n more units done."""

    def __call__(self, n: int = 1) -> None: ...


class Reporter:
    """Progress bars and log lines on stderr; silent when quiet or when stderr is not a TTY."""

    def __init__(self, console: Console | None = None, quiet: bool = False) -> None:
        self.console = console if console is not None else err
        self.quiet = quiet
        self.show_bars = not quiet and self.console.is_terminal

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
            yield _no_advance
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


def _no_advance(n: int = 1) -> None:
    return None


QUIET = Reporter(quiet=True)
