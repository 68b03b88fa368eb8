"""What the verbs share: option types and choices, the checks of paths and values, and how
results reach stdout while progress goes to stderr."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pactl.config import INDEX_RULES, MODEL_RULES, TRAIN_RULES, ModelConfig, option_name
from pactl.console import Reporter, err, literal, quoted
from pactl.errors import PactlError, UsageError
from pactl.rules import MAX_K, MAX_WORKERS, Rule

Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="No progress bars or log lines (warnings and errors still show)."
    ),
]


FollowLinks = Annotated[
    bool,
    typer.Option(
        "--follow-links",
        help="Follow links that lead out of the folder (default: skipped / refused).",
    ),
]


Device = Annotated[
    str, typer.Option(help="auto (CUDA, then MPS, then CPU) | cpu | mps | cuda | cuda:N.")
]


Workers = Annotated[int, typer.Option(min=0, max=MAX_WORKERS, help="DataLoader worker processes.")]


Backbone = Annotated[
    str | None,
    typer.Option(
        help="Instead of --checkpoint: this backbone's pooled features with no training (the "
        "baseline to compare a run with), e.g. resnet50 or timm:efficientnet_lite0."
    ),
]


BackboneWeights = Annotated[
    str | None, typer.Option(help="With --backbone: imagenet (default) | none | PATH.")
]


BackboneSize = Annotated[
    int | None, typer.Option(min=1, help="With --backbone: crop size (default 224).")
]


BackboneResize = Annotated[
    int | None,
    typer.Option(min=1, help="With --backbone: resize before the crop (default: the weights')."),
]


def check_option(option: str, value: Any, rule: Rule) -> None:
    """A plain option value (not part of a config) in its range: a usage error naming it."""
    if value is not None and not rule.ok(value):
        raise UsageError(f"{option} must be {rule.wants} (got {quoted(value, 40)})")


def choices(name: str, names: tuple[str, ...]) -> Any:
    """A str Enum of a setting's declared choices (pactl.config), for its Typer option."""
    return Enum(name, [(n.replace("+", "_"), n) for n in names], type=str)


if TYPE_CHECKING:  # the members are the declarations', read when the CLI is built
    Amp = Enum
    Augment = Enum
    CodeProxies = Enum
    Loss = Enum
    Pooling = Enum
    Sampler = Enum
    OnDisk = Enum
    FaissDevice = Enum
else:
    Amp = choices("Amp", TRAIN_RULES["amp"].names)
    Augment = choices("Augment", TRAIN_RULES["augment"].names)
    CodeProxies = choices("CodeProxies", TRAIN_RULES["code_proxies"].names)
    Loss = choices("Loss", TRAIN_RULES["loss"].names)
    Pooling = choices("Pooling", MODEL_RULES["pooling"].names)
    Sampler = choices("Sampler", TRAIN_RULES["sampler"].names)
    OnDisk = choices("OnDisk", INDEX_RULES["on_disk"].names)
    FaissDevice = choices("FaissDevice", INDEX_RULES["faiss_device"].names)


class Format(str, Enum):
    table = "table"
    csv = "csv"
    jsonl = "jsonl"


SearchDevice = Annotated[
    FaissDevice,
    typer.Option(
        "--faiss-device",
        help="Where FAISS searches: auto copies a Flat index onto the GPUs when FAISS has them "
        "(the gpu extra); other kinds search on the CPU.",
    ),
]


def reporter(quiet: bool) -> Reporter:
    return Reporter(err, quiet=quiet)


@contextmanager
def to_stdout() -> Iterator[None]:
    """Results on stdout: a reader that went away (`| head`) ends the command quietly with exit
    0; a stdout that cannot be written (a full disk behind `>`, /dev/full) is one line, exit 1."""
    try:
        yield
    except BrokenPipeError:
        quiet_stdout()
        raise typer.Exit(0) from None
    except OSError as e:
        quiet_stdout()
        raise PactlError(f"cannot write to standard output ({e.strerror or e})") from None


