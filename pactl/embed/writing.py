"""Writing the vectors folder that `pactl embed` makes and `pactl index` reads: vectors.npy,
items.csv, skipped.csv and meta.json, progress commits for resuming (its format is
pactl.store.vectors_folder's; its shards and reading it back pactl.embed.folder's)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pactl.checkpoint import Network
from pactl.config import EmbedConfig, ModelConfig, to_dict
from pactl.console import Reporter
from pactl.embed import fastpath
from pactl.embed.folder import read_vectors_in
from pactl.embed.forward import Embedded, embed_files
from pactl.errors import PactlError
from pactl.store.csv_cells import write_rows
from pactl.store.generations import (
    KeepCurrent,
    allocate,
    atomic_path,
    new_generation,
    read_current,
    record_files,
)
from pactl.store.vectors_folder import (
    ITEMS_COLUMNS,
    PROGRESS_PREFIX,
    VECTORS_FILES,
    VECTORS_FORMAT,
    VECTORS_VERSION,
)
from pactl.version import __version__


@dataclass
class Previous:
    """What an earlier embed into the same folder, with the same model, already has."""

    vectors: np.ndarray  # memory-mapped
    rows: dict[str, tuple[int, int, int, int]]  # path -> (row, id, size, mtime_ns)

    @property
    def next_id(self) -> int:
        return 1 + max((r[1] for r in self.rows.values()), default=-1)


def read_previous(out_dir: Path, fingerprint: str) -> Previous | None:
    """The folder's earlier vectors when they came from the same model, else None."""

    def read(folder: Path) -> Previous | None:
        vectors, meta = read_vectors_in(folder, out_dir)
        if meta.get("fingerprint") != fingerprint:
            return None
        from pactl.store.item_table import ItemTable

        items = ItemTable.read(folder / "items.csv")
        columns = (items.paths, items.ids.tolist(), items.sizes.tolist(), items.mtimes.tolist())
        rows = {path: (row, *rest) for row, (path, *rest) in enumerate(zip(*columns, strict=True))}
        return Previous(vectors, rows)

    try:
        return read_current(out_dir, read)
    except (PactlError, OSError, ValueError, KeyError, TypeError):
        return None  # nothing usable: everything is embedded again


def other_network(out_dir: Path, fingerprint: str) -> str | None:
    """The fingerprint of the network the folder's vectors came from, when another one."""

    def read(folder: Path) -> str | None:
        found = json.loads((folder / "meta.json").read_text(encoding="utf-8")).get("fingerprint")
        return str(found) if found and found != fingerprint else None

    try:
        return read_current(out_dir, read)
    except (PactlError, OSError, ValueError, AttributeError):
        return None


def file_stats(files: Sequence[Path]) -> list[tuple[int, int]]:
    stats = []
    for f in files:
        try:
            st = os.stat(f)
            stats.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append((-1, -1))  # the loader reports why it cannot be read
    return stats


@dataclass
class Plan:
    """Per input file: its id, and the earlier vector's row to reuse (-1: embed it)."""

    ids: np.ndarray  # (N,) int64
    reuse: np.ndarray  # (N,) int64


def plan(
    files: Sequence[Path], ids: np.ndarray, stats: list[tuple[int, int]], previous: Previous | None
) -> Plan:
    """Unchanged files (same path, size and modification time) keep their vector and id;
    changed ones keep their id and are embedded again; new ones get ids after the largest."""
    ids = ids.copy()
    reuse = np.full(len(files), -1, dtype=np.int64)
    if previous is None:
        return Plan(ids, reuse)
    next_id = previous.next_id
    for i, (f, st) in enumerate(zip(files, stats, strict=True)):
        known = previous.rows.get(os.path.abspath(f))
        if known is None:
            ids[i], next_id = next_id, next_id + 1
            continue
        row, ids[i], size, mtime = known
        if (size, mtime) == st and st != (-1, -1):
            reuse[i] = row
    return Plan(ids, reuse)


def check_other_network(
    out_dir: Path, fingerprint: str, replace_other: bool, reporter: Reporter
) -> None:
    """Vectors of another network in `out_dir`: refused, or with `replace_other` a line saying
    that every image is embedded again."""
    other = other_network(out_dir, fingerprint)
    if other and not replace_other:
        raise PactlError(
            f"the vectors in {out_dir} come from another network (fingerprint {other[:12]}, "
            f"this one's {fingerprint[:12]}): give --overwrite to replace them, or another --out"
        )
    if other:
        reporter.log(
            f"the vectors in {out_dir} come from another network (fingerprint {other[:12]}):"
            " embedding every image again"
        )


