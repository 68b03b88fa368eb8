"""Vectors in the clip-retrieval layout: `embeddings/img_emb_NNNNN.npy` shards (float32, unit
rows) beside `metadata/metadata_NNNNN.parquet` (one row per vector, the same order: `id`,
`path`, `label`, `size`, `mtime_ns`), which autofaiss and clip-retrieval read, and which
`pactl index` reads back, from pactl or from those tools.

pactl's own folder adds `meta.json` (`format: "pactl.parquet"`, the vectors' fingerprint and
model_config, so a bundle built from it is queried with the same checkpoint) and is written as
one generation (pactl.store.generations). A folder without meta.json (clip-retrieval's output) is
read too: its metadata needs a `path` column (or clip-retrieval's `image_path`); `id` defaults to
the row's position, `label` to "", `size` and `mtime_ns` to -1 (unknown).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from pactl.config import ParquetConfig
from pactl.console import QUIET, Reporter
from pactl.errors import PactlError
from pactl.interop import require
from pactl.store import json_fields
from pactl.version import __version__

PARQUET_FORMAT = "pactl.parquet"
PARQUET_VERSION = 1
EMBEDDINGS, METADATA, META = "embeddings", "metadata", "meta.json"
PARQUET_FILES = (EMBEDDINGS, METADATA, META)
COLUMNS = ("id", "path", "label", "size", "mtime_ns")
PATH_COLUMNS = ("path", "image_path")  # pactl's, clip-retrieval's
UNIT_TOLERANCE = 1e-3  # |norm - 1| allowed of a vector read back (float16 sources round)
EXTRA = ("parquet", "pyarrow")  # extra, module


def is_parquet_folder(folder: Path) -> bool:
    """Whether `folder` holds the layout (an embeddings/ and a metadata/ folder)."""
    return (folder / EMBEDDINGS).is_dir() and (folder / METADATA).is_dir()


def write_parquet(
    parts: list[tuple[np.ndarray, Any]],
    meta: dict[str, Any],
    out: Path,
    reporter: Reporter = QUIET,
    config: ParquetConfig = ParquetConfig(),
) -> dict[str, Any]:
    """Write vectors (`parts`: (vectors, ItemTable) pairs, as pactl.verbs.index.read_parts gives a
    vectors folder) to `out` in the layout, as one new generation; `meta` is the vectors'
    meta.json; `config.rows_per_shard` vectors go to a shard at most. Returns the meta.json
    written."""
    require("Parquet vectors", *EXTRA)
    from pactl.store.generations import check_replaceable, new_generation

    check_replaceable(out, PARQUET_FORMAT, PARQUET_FILES)
    total = sum(len(v) for v, _ in parts)
    shards = 0
    with new_generation(out, PARQUET_FILES) as gen, reporter.bar("writing", total) as advance:
        (gen / EMBEDDINGS).mkdir()
        (gen / METADATA).mkdir()
        for vectors, items in parts:
            for start in range(0, len(vectors), config.rows_per_shard):
                stop = min(start + config.rows_per_shard, len(vectors))
                _write_shard(gen, shards, vectors[start:stop], items, start, stop)
                shards += 1
                advance(stop - start)
        written = {
            "format": PARQUET_FORMAT,
            "version": PARQUET_VERSION,
            "pactl_version": __version__,
            "layout": "clip-retrieval",
            "shards": shards,
            **{k: meta.get(k) for k in ("dimension", "metric", "checkpoint", "fingerprint")},
            "count": total,
            "model_config": meta.get("model_config"),
        }
        (gen / META).write_text(json.dumps(written, indent=2) + "\n", encoding="utf-8")
    return written


def _write_shard(gen: Path, k: int, vectors: np.ndarray, items: Any, start: int, stop: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    np.save(gen / EMBEDDINGS / f"img_emb_{k:05d}.npy", np.asarray(vectors, dtype=np.float32))
    rows = slice(start, stop)
    table = pa.table(
        {
            "id": pa.array(items.ids[rows], pa.int64()),
            "path": pa.array([items.paths[i] for i in range(start, stop)], pa.string()),
            "label": pa.array([items.labels[i] for i in range(start, stop)], pa.string()),
            "size": pa.array(items.sizes[rows], pa.int64()),
            "mtime_ns": pa.array(items.mtimes[rows], pa.int64()),
        }
    )
    pq.write_table(table, gen / METADATA / f"metadata_{k:05d}.parquet")


def read_parquet(folder: Path) -> tuple[list[tuple[np.ndarray, Any]], dict[str, Any]]:
    """The layout's shards as (memory-mapped vectors, ItemTable) parts in shard order, and a
    vectors meta (pactl's meta.json, or one made from the shards for other tools' folders)."""
    require("Parquet vectors", *EXTRA)
    from pactl.store.generations import read_current

    return read_current(folder, lambda gen: _read_generation(gen, folder))


def _read_generation(
    gen: Path, folder: Path
) -> tuple[list[tuple[np.ndarray, Any]], dict[str, Any]]:
    vectors_files = _numbered(gen / EMBEDDINGS, ".npy")
    metadata_files = _numbered(gen / METADATA, ".parquet")
    if not vectors_files:
        raise PactlError(f"{folder / EMBEDDINGS} holds no .npy shards")
    if len(vectors_files) != len(metadata_files):
        raise PactlError(
            f"{folder} has {len(vectors_files)} embedding shards but {len(metadata_files)} "
            f"metadata files: each {EMBEDDINGS}/*.npy needs its {METADATA}/*.parquet"
        )
    parts, first_id = [], 0
    for npy, parquet in zip(vectors_files, metadata_files, strict=True):
        vectors = _read_vectors(npy, folder)
        items = _read_items(parquet, len(vectors), first_id, folder)
        first_id += len(vectors)
        parts.append((vectors, items))
    dims = sorted({int(v.shape[1]) for v, _ in parts})
    if len(dims) != 1:
        raise PactlError(f"{folder}: the shards' vectors differ in dimension ({dims})")
    meta = _read_meta(gen, folder) or {
        "dimension": dims[0],
        "metric": "ip",
        "checkpoint": None,
        "fingerprint": None,
        "model_config": None,
    }
    if meta["dimension"] != dims[0]:
        raise PactlError(
            f"{folder}/meta.json says dimension {meta['dimension']}, its shards hold {dims[0]}"
        )
    count = sum(len(v) for v, _ in parts)
    return parts, {**meta, "count": count}


def _numbered(folder: Path, suffix: str) -> list[Path]:
    """The files of `folder` ending in `suffix`, by the number in their name (img_emb_2 before
    img_emb_10, as clip-retrieval numbers them without padding)."""
    if not folder.is_dir():
        return []

    def number(path: Path) -> tuple[int, str]:
        found = re.findall(r"\d+", path.stem)
        return (int(found[-1]) if found else -1, path.name)

    return sorted((p for p in folder.iterdir() if p.suffix == suffix), key=number)


def _read_vectors(npy: Path, folder: Path) -> np.ndarray:
    try:
        vectors = np.load(npy, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise PactlError(f"{npy} is not a .npy array ({e})") from None
    if vectors.ndim != 2 or vectors.dtype not in (np.float32, np.float16):
        raise PactlError(f"{npy} holds {vectors.dtype} {vectors.shape}, not (N, D) float32 rows")
    vectors = vectors if vectors.dtype == np.float32 else vectors.astype(np.float32)
    sample = np.linalg.norm(np.asarray(vectors[:1000], dtype=np.float64), axis=1)
    if len(sample) and np.abs(sample - 1).max() > UNIT_TOLERANCE:
        raise PactlError(
            f"{npy}: its vectors are not L2-normalised (a norm of {sample.max():.3g}); pactl "
            "indexes cosine similarity as the inner product of unit vectors"
        )
    return vectors


def _read_items(parquet: Path, count: int, first_id: int, folder: Path) -> Any:
    """The ItemTable of one metadata file: `count` rows, a path column at least."""
    import pyarrow.parquet as pq

    from pactl.index import ItemTable

    try:
        schema = pq.read_schema(parquet)
    except Exception as e:  # pyarrow's ArrowInvalid and OSError for files that are not Parquet
        raise PactlError(f"{parquet} is not a Parquet file ({str(e)[:100]})") from None
    names = list(schema.names)
    path_column = next((c for c in PATH_COLUMNS if c in names), None)
    if path_column is None:
        raise PactlError(
            f"{parquet} has no path column (it has {', '.join(names) or 'none'}): pactl reads "
            f"{', '.join(COLUMNS)} (path, or clip-retrieval's image_path, at least)"
        )
    wanted = [path_column, *(c for c in ("id", "label", "size", "mtime_ns") if c in names)]
    table = pq.read_table(parquet, columns=wanted)
    if table.num_rows != count:
        raise PactlError(
            f"{parquet} has {table.num_rows:,} rows for the {count:,} vectors of its .npy shard"
        )
    column = {name: table.column(name).to_numpy(zero_copy_only=False) for name in wanted}
    ids = column.get("id", np.arange(first_id, first_id + count, dtype=np.int64))
    labels = column.get("label", np.full(count, "", dtype=object))
    return ItemTable(
        np.asarray(ids, dtype=np.int64),
        [str(p) for p in column[path_column]],
        ["" if v is None else str(v) for v in labels],
        np.asarray(column.get("size", np.full(count, -1)), dtype=np.int64),
        np.asarray(column.get("mtime_ns", np.full(count, -1)), dtype=np.int64),
    )


def _read_meta(gen: Path, folder: Path) -> dict[str, Any] | None:
    """pactl's meta.json of the layout, checked; None when the folder has none."""
    if not (gen / META).is_file():
        return None
    where = folder / META
    meta = json_fields.read_json_object(gen / META, where, "a pactl Parquet meta.json")
    if meta.get("format") != PARQUET_FORMAT:
        raise PactlError(
            f"{where} is not a pactl Parquet meta.json (format {meta.get('format')!r})"
        )
    version = json_fields.field(meta, "version", int, where)
    if version > PARQUET_VERSION:
        raise PactlError(f"{where} was written by a newer pactl (version {version})")
    json_fields.field(meta, "dimension", int, where, 1, 65_536)
    json_fields.field(meta, "fingerprint", str, where, optional=True)
    json_fields.field(meta, "model_config", dict, where, optional=True)
    return meta