def quiet_stdout() -> None:
    """Point descriptor 1 at /dev/null: what stdout still buffers is dropped at exit instead of
    failing a second time (where Python would print a warning and exit 120)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # closed, or not a file (tests' capture)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


def check_output(path: Path, option: str, folder: bool) -> None:
    """Refuse, before any work, an output that cannot be written: a folder where a file goes or
    a file where a folder goes, a parent that is a file, a folder that takes no new files
    (read-only, or not ours to write). Checked with a nameless file (O_TMPFILE) where the output
    will go: nothing is left behind."""
    import tempfile

    if folder and path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file, not a folder")
    if not folder and path.is_dir():
        raise UsageError(f"{option} {path} is a folder; give a file name")
    parent = path if folder else path.parent
    existing = next(p for p in (parent, *parent.parents) if p.exists() or p == Path("."))
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise PactlError(f"cannot write {option} {path}: {existing} ({e.strerror})") from None


def check_new_file(
    path: Path, overwrite: bool, option: str = "--report", inputs: Iterable[Path | str] = ()
) -> None:
    """The one rule for a file the user names for writing (pactl.store.targets): a link, a FIFO
    or a device is refused, an existing file is replaced only when asked (a report may be the
    only record of a run, a --grid named like an image may be one of the user's), and none of
    the command's `inputs` is ever its output."""
    from pactl.store.targets import check_target

    check_target(path, option, overwrite, inputs)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """A file that cannot be written after all (made read-only meanwhile, an I/O error) is one
    line; a full disk already is one (pactl.store.generations)."""
    try:
        yield
    except OSError as e:
        raise PactlError(f"cannot write {path} ({e.strerror or e})") from None


def describe_backbone(config: ModelConfig) -> str:
    from pactl.config import weights_words

    return f"{config.backbone} ({weights_words(config.weights)}, no training)"


def parse_ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--ks takes integers separated by commas (got {quoted(text)})") from None
    if not ks or min(ks) < 1 or max(ks) > MAX_K:
        raise UsageError(f"--ks needs integers from 1 to {MAX_K:,} (got {quoted(text, 40)})")
    return ks


def model_source(
    checkpoint: Path | None,
    backbone: str | None,
    weights: str | None,
    image_size: int | None,
    resize_size: int | None,
) -> Path | ModelConfig:
    """--checkpoint, or --backbone (with its --weights and sizes) and no head: exactly one."""
    if checkpoint is not None and backbone is not None:
        raise UsageError("give --checkpoint or --backbone, not both")
    if backbone is None:
        if weights or image_size or resize_size:
            raise UsageError("--weights, --image-size and --resize-size go with --backbone")
        if checkpoint is None:
            raise UsageError("give --checkpoint (a run's best.pt) or --backbone NAME")
        return checkpoint
    config = ModelConfig(
        backbone=backbone,
        weights=weights or "imagenet",
        embedding_dim=0,  # no head: the pooled features
        image_size=image_size or ModelConfig.image_size,
        resize_size=resize_size,
    )
    from pactl.backbones import constructor_for
    from pactl.model import check_model_config

    constructor_for(backbone)  # an unknown name fails before any work
    check_model_config(config, trained=False, name=option_name, error=UsageError)
    return config


def check_source(source: str) -> None:
    """SOURCE is a dataset of the catalog or an existing path (pactl.verbs.sources)."""
    from pactl.verbs.sources import check_source as check

    check(source)


@contextmanager
def on_interrupt(hint: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C: one line saying how to go on (`hint()`, worked out when it happens), exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        err.print(literal(f"interrupted; {hint()}"))
        raise typer.Exit(130) from None


def stdin_paths(null: bool = False) -> Iterator[Path]:
    """Paths on stdin (stdin_names)."""
    return map(Path, stdin_names(null))


def stdin_names(null: bool = False) -> Iterator[str]:
    """Names on stdin as written (`./123` stays `./123`), read as bytes: a name that is not
    UTF-8 keeps its bytes (os.fsdecode), as a name given on the command line does. One a line,
    or with `null` NUL-separated (from `find -print0`), where a name may hold a newline too."""
    stream = getattr(sys.stdin, "buffer", sys.stdin)  # tests give a text stream
    for record in nul_records(stream) if null else stream:
        name = os.fsdecode(record) if isinstance(record, bytes) else record
        if null:
            if name:
                yield name
        elif "\0" in name:
            raise UsageError("standard input holds NUL characters: give -0 for NUL-separated paths")
        elif name.strip():
            yield name.rstrip("\n")


def nul_records(stream: Any) -> Iterator[Any]:
    """The NUL-separated records of a binary (or text) stream, read 64 KiB at a time."""
    pending = stream.read(0)  # b"" or ""
    separator = b"\0" if isinstance(pending, bytes) else "\0"
    while chunk := stream.read(1 << 16):
        *done, pending = (pending + chunk).split(separator)
        yield from done
    if pending:
        yield pending
