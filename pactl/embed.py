"""Images -> L2-normalised float32 vectors, and the vectors folder that `pactl index` reads."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pactl import __version__
from pactl.config import ModelConfig, to_dict
from pactl.console import Reporter
from pactl.errors import PactlError
from pactl.fsutil import atomic_path, atomic_write_text

VECTORS_FORMAT = "pactl.vectors"


@dataclass
class Embedded:
    vectors: np.ndarray  # (N_ok, D) float32, unit rows, in input order
    rows: np.ndarray  # (N_ok,) int64 positions in the input list of the embedded images
    failed: list[tuple[int, str]] = field(default_factory=list)  # (position, reason)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise PactlError(f"device {name!r} asked for, but no CUDA device is available")
    return torch.device(name)


def autocast(device: torch.device, amp: str) -> Any:
    """bf16/fp16 autocast on the model's forward pass, or nothing for amp='none'."""
    if amp == "none":
        return nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    return torch.autocast(device_type=device.type, dtype=dtype)


def loader_for(
    files: Sequence[Path],
    labels: np.ndarray | None,
    model_config: ModelConfig,
    batch_size: int,
    workers: int,
    device: torch.device,
    train: bool = False,
    augment: str = "none",
    sampler: torch.utils.data.Sampler[int] | None = None,
    generator: torch.Generator | None = None,
) -> torch.utils.data.DataLoader:
    from pactl.images import ImageDataset, build_transform, collate

    assert model_config.mean is not None and model_config.std is not None
    transform = build_transform(
        model_config.image_size,
        model_config.resize_size,
        model_config.mean,
        model_config.std,
        train=train,
        augment=augment,
    )
    # Training crops at random scales: decode in full there (as the official loader does);
    # evaluation only needs the resize size, so large JPEGs decode in draft mode.
    target = None if train else max(model_config.resize_size, model_config.image_size)
    dataset = ImageDataset(files, labels, transform, target_size=target)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        shuffle=False,
        drop_last=train,
        num_workers=min(workers, os.cpu_count() or 1),
        pin_memory=device.type == "cuda",
        persistent_workers=False,
        collate_fn=collate,
        generator=generator,
    )


@torch.inference_mode()
def embed_files(
    model: nn.Module,
    files: Sequence[Path],
    model_config: ModelConfig,
    device: torch.device,
    reporter: Reporter,
    batch_size: int = 128,
    workers: int = 0,
    amp: str = "none",
    channels_last: bool = False,
    out: np.ndarray | None = None,
) -> Embedded:
    """Embed `files` in order; unreadable ones are skipped and listed, never fatal.

    `out` may be a (len(files), D) float32 array (a memory map, say) that receives the vectors
    of the images that decoded, packed from the top; otherwise one is allocated.
    """
    loader = loader_for(files, None, model_config, batch_size, workers, device)
    dim = model_config.embedding_dim
    vectors = out if out is not None else np.empty((len(files), dim), dtype=np.float32)
    rows = np.empty(len(files), dtype=np.int64)
    failed: list[tuple[int, str]] = []
    filled = 0
    was_training = model.training
    model.eval()
    with reporter.bar("embedding", total=len(files)) as advance:
        for batch in loader:
            failed.extend(batch.failed)
            if len(batch.indices):
                images = batch.images.to(device, non_blocking=True)
                if channels_last:
                    images = images.contiguous(memory_format=torch.channels_last)
                with autocast(device, amp):
                    emb = model(images)
                n = len(batch.indices)
                vectors[filled : filled + n] = emb.float().cpu().numpy()
                rows[filled : filled + n] = batch.indices.numpy()
                filled += n
            advance(len(batch.indices) + len(batch.failed))
    model.train(was_training)
    return Embedded(vectors[:filled], rows[:filled], failed)


def write_items(path: Path, ids: np.ndarray, paths: Sequence[str], labels: Sequence[str]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["id", "path", "label"])
    writer.writerows(zip(ids.tolist(), paths, labels, strict=True))
    atomic_write_text(path, buffer.getvalue())


def write_skipped(path: Path, failed: list[tuple[str, str]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["path", "reason"])
    writer.writerows(failed)
    atomic_write_text(path, buffer.getvalue())


def embed_to_folder(
    model: nn.Module,
    checkpoint: dict[str, Any],
    checkpoint_path: Path,
    files: Sequence[Path],
    labels: Sequence[str],
    out_dir: Path,
    device: torch.device,
    reporter: Reporter,
    batch_size: int = 128,
    workers: int = 0,
    amp: str = "none",
) -> dict[str, Any]:
    """Write vectors.npy (memory-mapped while filled), items.csv, meta.json, skipped.csv."""
    from pactl.config import from_dict

    model_config = from_dict(ModelConfig, checkpoint["model_config"])
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "vectors.npy"
    dim = model_config.embedding_dim
    with atomic_path(target) as tmp:
        memmap = np.lib.format.open_memmap(
            tmp, mode="w+", dtype=np.float32, shape=(len(files), dim)
        )
        result = embed_files(
            model, files, model_config, device, reporter, batch_size, workers, amp, out=memmap
        )
        n = len(result.rows)
        memmap.flush()
        if n < len(files):
            _pack(memmap, n, tmp)
        del memmap
    names = [str(files[i]) for i in result.rows]
    # Row i of vectors.npy is item id i; skipped images get no row and no id.
    ids = np.arange(n, dtype=np.int64)
    write_items(out_dir / "items.csv", ids, names, [labels[i] for i in result.rows])
    skipped = [(str(files[i]), reason) for i, reason in result.failed]
    write_skipped(out_dir / "skipped.csv", skipped)
    meta = {
        "format": VECTORS_FORMAT,
        "version": 1,
        "pactl_version": __version__,
        "dimension": dim,
        "count": n,
        "skipped": len(skipped),
        "metric": "ip",
        "checkpoint": str(checkpoint_path.resolve()),
        "fingerprint": checkpoint["fingerprint"],
        "model_config": to_dict(model_config),
    }
    atomic_write_text(out_dir / "meta.json", json.dumps(meta, indent=2) + "\n")
    return meta


def _pack(memmap: np.ndarray, rows: int, path: Path, chunk: int = 65536) -> None:
    """Replace the .npy at `path` with its first `rows` rows, copied in chunks (bounded memory)."""
    packed_path = path.with_name(path.name + ".packed.tmp")
    packed = np.lib.format.open_memmap(
        packed_path, mode="w+", dtype=np.float32, shape=(rows, memmap.shape[1])
    )
    for start in range(0, rows, chunk):
        stop = min(start + chunk, rows)
        packed[start:stop] = memmap[start:stop]
    packed.flush()
    del packed
    os.replace(packed_path, path)


def read_vectors(folder: Path) -> tuple[np.ndarray, dict[str, Any]]:
    """The vectors (memory-mapped) and meta of an embed output folder."""
    meta_path = folder / "meta.json"
    for name in ("vectors.npy", "items.csv", "meta.json"):
        if not (folder / name).is_file():
            raise PactlError(f"{folder} lacks {name}: is it the output of `pactl embed`?")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PactlError(f"{meta_path} is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != VECTORS_FORMAT:
        raise PactlError(f"{meta_path} is not a pactl vectors file")
    vectors = np.load(folder / "vectors.npy", mmap_mode="r")
    if vectors.ndim != 2 or vectors.shape[0] != meta["count"] or vectors.dtype != np.float32:
        raise PactlError(
            f"{folder}/vectors.npy does not match its meta.json (shape {vectors.shape})"
        )
    return vectors, meta
