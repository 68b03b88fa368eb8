"""Data loaders over image files, and JPEG decoding on the GPU (nvJPEG) for them."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pactl.config import ModelConfig
from pactl.images import DEFAULT_MAX_PIXELS, ImageError, jpeg_bytes, load_image
from pactl.transforms import Transform


def loader_for(
    files: Sequence[Path],
    labels: np.ndarray | None,
    model_config: ModelConfig,
    batch_size: int,
    workers: int,
    device: torch.device,
    train: bool = False,
    augment: str = "none",
    crop_scale: float = 0.08,
    sampler: torch.utils.data.Sampler[int] | None = None,
    generator: torch.Generator | None = None,
    draft: bool = True,
    raw_jpeg: bool = False,
) -> torch.utils.data.DataLoader:
    """`raw_jpeg`: JPEGs come as their bytes in each Batch's `raw`, for a GpuJpegDecoder."""
    pass
    from pactl.transforms import build_transform

    assert model_config.mean is not None and model_config.std is not None
    resize = model_config.resize_size or model_config.image_size
    transform = build_transform(
        model_config.image_size,
        resize,
        model_config.mean,
        model_config.std,
        train=train,
        augment=augment,
        interpolation=model_config.interpolation or "bilinear",
        crop_scale=crop_scale,
    )
    # Training and evaluation decode in full (as the official loader does): JPEG draft mode
    # scales in the DCT, which changes pixels; embedding large collections may take the speed.
    target = max(resize, model_config.image_size) if draft and not train else None
    dataset = ImageDataset(files, labels, transform, target_size=target, raw_jpeg=raw_jpeg)
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


def gpu_decoding(device: torch.device, asked: bool) -> bool:
    """JPEGs decode on the GPU (nvJPEG) only when asked for (`--gpu-decode`) on a CUDA device."""
    return asked and device.type == "cuda"


class GpuJpegDecoder:
    """A batch's JPEG bytes -> normalised (k, 3, S, S) float tensors on `device`, decoded in one
    nvJPEG call and resized there, with the test transform's steps (pactl.transforms).
    A file the batched call cannot decode is tried alone, and then by PIL on the CPU
    (`dataset.decoded`), so a failure's reason is PIL's, as without GPU decoding."""

    def __init__(self, dataset: Any, model_config: ModelConfig, device: torch.device) -> None:
        from torchvision.transforms import InterpolationMode

        assert model_config.mean is not None and model_config.std is not None
        self.dataset = dataset
        self.device = device
        self.size = model_config.image_size
        self.resize = model_config.resize_size or model_config.image_size
        self.mode = InterpolationMode(model_config.interpolation or "bilinear")
        self.mean = torch.tensor(model_config.mean, device=device).view(3, 1, 1)
        self.std = torch.tensor(model_config.std, device=device).view(3, 1, 1)

    def __call__(
        self, raw: Sequence[tuple[int, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, str]]]:
        """(images on the device, their dataset indices, (index, reason) of those that failed)."""
        decoded = self._decode([data for _, data in raw])
        images, indices, failed = [], [], []
        for (i, _), image in zip(raw, decoded, strict=True):
            if image is not None:
                images.append(self._transform(image))
            else:  # the PIL path, on the CPU
                sample = self.dataset.decoded(i)
                if sample[0] is None:
                    failed.append((i, sample[3]))
                    continue
                images.append(sample[0].to(self.device))
            indices.append(i)
        size = (0, 3, self.size, self.size)
        stacked = torch.stack(images) if images else torch.empty(size, device=self.device)
        return stacked, torch.tensor(indices, dtype=torch.int64), failed

    def _decode(self, datas: list[torch.Tensor]) -> list[torch.Tensor | None]:
        from torchvision.io import ImageReadMode, decode_jpeg

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchvision.io's note
            try:
                return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=self.device))
            except Exception:  # one bad file fails the batch: each alone, then PIL for those
                pass
            out: list[torch.Tensor | None] = []
            for data in datas:
                try:
                    out.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device))
                except Exception:
                    out.append(None)
            return out

    def _transform(self, image: torch.Tensor) -> torch.Tensor:
        """(3, H, W) uint8 -> (3, S, S) normalised float, as pactl.images' test transform."""
        from torchvision.transforms import functional as TF

        if self.resize == self.size:
            image = TF.resize(image, [self.size, self.size], self.mode, antialias=True)
        else:
            image = TF.resize(image, [self.resize], self.mode, antialias=True)
            image = TF.center_crop(image, [self.size, self.size])
        return (image.float() / 255.0 - self.mean) / self.std


