"""`pactl query`: top-k hits for query images (from arguments or stdin), as a table, CSV, JSON
Lines or bare paths."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pactl.cli.options import (
    Device,
    FaissDevice,
    FollowLinks,
    Format,
    Quiet,
    SearchDevice,
    check_new_file,
    check_option,
    check_output,
    reporter,
    stdin_paths,
    to_stdout,
    writing,
)
from pactl.config import TRAIN_RULES, QdrantConfig
from pactl.console import Reporter, counted, err, literal, out
from pactl.errors import PactlError, UsageError
from pactl.rules import MAX_K
from pactl.store.home import runs_dir

if TYPE_CHECKING:  # the library's heavy side is imported by the commands that use it
    from pactl.output import HitWriter
    from pactl.results import QueryChunk


def query(
    images: Annotated[
        list[str] | None,
        typer.Argument(help="Image files or folders; '-' reads paths from stdin."),
    ] = None,
    k: Annotated[
        int, typer.Option("--k", "-k", min=1, max=MAX_K, help="Neighbours per query.")
    ] = 4,
    index_dir: Annotated[
        Path | None, typer.Option("--index", help="Bundle folder (default: newest under runs/).")
    ] = None,
    checkpoint: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="Default: the bundle's.")
    ] = None,
    fmt: Annotated[
        Format | None,
        typer.Option(
            "--format",
            "-f",
            help="table | csv | jsonl (default: table on a terminal, jsonl in a pipe).",
        ),
    ] = None,
    exclude_self: Annotated[
        bool,
        typer.Option("--exclude-self", help="Drop the query image itself from its hits (by id)."),
    ] = False,
    paths_only: Annotated[
        bool, typer.Option("--paths-only", help="Print only the hit paths, one a line.")
    ] = False,
    null: Annotated[
        bool,
        typer.Option(
            "--null",
            "-0",
            help="NUL-separated paths on both sides, as xargs -0: '-' reads them from stdin "
            "(find -print0) and --paths-only writes them.",
        ),
    ] = False,
    same_item: Annotated[
        bool,
        typer.Option(
            "--same-item",
            help="Keep only hits at or above the bundle's calibrated same-item threshold.",
        ),
    ] = False,
    threshold: Annotated[
        float | None,
        typer.Option(
            min=-1.0, max=1.0, help="With --same-item: this cosine instead of the calibrated one."
        ),
    ] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="Fail on the first unreadable query image.")
    ] = False,
    grid: Annotated[
        Path | None,
        typer.Option(help="Also draw the first 32 queries and their hits (.png, .jpg or .webp)."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the --grid file if it exists.")
    ] = False,
    device: Device = "auto",
    faiss_device: SearchDevice = FaissDevice("auto"),
    follow_links: FollowLinks = False,
    server: Annotated[
        str | None,
        typer.Option(help="Send the queries to a running `pactl serve` at this URL (same output)."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(envvar="PACTL_TOKEN", help="With --server: the service's token."),
    ] = None,
    qdrant: Annotated[
        str | None,
        typer.Option(
            metavar="URL|PATH",
            help="Search this Qdrant server or local-mode folder (`pactl export --to qdrant`) "
            "instead of the bundle's index; the bundle's network embeds the queries.",
        ),
    ] = None,
    collection: Annotated[
        str, typer.Option(help="With --qdrant: the collection.")
    ] = QdrantConfig.collection,
    rescore: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=10_000,
            help="A bundle of lossy codes (binary, or IVF...,PQ): candidates per hit rescored "
            "by exact cosine, instead of the bundle's measured default; 0: hits in the codes' "
            "order (binary: scored 1 - 2 x distance / bits).",
        ),
    ] = None,
    vectors: Annotated[
        str | None,
        typer.Option(
            metavar="FILE.npy|-",
            help="Query vectors instead of images: an (N, dimension) array from the network "
            "that made the bundle's vectors, as .npy ('-': read from stdin), searched as "
            "Index.search searches them. A hit's query is its row number.",
        ),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Top-k most similar indexed images for each query image, on stdout.

    Unreadable query images are skipped with a line on stderr; when none can be read, the
    command fails (exit 1).

    Examples:

    \b
      pactl query img.png --k 4
      find queries -name '*.png' | pactl query - --k 4 --format jsonl
      find queries -name '*.png' -print0 | pactl query - -0 --paths-only
      pactl query img.png --paths-only -0 | xargs -0 ls -l
      pactl query queries/ --k 5 --grid hits.png
      pactl query img.png --server http://127.0.0.1:8000
      pactl query new.jpg --same-item --k 10   # already indexed?
      pactl query img.png --index my_index/ --qdrant http://127.0.0.1:6333
      pactl query img.png --index codes/ --rescore 0   # binary: Hamming order
      pactl query --vectors queries.npy --index clip_index/  # your vectors
    """
    from pactl.output import HitWriter
    from pactl.verbs.query import find_bundle, query_chunks

    log = reporter(quiet)
    images = images or []
    check_option("--device", device, TRAIN_RULES["device"])
    check_query_io(images, grid, overwrite)
    check_query_format(images, fmt, paths_only, null, same_item, threshold)
    check_qdrant(qdrant, collection, rescore)
    chosen = fmt.value if fmt else ("table" if out.is_terminal else "jsonl")
    writer = HitWriter(out, sys.stdout, chosen, paths_only, null)
    if vectors is not None:
        check_vector_query(images, checkpoint, grid, server, qdrant, exclude_self, device)
        searched = (faiss_device.value, same_item, threshold, rescore)
        with_vectors(vectors, index_dir, k, writer, log, searched)
        return
    if not images:
        raise UsageError("give query images (files, folders, '-' for paths on stdin) or --vectors")
    if server is not None:
        local = {"--index": index_dir, "--checkpoint": checkpoint, "--grid": grid}
        given = [name for name, value in local.items() if value is not None]
        given += ["--device"] if device != "auto" else []
        given += ["--faiss-device"] if faiss_device.value != "auto" else []
        given += ["--threshold"] if threshold is not None else []
        given += ["--qdrant"] if qdrant is not None else []
        paths = query_paths(images, null, follow_links, log)
        ask = (server, token, k, exclude_self, same_item, rescore)
        with_server(ask, paths, given, writer, strict, log)
        return
    check_named_queries(images, strict)
    bundle = index_dir or find_bundle(runs_dir())
    if index_dir is None:
        log.log(f"using index {bundle}")
    pictured: list[tuple[str, str | None, list[tuple[str, str, float]]]] = []
    chunks = query_chunks(
        bundle,
        query_paths(images, null, follow_links, log),
        k,
        checkpoint,
        exclude_self,
        device,
        log,
        know_labels=grid is not None,
        faiss_device=faiss_device.value,
        same_item=same_item,
        threshold=threshold,
        qdrant=(qdrant, collection) if qdrant is not None else None,
        rescore=rescore,
    )
    skipped = answer_queries(chunks, writer, strict, pictured if grid is not None else None)
    if grid is not None:
        from pactl.report import retrieval_grid

        with writing(grid):
            retrieval_grid(pictured, grid)
        log.log(f"wrote {grid}")
    if skipped:
        log.warn(f"{counted(skipped, 'unreadable query image')} skipped")


