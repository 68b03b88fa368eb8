"""pactl.loaders: the Dataset and collate (failures dropped, picklable, seeded workers)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import MEAN, STD, normalised
from PIL import Image

from pactl.loaders import Batch, ImageDataset, collate
from pactl.transforms import build_transform


def make_files(tmp_path: Path) -> list[Path]:
    good_a, broken, good_b = tmp_path / "a.png", tmp_path / "b.jpg", tmp_path / "c d.png"
    Image.new("RGB", (20, 20), (255, 0, 0)).save(good_a)
    broken.write_text("garbage")
    Image.new("L", (30, 10), 0).save(good_b)
    return [good_a, broken, good_b, tmp_path / "missing.png"]


def test_dataset_and_collate_drop_failures(tmp_path: Path) -> None:
    files = make_files(tmp_path)
    t = build_transform(16, 16, MEAN, STD, train=False)
    ds = ImageDataset(files, np.array([5, 6, 7, 8]), t, target_size=16)
    assert len(ds) == 4
    image, label, index, reason = ds[1]
    assert image is None and label == 6 and index == 1 and "not an image" in reason
    assert ds[0][3] == ""

    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate)
    (batch,) = list(loader)
    assert isinstance(batch, Batch) and len(batch) == 2
    assert batch.images.shape == (2, 3, 16, 16)
    assert batch.labels.tolist() == [5, 7] and batch.labels.dtype == torch.int64
    assert batch.indices.tolist() == [0, 2] and batch.indices.dtype == torch.int64
    assert [i for i, _ in batch.failed] == [1, 3]
    assert "not found" in batch.failed[1][1]
    assert np.allclose(batch.images[0, 0].numpy(), normalised((255, 0, 0))[0], atol=1e-5)
    assert np.allclose(batch.images[1, 1].numpy(), normalised((0, 0, 0))[1], atol=1e-5)

    empty = collate([ds[1], ds[3]])
    assert len(empty) == 0 and empty.images.shape[0] == 0 and len(empty.failed) == 2


def test_dataset_unlabelled_and_picklable(tmp_path: Path) -> None:
    files = make_files(tmp_path)
    t = build_transform(16, 20, MEAN, STD, train=False)
    ds = ImageDataset(files, None, t, target_size=None)
    back = pickle.loads(pickle.dumps(ds))
    a, b = ds[2], back[2]
    assert a[1] == b[1] == -1
    assert a[0] is not None and b[0] is not None and torch.equal(a[0], b[0])
    with pytest.raises(ValueError, match="labels"):
        ImageDataset(files, np.zeros(3), t, None)


def test_worker_augmentations_reproducible_from_loader_generator(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    files = []
    for i in range(4):
        files.append(tmp_path / f"n{i}.png")
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(files[-1])
    t = build_transform(16, 16, MEAN, STD, train=True, augment="rrc_flip")
    ds = ImageDataset(files, np.arange(4), t, target_size=None)

    def run(seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        loader = torch.utils.data.DataLoader(
            ds, batch_size=2, num_workers=2, collate_fn=collate, generator=g
        )
        return torch.cat([b.images for b in loader])

    first = run(3)
    assert torch.equal(first, run(3))
    assert not torch.equal(first, run(4))