Sample = tuple[torch.Tensor | None, int, int, str]


class ImageDataset(torch.utils.data.Dataset):
    """Files (+ labels) -> (image or None, label or -1, index, failure reason or "")."""

    def __init__(
        self,
        files: Sequence[Path | str],
        labels: np.ndarray | None,
        transform: Transform,
        target_size: int | None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        raw_jpeg: bool = False,
    ) -> None:
        """`raw_jpeg`: a JPEG (within `max_pixels`) comes back as its bytes, a 1-D uint8
        tensor, for a decoder on the GPU; other images are decoded here as usual."""
        if labels is not None and len(labels) != len(files):
            raise ValueError(f"{len(files)} files but {len(labels)} labels")
        # Plain strings pickle small and fast when the dataset is sent to worker processes.
        self.files = [str(f) for f in files]
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.transform = transform
        self.target_size = target_size
        self.max_pixels = max_pixels
        self.raw_jpeg = raw_jpeg

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Sample:
        if self.raw_jpeg:
            label = -1 if self.labels is None else int(self.labels[i])
            try:
                data = jpeg_bytes(self.files[i], self.max_pixels)
            except ImageError as e:
                return None, label, i, str(e)
            if data is not None:
                return torch.frombuffer(bytearray(data), dtype=torch.uint8), label, i, ""
        return self.decoded(i)

    def decoded(self, i: int) -> Sample:
        """Sample i decoded by PIL and transformed (or the reason it failed)."""
        label = -1 if self.labels is None else int(self.labels[i])
        try:
            img = load_image(Path(self.files[i]), self.target_size, self.max_pixels)
        except ImageError as e:
            return None, label, i, str(e)
        return self.transform(img), label, i, ""


@dataclass
class Batch:
    images: torch.Tensor  # (B, 3, H, W) float
    labels: torch.Tensor  # (B,) int64, -1 where unlabelled
    indices: torch.Tensor  # (B,) int64 positions in the dataset
    failed: list[tuple[int, str]] = field(default_factory=list)  # (index, reason) dropped
    raw: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (index, JPEG bytes)

    def __len__(self) -> int:
        return int(self.indices.numel())

    def pin_memory(self) -> Batch:
        # DataLoader(pin_memory=True) calls this on custom batch types.
        return Batch(
            self.images.pin_memory(),
            self.labels.pin_memory(),
            self.indices.pin_memory(),
            self.failed,
            self.raw,
        )


def _is_raw(sample: Sample) -> bool:
    return sample[0] is not None and sample[0].dim() == 1  # JPEG bytes (raw_jpeg datasets)


def collate(samples: list[Sample]) -> Batch:
    """Stack the decoded samples; record the failed ones instead of raising. JPEG bytes from a
    `raw_jpeg` dataset go to `raw`, in order, for the caller to decode."""
    raw = [(s[2], s[0]) for s in samples if _is_raw(s) and s[0] is not None]
    samples = [s for s in samples if not _is_raw(s)]
    good = [s for s in samples if s[0] is not None]
    failed = [(s[2], s[3]) for s in samples if s[0] is None]
    if good:
        images = torch.stack([s[0] for s in good if s[0] is not None])
    else:
        images = torch.empty((0, 3, 0, 0))
    labels = torch.tensor([s[1] for s in good], dtype=torch.int64)
    indices = torch.tensor([s[2] for s in good], dtype=torch.int64)
    return Batch(images, labels, indices, failed, raw)