def check_vector_query(
    images: list[str],
    checkpoint: Path | None,
    grid: Path | None,
    server: str | None,
    qdrant: str | None,
    exclude_self: bool,
    device: str,
) -> None:
    """--vectors are searched in the bundle here, with no network: what belongs to query
    images, to a network or to another search is refused, not ignored."""
    named: dict[str, object] = {"IMAGES": images or None, "--checkpoint": checkpoint}
    named |= {"--grid": grid}
    named |= {"--server": server, "--qdrant": qdrant, "--exclude-self": exclude_self or None}
    named |= {"--device": None if device == "auto" else device}
    given = [name for name, value in named.items() if value is not None]
    if given:
        raise UsageError(
            f"--vectors searches vectors already made, in the bundle here: drop {', '.join(given)}"
        )


def with_vectors(
    source: str,
    index_dir: Path | None,
    k: int,
    writer: HitWriter,
    log: Reporter,
    searched: tuple[str, bool, float | None, int | None],
) -> None:
    """`pactl query --vectors FILE.npy|-`: the rows of a .npy array searched in the bundle;
    `searched`: --faiss-device, --same-item, --threshold, --rescore."""
    import io

    import numpy as np

    from pactl.verbs.query import find_bundle, vector_chunks

    bundle = index_dir or find_bundle(runs_dir())
    if index_dir is None:
        log.log(f"using index {bundle}")
    if source == "-" and sys.stdin is None:
        raise UsageError("--vectors - reads a .npy array from standard input, which is closed")
    named = "from standard input" if source == "-" else source
    try:
        stream = getattr(sys.stdin, "buffer", sys.stdin) if source == "-" else None
        data = stream.read() if stream is not None else Path(source).read_bytes()
        if not isinstance(data, bytes) or not data.startswith(b"\x93NUMPY"):
            raise ValueError("it does not start as a .npy file does")
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except OSError as e:
        raise PactlError(f"cannot read --vectors {named}: {e.strerror or e}") from None
    except (ValueError, EOFError) as e:
        raise PactlError(f"--vectors {named} is not a .npy array ({str(e)[:120]})") from None
    faiss_device, same_item, threshold, rescore = searched
    chunks = vector_chunks(bundle, array, k, log, faiss_device, same_item, threshold, rescore)
    answer_queries(chunks, writer, False, None)


