"""Data loaders over image files, and JPEG decoding on the GPU (nvJPEG) for them."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pactl.config import ModelConfig


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
    from pactl.images import ImageDataset, build_transform, collate

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
    nvJPEG call and resized there, with the test transform's steps (pactl.images._test_steps).
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
