"""pactl.transforms: the test transform and the augmentations, on pictures made here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import MEAN, STD, normalised
from PIL import Image

from pactl.transforms import build_transform


@pytest.mark.parametrize(
    ("train", "augment"), [(False, "rrc_flip"), (True, "rrc_flip"), (True, "none")]
)
def test_transform_constant_image(train: bool, augment: str) -> None:
    rgb = (200, 100, 50)
    t = build_transform(32, 36, MEAN, STD, train=train, augment=augment)
    torch.manual_seed(0)
    x = t(Image.new("RGB", (60, 40), rgb))
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    expected = normalised(rgb)
    for c in range(3):
        assert np.allclose(x[c].numpy(), expected[c], atol=1e-5)


def test_test_transform_crops_or_squashes() -> None:
    img = Image.new("RGB", (80, 40), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 20, 40))  # left quarter red
    red = normalised((255, 0, 0))[0]
    # Equal sizes: the whole picture squashed to a square keeps its red left quarter.
    squash = build_transform(32, 32, MEAN, STD, train=False)(img)
    assert squash.shape == (3, 32, 32)
    assert np.isclose(squash[0, 16, 2].item(), red, atol=1e-3)
    # Resize(36) -> 72x36, centre crop 32 spans x in [20, 52): the red quarter [0, 18) is gone.
    crop = build_transform(32, 36, MEAN, STD, train=False)(img)
    assert crop.shape == (3, 32, 32)
    assert crop[0].max().item() < red - 1


def test_train_transform_reproducible_from_torch_seed() -> None:
    rng = np.random.default_rng(1)
    img = Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    t = build_transform(32, 36, MEAN, STD, train=True, augment="rrc_flip")
    torch.manual_seed(7)
    a = t(img)
    torch.manual_seed(7)
    b = t(img)
    torch.manual_seed(8)
    c = t(img)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_light_transform() -> None:
    rgb = (30, 60, 90)
    t = build_transform(32, 32, (0.5,) * 3, (0.5,) * 3, train=True, augment="light")
    torch.manual_seed(0)
    outs = [t(Image.new("RGB", (20, 24), rgb)) for _ in range(8)]
    expected = (np.array(rgb) / 255.0 - 0.5) / 0.5
    for x in outs:
        assert x.shape == (3, 32, 32)
        # A <= 10% shift and >= 0.9 scale never move the centre off the picture.
        assert np.allclose(x[:, 16, 16].numpy(), expected, atol=1e-5)
    assert any(not torch.equal(outs[0], x) for x in outs[1:])  # it does jitter
    names = [type(step).__name__ for step in t.transforms]  # type: ignore[attr-defined]
    assert "RandomHorizontalFlip" not in names and "RandomAffine" in names


def test_flip_transform_keeps_the_whole_image_mirrored_or_not() -> None:
    img = Image.new("RGB", (40, 20), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 10, 20))  # left quarter red
    red = normalised((255, 0, 0))[0]
    t = build_transform(16, 16, MEAN, STD, train=True, augment="flip")
    torch.manual_seed(0)
    seen = set()
    for _ in range(16):
        x = t(img)
        assert x.shape == (3, 16, 16)
        left, right = x[0, 8, 1].item(), x[0, 8, 14].item()
        assert np.isclose(left, red, atol=1e-3) != np.isclose(right, red, atol=1e-3)
        seen.add("left" if np.isclose(left, red, atol=1e-3) else "right")
        assert x[0, :, 4:12].max().item() < red - 1  # nothing cropped or moved: the middle blue
    assert seen == {"left", "right"}
    # with a test resize above the crop, the view is the test transform's centre crop
    test = build_transform(16, 20, MEAN, STD, train=False)(img)
    crop = build_transform(16, 20, MEAN, STD, train=True, augment="flip")
    views = [crop(img) for _ in range(8)]
    assert all(torch.equal(v, test) or torch.equal(v, torch.flip(test, dims=[2])) for v in views)


def test_crop_scale_bounds_the_random_crop() -> None:
    """Red rises left to right and green top to bottom, so a crop's share of the picture's area
    reads off its output as (red range) x (green range). At crop_scale 1.0 every crop is the
    whole picture (a square cannot take another aspect ratio at full area); at s, no crop
    covers less than s (less the resize's blur at the edges); 0.08 makes crops below 0.5."""
    ramp = np.arange(64, dtype=np.uint8) * 4
    red, green = np.tile(ramp, (64, 1)), np.tile(ramp[:, None], (1, 64))
    img = Image.fromarray(np.stack([red, green, np.zeros_like(red)], axis=-1))
    plain = dict(mean=(0.0,) * 3, std=(1.0,) * 3)
    whole = build_transform(32, 32, train=False, **plain)(img)

    def area(x: torch.Tensor) -> float:
        return float((x[0].max() - x[0].min()) * (x[1].max() - x[1].min()) / 252**2 * 255**2)

    torch.manual_seed(3)
    full = build_transform(32, 32, train=True, augment="rrc_flip", crop_scale=1.0, **plain)
    for _ in range(8):
        x = full(img)
        assert torch.allclose(x, whole, atol=1e-5) or torch.allclose(
            x, torch.flip(whole, dims=[2]), atol=1e-5
        )
    for scale in (0.5, 0.08):
        t = build_transform(32, 32, train=True, augment="rrc_flip", crop_scale=scale, **plain)
        areas = [area(t(img)) for _ in range(200)]
        assert min(areas) > 0.85 * scale
        if scale < 0.5:
            assert min(areas) < 0.5


def test_unknown_augment_lists_choices() -> None:
    with pytest.raises(KeyError, match="rrc_flip"):
        build_transform(32, 32, MEAN, STD, train=True, augment="mixup")