def with_server(
    ask: tuple[str, str | None, int, bool, bool, int | None],
    paths: Any,
    given: list[str],
    writer: HitWriter,
    strict: bool,
    log: Reporter,
) -> None:
    """`pactl query --server URL`: the images sent to the service, its hits written as here.
    `ask`: the URL, token, k, --exclude-self, --same-item and --rescore; `given`: the local
    options given, which the service's own bundle and network leave no part in."""
    if given:
        shown = ", ".join(given)
        raise UsageError(f"--server queries the service's own bundle and network: drop {shown}")
    from pactl.serve.client import check_url, remote_chunks

    server, token, k, exclude_self, same_item, rescore = ask
    chunks = remote_chunks(check_url(server), token, paths, k, exclude_self, same_item, rescore)
    skipped = answer_queries(chunks, writer, strict, None)
    if skipped:
        log.warn(f"{counted(skipped, 'unreadable query image')} skipped")


# Skipped queries held back while none has been answered: past this many they are shown.
HOLD_SKIPPED = 1000


def answer_queries(
    chunks: Iterator[QueryChunk],
    writer: HitWriter,
    strict: bool,
    pictured: list[tuple[str, str | None, list[tuple[str, str, float]]]] | None,
) -> int:
    """Write each chunk's hits as it comes and say which queries were skipped; returns how many
    were. A skip line waits until some query has been answered: when none can be read, the
    command fails with one line instead (`--strict`: at the first unreadable image)."""
    answered, skipped = 0, 0
    held: list[tuple[str, str]] = []
    for chunk in chunks:
        if strict and chunk.failed:
            raise PactlError("unreadable query image {}: {}".format(*chunk.failed[0]))
        skipped += len(chunk.failed)
        answered += len(chunk.names)
        held += chunk.failed
        if answered or len(held) > HOLD_SKIPPED:
            for name, reason in held:
                err.print(literal(f"skipped query {name}: {reason}"))
            held = []
        if chunk.hits:  # none: not even a CSV header before a failure
            with to_stdout():
                writer.write(chunk.hits)
        for name, label, hits in zip(chunk.names, chunk.labels, chunk.hits, strict=True):
            if pictured is not None and len(pictured) < 32:
                pictured.append((name, label, [(h.path, h.label, h.score) for h in hits]))
    with to_stdout():
        writer.close()
    if not answered:
        raise PactlError(no_answer(skipped, held))
    return skipped


