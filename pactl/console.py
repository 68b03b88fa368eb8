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

# Created once per process by the CLI; library code receives them as arguments.
# No file= argument: rich then writes to whatever sys.stdout / sys.stderr is at print time.
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


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
            self.console.print(message, highlight=False, markup=False)  # paths, labels: data

    def warn(self, message: str) -> None:
        """A warning is shown even when quiet: it says the result may not be what was wanted."""
        self.console.print(f"warning: {message}", highlight=False, markup=False)

    @contextmanager
    def bar(self, description: str, total: int | None) -> Iterator[Advance]:
        """A progress bar over `total` units; yields the callback that advances it."""
        if not self.show_bars:
            yield _no_advance
            return
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        with progress:
            task = progress.add_task(description, total=total)

            def advance(n: int = 1) -> None:
                progress.advance(task, n)

            yield advance


def _no_advance(n: int = 1) -> None:
    return None


QUIET = Reporter(quiet=True)
