"""`pactl export`: a checkpoint as ONNX, a vectors folder as Parquet, a bundle (or vectors) as a
Qdrant collection (pactl.interop does the work).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pactl.config import (
    OnnxConfig,
    ParquetConfig,
    QdrantConfig,
    check_options,
)
from pactl.console import Reporter
from pactl.verbs.index import check_apart
from pactl.verbs.vector_sources import gather_vectors, read_parts


def export_onnx(
    checkpoint: Path, out: Path, config: OnnxConfig, reporter: Reporter
) -> dict[str, Any]:
    """`pactl export CHECKPOINT --to onnx`: the network as an ONNX file checked by
    onnxruntime (pactl.interop.onnx_model)."""
    from dataclasses import asdict

    from pactl.interop.onnx_model import export_onnx as export

    return asdict(export(checkpoint, out, config, reporter))


def export_parquet(
    vectors_dir: Path, out: Path, config: ParquetConfig, reporter: Reporter
) -> dict[str, Any]:
    """`pactl export VECTORS --to parquet`: a vectors folder (its shards in order) in the
    clip-retrieval layout (pactl.interop.parquet)."""
    from pactl.interop.parquet import write_parquet

    check_options(config)
    check_apart(vectors_dir, out)
    parts, meta = read_parts(vectors_dir)
    return write_parquet(parts, meta, out, reporter, config)


def export_qdrant(
    source: Path, target: str, config: QdrantConfig, reporter: Reporter
) -> dict[str, Any]:
    """`pactl export BUNDLE --to qdrant`: a bundle's live items (or a vectors folder's) as
    points of a Qdrant collection, skipping those already there, its search tuned to
    `config.target_recall` (pactl.interop.qdrant)."""
    from pactl.index import META_FILE, load_bundle
    from pactl.interop.qdrant import bundle_vectors, export_vectors

    check_options(config)
    if (source / META_FILE).is_file() and (source / "index.faiss").exists():
        vectors, items = bundle_vectors(load_bundle(source, mmap=False))
    else:
        vectors, items, _ = gather_vectors(source)
    return export_vectors(vectors, items, target, config, reporter)
