"""The real-image bench's own logic, offline: no apt, no pip, no wheel, no training."""

from __future__ import annotations

import gzip
import importlib.util
import math
import struct
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def _load(folder: str, name: str) -> ModuleType:
    """A module of bench/ or tools/, read from the checkout (neither is installed with pactl)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


real_sets = _load("tools", "real_sets")
lite0 = _load("tools", "lite0_weights")
bench_real = _load("bench", "bench_real")


# ---------------------------------------------------------------- lite0 conversion


def test_expected_imagenet_classes_name_what_the_photos_show() -> None:
    pytest.importorskip("timm")
    from timm.data import ImageNetInfo

    info = ImageNetInfo()
    words = {"chelsea": ("cat", "lynx"), "coffee": ("cup", "mug", "espresso"),
             "rocket": ("missile", "shuttle")}  # fmt: skip
    for photo, allowed in words.items():
        for index in lite0.EXPECTED[photo]:
            name = info.index_to_description(index).lower()
            assert any(w in name for w in allowed), (photo, index, name)


def test_judge_flags_a_photo_without_an_expected_class() -> None:
    hit = [(285, "Egyptian cat", 0.5)] + [(i, "x", 0.1) for i in range(4)]
    miss = [(i, "x", 0.2) for i in range(5)]
    good = {"chelsea": hit, "coffee": [(967, "espresso", 0.9)], "rocket": [(657, "m", 0.4)],
            "astronaut": miss}  # fmt: skip
    assert lite0.judge(good) == []  # the astronaut has nothing expected
    assert lite0.judge({**good, "chelsea": miss}) == ["chelsea"]


# ---------------------------------------------------------------- Fashion-MNIST reader


def _idx(array: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    return header + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(">u1").tobytes()


def test_read_idx_reads_plain_and_gzipped_files(tmp_path: Path) -> None:
    images = np.arange(3 * 2 * 4, dtype=np.uint8).reshape(3, 2, 4)
    (tmp_path / "x-idx3-ubyte").write_bytes(_idx(images))
    (tmp_path / "x-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(images)))
    for name in ("x-idx3-ubyte", "x-idx3-ubyte.gz"):
        out = real_sets.read_idx(tmp_path / name)
        assert out.shape == (3, 2, 4) and out.dtype == np.uint8
        np.testing.assert_array_equal(out, images)
    (tmp_path / "short").write_bytes(_idx(images)[:-1])
    with pytest.raises(ValueError, match="header says"):
        real_sets.read_idx(tmp_path / "short")


def _fake_fashion(folder: Path, per_class: tuple[int, int]) -> list[Path]:
    """train and t10k idx files: each image filled with its own row number (mod 256)."""
    files = []
    offset = 0
    for (image_stem, label_stem), count in zip(real_sets.FASHION_FILES, per_class, strict=True):
        labels = np.repeat(np.arange(10, dtype=np.uint8), count)
        images = (np.arange(offset, offset + len(labels)) % 256).astype(np.uint8)
        images = np.broadcast_to(images[:, None, None], (len(labels), 28, 28))
        offset += len(labels)
        for stem, array in ((image_stem, images), (label_stem, labels)):
            path = folder / f"{stem}.gz"
            path.write_bytes(gzip.compress(_idx(np.ascontiguousarray(array))))
            files.append(path)
    return files


def test_fashion_sample_is_seeded_and_its_split_class_disjoint(tmp_path: Path) -> None:
    images, labels = real_sets.load_fashion(_fake_fashion(tmp_path, (3, 2)))
    assert images.shape == (50, 28, 28) and labels.shape == (50,)
    assert images[31, 0, 0] == 31  # t10k rows follow the train rows
    chosen = real_sets.fashion_sample(labels, per_class=4, seed=0)
    assert chosen == real_sets.fashion_sample(labels, per_class=4, seed=0)
    assert len(set(chosen)) == 40 and np.bincount(labels[chosen]).tolist() == [4] * 10
    rows = real_sets.fashion_rows(labels, chosen)
    train = {label for _, label, split, _ in rows if split == "train"}
    test = {label for _, label, split, _ in rows if split == "test"}
    assert train == {0, 1, 2, 3, 4} and test == {5, 6, 7, 8, 9}
    assert {name for _, label, _, name in rows if label == 8} == {"Bag"}
    with pytest.raises(SystemExit):
        real_sets.fashion_sample(labels, per_class=6, seed=0)  # classes hold 5


# ---------------------------------------------------------------- fonts


def test_font_class_split_is_disjoint_halved_and_seeded() -> None:
    classes = [chr(c) for c in range(0x41, 0x41 + 21)]
    split = real_sets.split_classes(classes, seed=0)
    train = {c for c, s in split.items() if s == "train"}
    test = {c for c, s in split.items() if s == "test"}
    assert train.isdisjoint(test) and train | test == set(classes)
    assert len(train) == 10 and len(test) == 11
    assert split == real_sets.split_classes(list(reversed(classes)), seed=0)
    assert split != real_sets.split_classes(classes, seed=1)


def test_lookalikes_keep_the_first_character_only() -> None:
    def pic(value: int) -> Image.Image:
        return Image.new("L", (4, 4), value)

    drawings = {
        "A": {0: pic(10), 1: pic(20), 2: pic(30)},
        "B": {0: pic(40), 1: pic(50), 2: pic(60)},
        "\u0391": {0: pic(10), 1: pic(20), 2: pic(99)},  # Greek Alpha: 2 of 3 fonts as A
        "\u0392": {0: pic(40), 2: pic(98)},  # Greek Beta: 1 of 2 shared fonts as B
    }
    assert real_sets.drop_lookalikes(drawings, list(drawings)) == ["A", "B", "\u0392"]


# ---------------------------------------------------------------- raw pixels


def test_raw_pixel_vector_is_the_normalised_image() -> None:
    pixels = np.zeros((2, 2, 3), dtype=np.uint8)
    pixels[0, 0, 0], pixels[1, 1, 1] = 3, 4
    path = Path("img.png")
    Image.fromarray(pixels).save(path)
    vector = bench_real.raw_pixel_vectors([path], size=2)[0]
    expected = np.zeros(12, dtype=np.float32)
    expected[0], expected[10] = 0.6, 0.8
    np.testing.assert_allclose(vector, expected, atol=1e-7)


def test_raw_pixel_scores_match_a_hand_count(tmp_path: Path) -> None:
    from pactl.datasets.manifest import write_manifest

    # One-pixel images on a quarter circle: cosine similarity falls with the angle between.
    angles = {"a0": ("A", 0), "a10": ("A", 10), "a55": ("A", 55),
              "b30": ("B", 30), "b75": ("B", 75), "b85": ("B", 85)}  # fmt: skip
    rows = []
    for name, (cls, degrees) in angles.items():
        rad = math.radians(degrees)
        rgb = np.array([[[round(200 * math.cos(rad)), round(200 * math.sin(rad)), 0]]])
        Image.fromarray(rgb.astype(np.uint8)).save(tmp_path / f"{name}.png")
        rows.append((f"{name}.png", 0 if cls == "A" else 1, "test", cls))
    # A train image beside each test class's members would change every answer if counted.
    Image.fromarray(np.array([[[200, 0, 0]]], dtype=np.uint8)).save(tmp_path / "t.png")
    rows.append(("t.png", 1, "train", "B"))
    write_manifest(tmp_path / "manifest.csv", rows)
    scores = bench_real.raw_pixel_scores(tmp_path, size=1)
    # Nearest neighbours (R = 2): a0 -> a10, b30; a10 -> a0, b30; a55 -> b75, b30;
    # b30 -> a10, a55; b75 -> b85, a55; b85 -> b75, a55. Hits at rank 1: a0 a10 b75 b85.
    assert scores["recall@1"] == pytest.approx(4 / 6)
    assert scores["map@r"] == pytest.approx((0.5 + 0.5 + 0 + 0 + 0.5 + 0.5) / 6)


# ---------------------------------------------------------------- reading pactl's files


def test_report_metrics_are_read_from_the_right(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text(
        "dataset,checkpoint,recall@1,map@r\nset,timm:x (w.pth weights, no training),0.5,0.25\n"
    )
    assert bench_real.read_report(path) == {"recall@1": 0.5, "map@r": 0.25}


def test_targets_judge_each_comparison() -> None:
    R = bench_real.Result
    results = [
        R("s", "a", "", 0.40),
        R("s", "b", "", 0.60),
        R("s", "c", "epoch 0", 0.10),
        R("s", "c", "last", 0.66),
        R("s", "d", "last", 0.39),
        R("s", "e", "last", 0.70),
        R("s", "f", "", 0.61, seconds=901.0),
        R("s", "f0", "", 0.55),  # the default's start at its own image size
    ]
    lines = bench_real.targets(results, "s", budget=900.0, quick=False)
    assert [line.rsplit(": ", 1)[1] for line in lines] == ["met", "MISSED", "MISSED", "MISSED"]
    assert "pretrained at its size 0.5500" in lines[3]  # over budget: missed all the same
    results[-2] = R("s", "f", "", 0.61, seconds=899.0)
    assert bench_real.targets(results, "s", budget=900.0, quick=False)[3].endswith(": met")
    assert "fine-tuned 0.6600" in lines[0]  # the last epoch, not epoch 0
    quick = bench_real.targets(results[:2], "s", budget=900.0, quick=True)
    assert quick[0].endswith("not measured")
