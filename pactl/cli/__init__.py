"""The `pactl` command line: thin commands over the library (no torch/faiss at import time).

One module per verb (download, train, embed, index, query, dedup, audit, eval, list, serve,
export, compare, sweep, plot); the options and checks they share in `options`; this module
assembles the Typer app and its entry point."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from pactl.cli import (
    audit,
    compare,
    dedup,
    download,
    embed,
    export,
    index,
    plot,
    query,
    serve,
    sweep,
    train,
)
from pactl.cli import eval as eval_verb
from pactl.cli import list as list_verb
from pactl.cli.options import to_stdout
from pactl.console import err, literal, out
from pactl.errors import PactlError, UsageError
from pactl.version import __version__


class Commands(TyperGroup):
    """pactl's verbs. Typer's own usage errors (an option value of the wrong type or out of
    range, an unknown option or verb) end as one line like pactl's, not a framed panel."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args:  # `pactl` alone: the help, as no_args_is_help asks
            return super().parse_args(ctx, args)
        with one_line_usage_errors():
            return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        fill_closed_descriptors()
        with one_line_usage_errors():
            return super().invoke(ctx)


@contextmanager
def one_line_usage_errors() -> Iterator[None]:
    try:
        yield
    except typer.TyperException as e:
        if getattr(e, "exit_code", None) != 2:  # 2: click's UsageError and its kinds
            raise
        where = getattr(getattr(e, "ctx", None), "command_path", "pactl")
        message = " ".join(e.format_message().split())
        raise UsageError(f"{message} (see {where} --help)") from None


def fill_closed_descriptors() -> None:
    """A closed stdin, stdout or stderr (`<&-`, `>&-`) gets /dev/null on its number, so that no
    file pactl opens later takes that number (where a library's own prints would land)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


app = typer.Typer(
    cls=Commands,
    name="pactl",
    help="Proxy-Anchor metric learning and FAISS retrieval: labelled images in, "
    "top-k answers out.\n\n"
    "Examples:\n\n\b\n  pactl download digits\n  pactl train digits\n  pactl index\n"
    "  pactl query img.png --k 4\n  pactl serve\n  pactl list backbones",
    no_args_is_help=True,
    add_completion=False,
    # Click's plain help: option names and choices are never cut or folded at 80 columns, and
    # `\b` paragraphs (the examples) keep their lines.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def version_callback(value: bool) -> None:
    if value:
        with to_stdout():
            out.print(f"pactl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="Version.")
    ] = False,
) -> None:
    """Proxy-Anchor metric learning and FAISS retrieval from the command line."""


# One module of pactl/cli/ per verb; registered here, in the order `pactl --help` lists them.
app.command(short_help="Fetch a dataset into $PACTL_HOME/datasets/NAME.")(download.download)
app.command(short_help="Train an embedding network with the Proxy-Anchor loss.")(train.train)
app.command(short_help="Embed images into vectors.npy, items.csv and meta.json.")(embed.embed)
app.command(short_help="Build a FAISS index bundle from vectors or images.")(index.index)
app.command(short_help="Top-k most similar indexed images for each query image.")(query.query)
app.command(short_help="Groups of the same item in a bundle or a vectors folder.")(dedup.dedup)
app.command(short_help="Suspected wrong labels, outliers and copies across splits, ranked.")(
    audit.audit
)
app.command("eval", short_help="Recall@K, MAP@R, R-precision and NMI of a network.")(
    eval_verb.eval_
)
app.command("list", short_help="List backbones, presets, losses or datasets.")(list_verb.list_)
app.command(short_help="Answer queries over HTTP: a JSON API and a web page.")(serve.serve)
app.command(short_help="A checkpoint as ONNX, vectors as Parquet, a bundle into Qdrant.")(
    export.export
)
app.command(short_help="Runs side by side: seeds as mean +- std, the Recall@1 curves.")(
    compare.compare
)
app.command(short_help="A grid or search of training runs on Optuna, resumable.")(sweep.sweep)
app.command(short_help="A run's test embeddings by t-SNE and its retrievals, as pictures.")(
    plot.plot
)


def main() -> None:
    """Entry point: one-line errors instead of tracebacks, exit 1 (runtime) or 2 (usage)."""
    try:
        app()
    except UsageError as e:
        err.print(literal(f"error: {e}"))  # names, paths and reasons: shown, never markup
        sys.exit(2)
    except PactlError as e:
        err.print(literal(f"error: {e}"))
        sys.exit(1)
    except KeyError as e:  # registries list their choices in the message
        err.print(literal(f"error: {e.args[0] if e.args else e}"))
        sys.exit(2)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (`| head`): nothing more to say
        sys.exit(0)
    except Exception as e:
        from pactl.deps import broken_import

        broken = broken_import(e)
        if broken is None:
            raise
        err.print(literal(f"error: {broken}"))
        sys.exit(1)