def embed_to_folder(
    model: nn.Module,
    network: Network,
    files: Sequence[Path],
    labels: Sequence[str],
    ids: np.ndarray,
    out_dir: Path,
    device: torch.device,
    reporter: Reporter,
    config: EmbedConfig = EmbedConfig(),
    scratch: bool = False,
    replace_other: bool = False,
) -> dict[str, Any]:
    """Write vectors.npy (memory-mapped while filled), items.csv, skipped.csv and meta.json as
    one new generation of `out_dir` (pactl.store.generations): a kill leaves the old output or the
    new. `scratch`: a private folder, without the visible links. Vectors of another network already
    in `out_dir` are refused before any work, unless `replace_other` (`embed --overwrite`).

    Run again into the same folder with the same model, only new or changed files are embedded.
    Progress is committed every config.commit_every images (Progress): after a kill, the same
    command goes on from the last commit.
    """
    model_config = network.config
    stats = file_stats(files)
    meta: dict[str, Any] | None = None
    with new_generation(out_dir, VECTORS_FILES, links=not scratch) as gen:
        previous = read_previous(out_dir, network.fingerprint)
        if previous is None:
            check_other_network(out_dir, network.fingerprint, replace_other, reporter)
        job = plan(files, ids, stats, previous)
        todo = np.flatnonzero(job.reuse < 0)
        if previous is not None and not len(todo) and len(previous.rows) == len(files):
            raise KeepCurrent
        dim = model_config.dimension or model_config.embedding_dim
        fresh_path = gen / ".fresh.npy"  # the new vectors, removed once assembled
        fresh = _open_npy(fresh_path, (len(todo), dim))
        todo_files = [files[i] for i in todo.tolist()]
        progress = Progress.open(
            out_dir, network.fingerprint, todo_files, stats_of(stats, todo), config.commit_every
        )
        result = progress.embed(model, model_config, device, reporter, config, fresh)
        embedded = np.full(len(files), -1, dtype=np.int64)
        embedded[todo[result.rows]] = np.arange(len(result.rows))
        keep = np.flatnonzero((job.reuse >= 0) | (embedded >= 0))  # input order
        final = _open_npy(gen / "vectors.npy", (len(keep), dim))
        _assemble(final, keep, job.reuse, embedded, previous, fresh)
        final.flush()
        del final, fresh, previous
        fresh_path.unlink()
        # Absolute paths: results and --exclude-self mean the same from any working directory.
        rows = [
            (int(job.ids[i]), os.path.abspath(files[i]), labels[i], *stats[i])
            for i in keep.tolist()
        ]
        write_rows(gen / "items.csv", ITEMS_COLUMNS, rows)
        skipped = [(str(todo_files[i]), reason) for i, reason in result.failed]
        write_rows(gen / "skipped.csv", ("path", "reason"), skipped)
        meta = vectors_meta(
            network,
            count=len(keep),
            embedded=len(result.rows) - progress.carried,
            reused=int((job.reuse >= 0).sum()),
            resumed=progress.carried,
            skipped=len(skipped),
        )
        meta = record_files(gen, meta)
        (gen / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    Progress.clear(out_dir)  # the output holds it all now (or was up to date)
    if meta is None:
        reporter.log(f"{out_dir} is up to date: nothing new or changed")
        meta = read_current(out_dir, lambda folder: read_vectors_in(folder, out_dir)[1])
        return {**meta, "embedded": 0, "reused": meta["count"], "skipped": 0}
    return meta


def vectors_meta(
    network: Network, count: int, embedded: int, reused: int, resumed: int, skipped: int
) -> dict[str, Any]:
    """meta.json of a vectors folder; `embedded` counts this run's images, `resumed` those
    an earlier run had committed, `reused` those kept from the previous output."""
    model_config = network.config
    return {
        "format": VECTORS_FORMAT,
        "version": VECTORS_VERSION,
        "pactl_version": __version__,
        "dimension": model_config.dimension or model_config.embedding_dim,
        "count": count,
        "embedded": embedded,
        "reused": reused,
        "resumed": resumed,
        "skipped": skipped,
        "metric": "ip",
        "checkpoint": network.checkpoint,  # None: the backbone of model_config
        "fingerprint": network.fingerprint,
        "model_config": to_dict(model_config),
    }


def stats_of(stats: list[tuple[int, int]], rows: np.ndarray) -> list[tuple[int, int]]:
    return [stats[i] for i in rows.tolist()]


@dataclass
class Progress:
    """Committed progress of one embed job: a hidden folder `.pactl-progress-<key>/` of the
    output folder, one file per `commit_every` images (their vectors, which decoded, which
    failed and why), each written atomically. The key hashes the model's fingerprint, the chunk
    size and the job's files with their sizes and modification times, so progress is only ever
    reused for the same job cut the same way; any other job's progress is removed when this one
    starts."""

    folder: Path
    files: Sequence[Path]
    carried: int = 0  # images of the job taken from committed chunks (embed sets it)

    @classmethod
    def open(
        cls,
        out_dir: Path,
        fingerprint: str,
        files: Sequence[Path],
        stats: list[tuple[int, int]],
        commit_every: int,
    ) -> Progress:
        digest = hashlib.sha256(f"{fingerprint}\0{commit_every}\0".encode())
        for f, (size, mtime) in zip(files, stats, strict=True):
            digest.update(os.fsencode(os.path.abspath(f)) + f"\0{size}\0{mtime}\0".encode())
        folder = out_dir / f"{PROGRESS_PREFIX}{digest.hexdigest()[:16]}"
        for other in out_dir.glob(f"{PROGRESS_PREFIX}*"):
            if other != folder:
                shutil.rmtree(other, ignore_errors=True)
        return cls(folder, files)

    @staticmethod
    def clear(out_dir: Path) -> None:
        for folder in out_dir.glob(f"{PROGRESS_PREFIX}*"):
            shutil.rmtree(folder, ignore_errors=True)

    def embed(
        self,
        model: nn.Module,
        model_config: ModelConfig,
        device: torch.device,
        reporter: Reporter,
        config: EmbedConfig,
        out: np.ndarray,
    ) -> Embedded:
        """Embed the job's files into `out` (packed from the top, as embed_files does), taking
        committed chunks from disk and committing each new one."""
        n, commit_every, amp = len(self.files), config.commit_every, config.amp
        starts = list(range(0, n, commit_every))
        done = self._committed(len(starts))
        if done:
            reporter.log(f"going on from {done * commit_every:,} images embedded before")
        todo = n - done * commit_every
        if todo >= fastpath.PREPARE_MIN_IMAGES:  # prepared once for every chunk
            many = todo >= fastpath.COMPILE_MIN_IMAGES
            with torch.inference_mode(False):
                model = fastpath.inference_model(model, model_config, device, amp, compile=many)
        rows: list[np.ndarray] = []
        failed: list[tuple[int, str]] = []
        filled = 0
        with reporter.bar("embedding", total=n) as advance:
            for k, start in enumerate(starts):
                chunk = list(self.files[start : start + commit_every])
                if k < done:
                    vectors, got, lost = self._read(k)
                    self.carried += len(got)
                    advance(len(chunk))
                else:
                    result = embed_files(
                        model, chunk, model_config, device, reporter, config.batch_size,
                        config.workers, amp, prepare=False, advance=advance,
                        gpu_decode=config.gpu_decode,
                    )  # fmt: skip
                    vectors, got, lost = result.vectors, result.rows, result.failed
                    self._write(k, vectors, got, lost)
                out[filled : filled + len(got)] = vectors
                filled += len(got)
                rows.append(got + start)
                failed += [(int(i) + start, reason) for i, reason in lost]
        return Embedded(out[:filled], np.concatenate(rows or [np.empty(0, np.int64)]), failed)

    def _committed(self, chunks: int) -> int:
        """How many chunks, from the first, are committed."""
        done = 0
        while done < chunks and (self.folder / f"{done:06d}.npz").is_file():
            done += 1
        return done

    def _read(self, k: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]:
        with np.load(self.folder / f"{k:06d}.npz", allow_pickle=False) as z:
            lost = [(int(i), str(r)) for i, r in zip(z["failed"], z["reasons"], strict=True)]
            return z["vectors"], z["rows"], lost

    def _write(
        self, k: int, vectors: np.ndarray, rows: np.ndarray, failed: list[tuple[int, str]]
    ) -> None:
        self.folder.mkdir(exist_ok=True)
        with atomic_path(self.folder / f"{k:06d}.npz") as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                vectors=np.asarray(vectors, dtype=np.float32),
                rows=np.asarray(rows, dtype=np.int64),
                failed=np.array([i for i, _ in failed], dtype=np.int64),
                reasons=np.array([r for _, r in failed], dtype=str),
            )


def _open_npy(path: Path, shape: tuple[int, int]) -> np.memmap:
    """A writable memory-mapped .npy whose blocks are reserved on disk up front."""
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    allocate(path, os.path.getsize(path))
    return array


def _assemble(
    final: np.ndarray,
    keep: np.ndarray,
    reuse: np.ndarray,
    embedded: np.ndarray,
    previous: Previous | None,
    fresh: np.ndarray,
    chunk: int = 65536,
) -> None:
    """Fill `final` in input order from the earlier and the fresh vectors, a chunk at a time."""
    for start in range(0, len(keep), chunk):
        rows = keep[start : start + chunk]
        old, new = reuse[rows], embedded[rows]
        block = np.empty((len(rows), final.shape[1]), dtype=np.float32)
        if previous is not None and (old >= 0).any():
            block[old >= 0] = previous.vectors[old[old >= 0]]
        if (new >= 0).any():
            block[new >= 0] = fresh[new[new >= 0]]
        final[start : start + len(rows)] = block
