"""The forward pass over batches of image files: images -> L2-normalised float32 vectors."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pactl import loaders
from pactl.config import ModelConfig
from pactl.console import Advance, Reporter
from pactl.embed import fastpath
from pactl.runtime import autocast


@dataclass
class Embedded:
    vectors: np.ndarray  # (N_ok, D) float32, unit rows, in input order
    rows: np.ndarray  # (N_ok,) int64 positions in the input list of the embedded images
    failed: list[tuple[int, str]] = field(default_factory=list)  # (position, reason)


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
    channels_last: bool = True,
    out: np.ndarray | None = None,
    prepare: bool | None = None,
    draft: bool = True,
    advance: Advance | None = None,
    gpu_decode: bool = False,
) -> Embedded:
    """Embed `files` in order; unreadable ones are skipped and listed, never fatal.

    `model` may be one fastpath.inference_model() prepared; `prepare` (default: from
    fastpath.PREPARE_MIN_IMAGES images on) prepares it here. `out` may be a (len(files), D)
    float32 array (a memory map, say) that receives the vectors of the images that decoded,
    packed from the top; otherwise one is allocated. `draft`: large JPEGs may decode at a reduced
    scale (not for evaluation).
    `advance`: a caller's progress bar to move instead of one of this call's own.
    `gpu_decode`: on a CUDA device, JPEGs decode on the GPU (loaders.GpuJpegDecoder); elsewhere
    ignored.
    """
    raw = loaders.gpu_decoding(device, gpu_decode)
    loader = loaders.loader_for(
        files, None, model_config, batch_size, workers, device, draft=draft, raw_jpeg=raw
    )
    decoder = loaders.GpuJpegDecoder(loader.dataset, model_config, device) if raw else None
    dim = model_config.dimension or model_config.embedding_dim
    vectors = out if out is not None else np.empty((len(files), dim), dtype=np.float32)
    rows = np.empty(len(files), dtype=np.int64)
    failed: list[tuple[int, str]] = []
    filled = 0
    # a prepared copy: the caller's network is not touched
    prepared = fastpath.is_prepared(model)
    was_training = not prepared and model.training
    freeze = prepare or (prepare is None and len(files) >= fastpath.PREPARE_MIN_IMAGES)
    many = prepare is None and len(files) >= fastpath.COMPILE_MIN_IMAGES
    with torch.inference_mode(False):  # tracing needs ordinary tensors
        forward = fastpath.inference_model(
            model, model_config, device, amp, channels_last, freeze, many
        )
    bar = reporter.bar("embedding", total=len(files)) if advance is None else nullcontext(advance)
    with bar as step:
        for batch in loader:
            images, indices, lost = _on_device(batch, device, decoder)
            failed.extend(lost)
            if len(indices):
                n = len(indices)
                vectors[filled : filled + n] = _forward(forward, images, device, amp, channels_last)
                rows[filled : filled + n] = indices.numpy()
                filled += n
            step(len(indices) + len(lost))
    if not prepared:
        model.train(was_training)
    return Embedded(vectors[:filled], rows[:filled], failed)


def decode_files(files: Sequence[Path], model_config: ModelConfig) -> Any:
    """`files` decoded and transformed as embed_files does, on this thread, as one Batch (its
    failures listed with their reasons): a service decodes a request's images on the request's
    own thread and leaves only the forward pass to the network's (embed_decoded)."""
    from pactl.loaders import collate

    if not files:
        return collate([])
    loader = loaders.loader_for(files, None, model_config, len(files), 0, torch.device("cpu"))
    return next(iter(loader))


def embed_decoded(
    model: nn.Module, images: torch.Tensor, model_config: ModelConfig, device: torch.device
) -> np.ndarray:
    """The vectors of images from decode_files, in one forward pass: those embed_files gives
    for the same images in one batch without preparing the network (as `pactl query` embeds a
    few images)."""
    with torch.inference_mode(False):
        forward = fastpath.inference_model(model, model_config, device, freeze=False)
    with torch.inference_mode():
        return _forward(forward, images.to(device), device, "none", channels_last=True)


def _forward(
    forward: nn.Module, images: torch.Tensor, device: torch.device, amp: str, channels_last: bool
) -> np.ndarray:
    """One batch through the network as embedding runs it: NHWC when asked, under autocast,
    float32 vectors on the CPU."""
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    with autocast(device, amp):
        return np.asarray(forward(images).float().cpu().numpy(), dtype=np.float32)


def _on_device(
    batch: Any, device: torch.device, decoder: loaders.GpuJpegDecoder | None
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, str]]]:
    """A batch's images on the device in input order, their indices, and the failures, with
    its JPEG bytes (if any) decoded by `decoder`."""
    images = batch.images.to(device, non_blocking=True)
    if decoder is None or not batch.raw:
        return images, batch.indices, batch.failed
    more, more_indices, lost = decoder(batch.raw)
    if len(batch.indices):
        images = torch.cat([images, more])
        more_indices = torch.cat([batch.indices, more_indices])
    else:
        images = more
    order = torch.argsort(more_indices)
    return images[order.to(device)], more_indices[order], sorted(batch.failed + lost)
