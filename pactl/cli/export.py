"""`pactl export`: a checkpoint as ONNX, vectors as Parquet, a bundle into Qdrant (the library
side in pactl.verbs.index: export_onnx, export_parquet, export_qdrant)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pactl.cli.options import (
    Quiet,
    check_new_file,
    check_output,
    choices,
    reporter,
    to_stdout,
)
from pactl.config import (
    ONNX_MAX_OPSET,
    ONNX_MIN_OPSET,
    ONNX_OPSET,
    OnnxConfig,
    ParquetConfig,
    QdrantConfig,
    choices_of,
    declaration,
    option_of,
)
from pactl.console import counted, literal, out, quoted
from pactl.errors import UsageError


class Target(str, Enum):
    onnx = "onnx"
    parquet = "parquet"
    qdrant = "qdrant"


# QdrantConfig's fields past the collection and batch: how the collection is laid out and tuned
LAYOUT = (
    "shards", "replication", "quantization", "on_disk", "hnsw_m", "ef_construct", "parallel",
    "target_recall",
)  # fmt: skip
# option -> the --to it goes with: any other is refused rather than ignored
ONLY_FOR = {
    "--opset": Target.onnx,
    "--overwrite": Target.onnx,
    "--rows-per-shard": Target.parquet,
    "--collection": Target.qdrant,
    "--batch-size": Target.qdrant,
    **{option_of(QdrantConfig, name): Target.qdrant for name in LAYOUT},
}


def _help(name: str) -> str:
    default = QdrantConfig.__dataclass_fields__[name].default
    shown = "" if default is None or isinstance(default, bool) else f" [default: {default}]"
    return str(declaration(QdrantConfig, name)["help"]) + shown


if TYPE_CHECKING:  # the members are the declaration's, read when the CLI is built
    Quantization = Enum
else:
    Quantization = choices("Quantization", choices_of(QdrantConfig, "quantization"))


def export(
    source: Annotated[
        Path,
        typer.Argument(
            exists=True,
            help="A checkpoint (--to onnx), a vectors folder (--to parquet), or a bundle or "
            "vectors folder (--to qdrant).",
        ),
    ],
    to: Annotated[Target, typer.Option("--to", "--format", help="What to write.")],
    target: Annotated[
        str | None,
        typer.Argument(
            help="Where to write, as for --out (give one of the two).", show_default=False
        ),
    ] = None,
    out_to: Annotated[
        str | None,
        typer.Option(
            "--out",
            help="onnx: the .onnx file; parquet: a folder; qdrant: a server's URL "
            "(http://host:6333) or a folder for Qdrant's local mode.",
        ),
    ] = None,
    opset: Annotated[
        int | None,
        typer.Option(min=ONNX_MIN_OPSET, max=ONNX_MAX_OPSET, help="ONNX opset [default: 20]."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the .onnx file if it exists.")
    ] = False,
    rows_per_shard: Annotated[
        int | None,
        typer.Option(min=1, help="Vectors per .npy shard [default: 1,000,000]."),
    ] = None,
    collection: Annotated[
        str | None, typer.Option(help="Qdrant collection [default: pactl].")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(min=1, max=65_536, help="Points per Qdrant upsert [default: 256].")
    ] = None,
    shards: Annotated[int | None, typer.Option(min=1, max=1_024, help=_help("shards"))] = None,
    replication: Annotated[
        int | None, typer.Option(min=1, max=16, help=_help("replication"))
    ] = None,
    quantization: Annotated[Quantization | None, typer.Option(help=_help("quantization"))] = None,
    on_disk: Annotated[
        bool | None, typer.Option("--on-disk/--in-ram", help=_help("on_disk"), show_default=False)
    ] = None,
    hnsw_m: Annotated[int | None, typer.Option(min=4, max=128, help=_help("hnsw_m"))] = None,
    ef_construct: Annotated[
        int | None, typer.Option(min=4, max=4_096, help=_help("ef_construct"))
    ] = None,
    parallel: Annotated[int | None, typer.Option(min=1, max=64, help=_help("parallel"))] = None,
    target_recall: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help=_help("target_recall"))
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Write pactl's files in other tools' formats.

    --to onnx: the network of a checkpoint, for onnxruntime (dynamic batch axis; the
    preprocessing, fingerprint and model_config in the file's metadata), kept only when
    onnxruntime gives torch's vectors. --to parquet: a vectors folder in the clip-retrieval
    layout (embeddings/*.npy, metadata/*.parquet), which `pactl index` reads back. --to qdrant:
    a bundle's items as the points of a collection (id, path and label as payload), skipping
    those already there, so an export stopped half-way goes on when run again.

    Examples:

    \b
      pactl export runs/<run>/best.pt --to onnx --out model.onnx
      pactl export vectors/ --to parquet --out vectors-parquet/
      pactl index vectors-parquet/ --out my_index/
      pactl export my_index/ --to qdrant --out http://127.0.0.1:6333
      pactl export my_index/ --to qdrant --out qdrant-local/      # no server
      pactl export my_index/ --to qdrant qdrant-local/            # the same
      pactl query img.png --index my_index/ --qdrant qdrant-local/
    """
    from pactl.verbs.export import export_onnx, export_parquet, export_qdrant

    out_to = destination(target, out_to)
    given = {"--opset": opset is not None, "--overwrite": overwrite}
    given |= {"--rows-per-shard": rows_per_shard is not None, "--collection": bool(collection)}
    given["--batch-size"] = batch_size is not None
    layout: dict[str, Any] = {
        "shards": shards, "replication": replication, "on_disk": on_disk, "hnsw_m": hnsw_m,
        "quantization": quantization.value if quantization is not None else None,
        "ef_construct": ef_construct, "parallel": parallel, "target_recall": target_recall,
    }  # fmt: skip
    given |= {option_of(QdrantConfig, name): value is not None for name, value in layout.items()}
    for option in [name for name, value in given.items() if value and ONLY_FOR[name] != to]:
        raise UsageError(f"{option} goes with --to {ONLY_FOR[option].value}, not --to {to.value}")
    log = reporter(quiet)
    if to is Target.onnx:
        if not source.is_file():
            raise UsageError(f"--to onnx exports a checkpoint file (best.pt); {source} is not one")
        onnx_file = Path(out_to)
        check_output(onnx_file, "--out", folder=False)
        check_new_file(onnx_file, overwrite, "--out", [source])
        done: Any = export_onnx(source, onnx_file, OnnxConfig(opset or ONNX_OPSET), log)
        line = (
            f"exported {source} to {onnx_file} (opset {done['opset']}, {done['image_size']} px "
            f"-> {done['dimension']}-d; onnxruntime within {1 - done['worst_cosine']:.1e} "
            "cosine of torch)"
        )
    elif to is Target.parquet:
        folder = _folder_source(source, to)
        check_output(Path(out_to), "--out", folder=True)
        config = ParquetConfig(rows_per_shard or ParquetConfig.rows_per_shard)
        done = export_parquet(folder, Path(out_to), config, log)
        line = (
            f"wrote {counted(done['count'], 'vector')} ({done['dimension']}-d) to {out_to} in "
            f"{counted(done['shards'], 'shard')}"
        )
    else:
        folder = _folder_source(source, to)
        chosen = {name: value for name, value in layout.items() if value is not None}
        config_q = QdrantConfig(
            collection or QdrantConfig.collection,
            batch_size or QdrantConfig.batch_size,
            **chosen,
        )
        done = export_qdrant(folder, out_to, config_q, log)
        line = (
            f"exported {counted(done['written'], 'item')} to Qdrant collection "
            f"{quoted(config_q.collection)} at {out_to} ({done['skipped']:,} there already; "
            f"{done['count']:,} in all); {tuned_line(done['search'])}"
        )
    with to_stdout():
        out.print(literal(line))


def tuned_line(tuned: dict[str, Any]) -> str:
    """The tuned search of an export, in the words its result line ends with."""
    if tuned.get("hnsw_ef") is None:
        return "search not tuned (exact)"
    over = f", oversampling {tuned['oversampling']}" if tuned.get("oversampling") else ""
    exact = " (local mode: exact search)" if tuned.get("exact") else ""
    reached = "" if tuned.get("target_reached") else ", below the target"
    return (
        f"search tuned: hnsw_ef {tuned['hnsw_ef']}{over}, recall@10 {tuned['recall_at_10']}"
        f"{exact}{reached}"
    )


def destination(target: str | None, out_to: str | None) -> str:
    """Where to write: the second argument or --out, exactly one of them."""
    if target is not None and out_to is not None:
        raise UsageError(f"give where to write once: {target} or --out {out_to}, not both")
    if target is None and out_to is None:
        raise UsageError("give where to write: --out PATH|URL (or as the second argument)")
    return target if target is not None else str(out_to)


def _folder_source(source: Path, to: Target) -> Path:
    if not source.is_dir():
        what = "a vectors folder" if to is Target.parquet else "a bundle or a vectors folder"
        raise UsageError(f"--to {to.value} exports {what}; {source} is a file")
    return source
