"""The image checks (pactl.audit.checks): each measure by hand, the threshold rule by hand, and
planted dark, bright, blurry, blank, grayscale, odd-size, odd-aspect and unreadable images
among ordinary ones, read once by the thumbnails' decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pactl.audit.checks import CHECKS, choose_threshold, entropy, measure, run_checks, sharpness
from pactl.audit.thumbnails import read_pictures


def test_sharpness_is_the_laplacians_spread_over_the_grey_spread_by_hand() -> None:
    grey = np.zeros((8, 8))
    grey[1, 1] = 100.0
    # the 36 interior Laplacians: (1,1) -400, (1,2) and (2,1) 100, the rest 0: variance
    # (400² + 2 x 100²) / 36 - (-200 / 36)²; the grey levels: one 100 among 64
    laplacian = (400**2 + 2 * 100**2) / 36 - (200 / 36) ** 2
    levels = 100**2 / 64 - (100 / 64) ** 2
    assert sharpness(grey) == pytest.approx(np.sqrt(laplacian / levels), rel=1e-12)
    assert np.isnan(sharpness(np.full((8, 8), 7.0)))  # blank: nothing to judge
    assert np.isnan(sharpness(grey[:7]))  # too few pixels to judge


def test_entropy_brightness_colour_and_size_by_hand() -> None:
    from PIL import Image

    halves = np.zeros((10, 10))
    halves[:, 5:] = 255
    assert entropy(halves) == pytest.approx(1.0)
    assert entropy(np.repeat([[0, 1, 2, 3]], 4, axis=0)) == pytest.approx(2.0)
    assert entropy(np.full((3, 3), 9.0)) == 0.0
    pixels = np.zeros((300, 200, 3), dtype=np.uint8)
    pixels[..., 0] = 200  # red 200, green and blue 0: luma 0.299 x 200, colour 200 / 255
    got = measure(Image.fromarray(pixels), (2000, 3000))
    width, height, top, bottom, _, bits, colour = got.tolist()
    assert (width, height) == (2000, 3000)  # the file's size, not the decoded one
    assert top == pytest.approx(round(0.299 * 200) / 255, abs=1e-6) == pytest.approx(bottom)
    assert bits == 0.0 and colour == pytest.approx(200 / 255)


def test_the_threshold_is_the_stricter_of_the_sets_outliers_and_the_bound_by_hand() -> None:
    odd_aspect = next(c for c in CHECKS if c.name == "odd_aspect")
    low_info = next(c for c in CHECKS if c.name == "low_information")
    values = np.array([1.0, 2.0, 3.0, 4.0, 100.0, np.nan])
    # median 3, absolute deviations 2, 1, 0, 1, 97: MAD 1; 3 - 3 x 1.4826 = -1.4478, below the
    # bound 3 bits: the set's own rule is the stricter
    assert choose_threshold(low_info, values).value == pytest.approx(3 - 3 * 1.4826)
    same = np.full(50, 1.5)  # every image 3:2: the least spread keeps 1.6:1 ordinary
    got = choose_threshold(odd_aspect, same)
    assert got.value == pytest.approx(max(np.exp(np.log(1.5 + 1e-3) + 3 * 0.05) - 1e-3, 2.0))
    assert "bound" in got.how


def photo(rng: np.random.Generator, size: tuple[int, int] = (120, 90)) -> Any:
    """A seeded picture with a photo's mix: smooth colour regions, sharp-edged shapes and grain."""
    from PIL import Image, ImageDraw

    image = Image.fromarray(rng.integers(0, 256, (5, 6, 3)).astype(np.uint8)).resize(
        size, Image.Resampling.BICUBIC
    )
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x, y = rng.integers(0, size[0]), rng.integers(0, size[1])
        w, h = rng.integers(8, 40, size=2)
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        draw.rectangle([int(x), int(y), int(x + w), int(y + h)], fill=fill)
    grain = rng.normal(0, 6, (size[1], size[0], 3))
    return Image.fromarray(np.clip(np.asarray(image) + grain, 0, 255).astype(np.uint8))


def planted_images(folder: Path, n: int = 60) -> tuple[list[str], dict[str, str]]:
    """n ordinary pictures, then one of each planted issue: (paths, planted path -> check)."""
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(7)
    paths = []
    for i in range(n):
        path = folder / f"{i}.jpg"
        photo(rng).save(path, quality=90)
        paths.append(str(path))
    base = np.asarray(photo(rng), dtype=np.float64)
    planted = {
        "dark.jpg": ("dark", Image.fromarray((base * 0.12).astype(np.uint8))),
        "bright.jpg": ("bright", Image.fromarray((base * 0.2 + 204).astype(np.uint8))),
        "blurry.jpg": ("blurry", photo(rng).filter(ImageFilter.GaussianBlur(3))),
        "blank.png": ("low_information", Image.new("RGB", (120, 90), (128, 128, 128))),
        "grey.jpg": ("grayscale", photo(rng).convert("L")),
        "strip.jpg": ("odd_aspect", photo(rng, (360, 60))),
        "tiny.png": ("odd_size", photo(rng, (20, 15))),
    }
    meant = {}
    for name, (check, image) in planted.items():
        image.save(folder / name, quality=90) if name.endswith(".jpg") else image.save(
            folder / name
        )
        paths.append(str(folder / name))
        meant[str(folder / name)] = check
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    paths.append(str(folder / "broken.jpg"))
    meant[str(folder / "broken.jpg")] = "unreadable"
    return paths, meant


def test_each_planted_image_is_flagged_with_its_reason_and_few_ordinary_ones(
    tmp_path: Path,
) -> None:
    paths, meant = planted_images(tmp_path)
    pictures = read_pictures(paths)
    checks = run_checks(pictures.measures, pictures.read, pictures.reasons)
    for path, check in meant.items():
        row = paths.index(path)
        assert checks.flagged[check][row], (path, checks.reason(check, row), checks.thresholds)
        assert checks.reason(check, row).startswith(f"{check}:")
    assert "truncated" in checks.reason("unreadable", paths.index(str(tmp_path / "broken.jpg")))
    ordinary = np.zeros(len(paths), dtype=bool)
    ordinary[:60] = True
    wrongly = sum(int(flags[ordinary].sum()) for flags in checks.flagged.values())
    assert wrongly <= 2, {
        k: np.flatnonzero(v[ordinary]).tolist() for k, v in checks.flagged.items()
    }
    dark = checks.ranked("dark")
    assert paths[dark[0]].endswith("dark.jpg")


def test_a_dim_set_flags_its_dark_image_and_not_its_dimmest_ordinary_one() -> None:
    """In a set of dim pictures one dimmer still is odd for the set but not dark (its brightest
    pixels are not dim): the bound keeps it; one near black is flagged."""
    from PIL import Image

    rng = np.random.default_rng(1)
    shades = [0.6] * 28 + [0.45, 0.1]
    measures = np.stack(
        [
            measure(Image.fromarray((np.asarray(photo(rng), float) * s).astype(np.uint8)))
            for s in shades
        ]
    )
    checks = run_checks(measures, np.ones(30, dtype=bool), [""] * 30)
    odd = choose_threshold(next(c for c in CHECKS if c.name == "dark"), measures[:, 2])
    assert measures[28, 2] < float(odd.how.split("= ")[1].split(" ")[0])
    assert np.flatnonzero(checks.flagged["dark"]).tolist() == [29]