def check_named_queries(images: list[str], strict: bool) -> None:
    """The query files named as arguments, checked before the network loads: none of them
    there (and nothing else to read), or with --strict any of them missing, is the error the
    search would end with, said at once. Folders and '-' are read as the search goes."""
    from pactl.store.regular_files import NotRegular, check_regular, os_reason

    named = [item for item in images if item != "-" and not Path(item).is_dir()]
    held: list[tuple[str, str]] = []
    for item in named:
        try:
            check_regular(Path(item).stat().st_mode)
        except OSError as e:
            held.append((item, os_reason(e)))
        except NotRegular as e:
            held.append((item, str(e)))
    if held and strict:
        raise PactlError("unreadable query image {}: {}".format(*held[0]))
    if held and len(held) == len(images):
        raise PactlError(no_answer(len(held), held))


def no_answer(skipped: int, held: list[tuple[str, str]]) -> str:
    """The one line for a query command that answered nothing."""
    if not skipped:
        return "no query images: the folders and standard input given named none"
    if skipped == 1 and held:
        return "cannot read query image {}: {}".format(*held[0])
    first = " (first: {}: {})".format(*held[0]) if held else ""
    return f"none of the {skipped} query images could be read{first}"


def check_qdrant(qdrant: str | None, collection: str, rescore: int | None) -> None:
    """--collection needs --qdrant; --rescore (a binary bundle's own codes) does not go with it."""
    if qdrant is None and collection != QdrantConfig.collection:
        raise UsageError("--collection goes with --qdrant")
    if qdrant is not None and rescore is not None:
        raise UsageError("--rescore is for a binary bundle's own codes: drop it with --qdrant")


def check_query_format(
    images: list[str],
    fmt: Format | None,
    paths_only: bool,
    null: bool,
    same_item: bool = False,
    threshold: float | None = None,
) -> None:
    """Options that would do nothing are refused rather than ignored: --format with
    --paths-only (bare paths have no format), -0 with neither '-' nor --paths-only,
    --threshold without --same-item."""
    if threshold is not None and not same_item:
        raise UsageError("--threshold sets the --same-item threshold; give --same-item too")
    if paths_only and fmt is not None:
        raise UsageError("--paths-only writes bare paths; leave out --format")
    if null and not paths_only and "-" not in images:
        raise UsageError(
            "-0 separates the paths read from '-' and those --paths-only writes; "
            "this command has neither"
        )


def check_query_io(images: list[str], grid: Path | None, overwrite: bool = False) -> None:
    """Before the bundle loads: a stdin to read for '-', a stdout for the hits, and a --grid
    that can be written in the format its name says, replacing a file only when asked."""
    if "-" in images and sys.stdin is None:
        raise UsageError("'-' reads image paths from standard input, which is closed")
    if sys.stdout is None:
        raise PactlError("standard output is closed: the hits would go nowhere")
    if grid is not None:
        from pactl.report import check_image_path

        check_output(grid, "--grid", folder=False)
        check_image_path(grid)
        inputs = [Path(image) for image in images if image != "-"]  # a query image stays
        check_new_file(grid, overwrite, "--grid", inputs)


def query_paths(images: list[str], null: bool, follow_links: bool, reporter: Reporter) -> Any:
    """Expand '-' (paths on stdin) and folders (their images), lazily."""
    from pactl.datasets import list_images

    for item in images:
        if item == "-":
            yield from stdin_paths(null)
        elif Path(item).is_dir():
            yield from list_images(Path(item), follow_links=follow_links, reporter=reporter)
        else:
            yield Path(item)
