"""The image transforms: the test transform (resize, centre crop, normalise) and the training
augmentations (AUGMENTS), picklable for worker processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from PIL import Image
from torchvision import transforms as T

Transform = Callable[[Image.Image], torch.Tensor]


def _tensor_tail(mean: Sequence[float], std: Sequence[float]) -> list[Callable]:
    return [T.ToTensor(), T.Normalize(mean=list(mean), std=list(std))]


def _test_steps(
    image_size: int, resize_size: int, mode: T.InterpolationMode, crop_scale: float = 1.0
) -> list[Callable]:
    if resize_size == image_size:
        return [T.Resize((image_size, image_size), mode, antialias=True)]
    return [T.Resize(resize_size, mode, antialias=True), T.CenterCrop(image_size)]


def _rrc_flip_steps(
    image_size: int, resize_size: int, mode: T.InterpolationMode, crop_scale: float = 0.08
) -> list[Callable]:
    # The official Proxy-Anchor train transform at crop_scale 0.08 (torchvision's default scale
    # and ratio ranges); a larger crop_scale keeps more of each image.
    return [
        T.RandomResizedCrop(
            image_size, scale=(crop_scale, 1.0), interpolation=mode, antialias=True
        ),
        T.RandomHorizontalFlip(),
    ]


def _flip_steps(
    image_size: int, resize_size: int, mode: T.InterpolationMode, crop_scale: float = 1.0
) -> list[Callable]:
    # What the test transform shows, mirrored half the time: all a small image has, where a
    # crop of 8% of it would leave a few pixels.
    return [*_test_steps(image_size, resize_size, mode), T.RandomHorizontalFlip()]


def _light_steps(
    image_size: int, resize_size: int, mode: T.InterpolationMode, crop_scale: float = 1.0
) -> list[Callable]:
    # Small jitter for digits and similar: no flip, since a mirrored 2 or 7 is not a 2 or 7.
    return [
        T.Resize((image_size, image_size), mode, antialias=True),
        T.RandomAffine(degrees=10.0, translate=(0.1, 0.1), scale=(0.9, 1.1)),
    ]


AUGMENTS: dict[str, Callable[[int, int, T.InterpolationMode, float], list[Callable]]] = {
    "rrc_flip": _rrc_flip_steps,
    "flip": _flip_steps,
    "light": _light_steps,
    "none": _test_steps,
}


def build_transform(
    image_size: int,
    resize_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    train: bool,
    augment: str = "rrc_flip",
    interpolation: str = "bilinear",
    crop_scale: float = 0.08,
) -> Transform:
    """PIL RGB image -> normalised (3, image_size, image_size) float tensor.

    Test: Resize(resize_size) then CenterCrop(image_size), or a straight square resize when the
    two sizes are equal. Train: the steps named by `augment` (a key of AUGMENTS); rrc_flip's
    crops keep from `crop_scale` of the image's area to all of it. Resizes use
    `interpolation` (bilinear | bicubic | nearest | ...), the filter the weights were tuned with.
    """
    if augment not in AUGMENTS:
        raise KeyError(f"unknown augment {augment!r}; choices: {', '.join(AUGMENTS)}")
    try:
        mode = T.InterpolationMode(interpolation)
    except ValueError:
        choices = ", ".join(m.value for m in T.InterpolationMode)
        raise KeyError(f"unknown interpolation {interpolation!r}; choices: {choices}") from None
    if train:
        steps = AUGMENTS[augment](image_size, resize_size, mode, crop_scale)
    else:
        steps = _test_steps(image_size, resize_size, mode)
    return T.Compose([*steps, *_tensor_tail(mean, std)])
