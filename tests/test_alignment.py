"""Aligning a copy on its original (pactl.audit.alignment): the residual against brute force, and
the likeness of copies, shifted grey levels and distinct pictures by hand."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from pactl.audit.alignment import WORK, least_rms, likeness, working
from pactl.audit.thumbnails import WHOLE


def picture(seed: int, side: int = 32, low: int = 30, high: int = 200) -> Any:
    """A seeded smooth grey picture of side x side, values in [low, high]."""
    from PIL import Image

    small = np.random.default_rng(seed).integers(low, high + 1, size=(5, 5)).astype(np.uint8)
    return Image.fromarray(small).resize((side, side), Image.Resampling.BICUBIC)


def test_least_rms_is_the_best_placement_by_brute_force() -> None:
    """Against float64 root-mean-square differences at every placement, looped by hand."""
    rng = np.random.default_rng(0)
    image, template = rng.uniform(0, 255, (12, 15)), rng.uniform(0, 255, (7, 9))
    image[3:10, 4:13] = template + rng.normal(0, 2, template.shape)  # one placement is close
    want = min(
        np.sqrt(np.mean((image[y : y + 7, x : x + 9] - template) ** 2))
        for y in range(12 - 7 + 1)
        for x in range(15 - 9 + 1)
    )
    assert least_rms(image.astype(np.float32), template.astype(np.float32)) == pytest.approx(
        want, rel=1e-5
    )


def sliding_placement(image: np.ndarray, template: np.ndarray) -> tuple[float, int, int]:
    """The reference: every placement's float64 squared error by hand, the first least."""
    h, w = template.shape
    errors = np.array(
        [
            [
                np.sum((image[y : y + h, x : x + w] - template) ** 2)
                for x in range(image.shape[1] - w + 1)
            ]
            for y in range(image.shape[0] - h + 1)
        ]
    )
    y, x = np.unravel_index(int(np.argmin(errors)), errors.shape)
    return float(np.sqrt(errors[y, x] / (h * w))), int(y), int(x)


@pytest.mark.parametrize(
    ("image_shape", "template_shape"),
    [((48, 64), (40, 52)), ((48, 64), (48, 64)), ((20, 9), (1, 9)), ((30, 31), (12, 5))],
)
def test_scene_places_a_template_where_the_brute_force_does(
    image_shape: tuple[int, int], template_shape: tuple[int, int]
) -> None:
    """The integral-and-FFT placement (Scene) against every placement's error by hand: the same
    position and RMS (to 1e-9 grey levels) for a template cut from the image plus noise, and
    for an unrelated one; a Scene reused for two templates answers each as a fresh one would."""
    from pactl.audit.alignment import Scene, best_placement

    rng = np.random.default_rng(sum(image_shape) + sum(template_shape))
    image = rng.uniform(0, 255, image_shape)
    h, w = template_shape
    y0, x0 = image_shape[0] - h, image_shape[1] - w  # the last placement: no wrap-around
    cut = image[y0 : y0 + h, x0 : x0 + w] + rng.normal(0, 3, template_shape)
    other = rng.uniform(0, 255, template_shape)
    scene = Scene.of(image)
    for template in (cut, other):
        want = sliding_placement(image, template)
        got = scene.place(template)
        assert got[1:] == want[1:] and got[0] == pytest.approx(want[0], abs=1e-9)
        assert best_placement(image.astype(np.float32), template) == pytest.approx(got, abs=1e-4)
    assert scene.place(cut)[1:] == (y0, x0)


def test_the_same_picture_has_likeness_one() -> None:
    image = picture(1)
    assert likeness(image, image.copy(), WHOLE) == 1.0


def test_a_grey_shift_costs_its_size_by_hand() -> None:
    """Flat grey 100 against flat grey 120: every placement differs by 20, so likeness is
    1 - 20/255. A smooth picture shifted 20 levels up (no clipping): placing it at the same
    box costs 20, so the best placement costs at most that (a slightly moved one can trade
    some shift for slope), and the shift is still seen (more than 15)."""
    from PIL import Image

    flat, lighter = Image.new("L", (32, 32), 100), Image.new("L", (32, 32), 120)
    assert likeness(flat, lighter, WHOLE) == pytest.approx(1 - 20 / 255, abs=1e-6)
    image = picture(2)
    brighter = Image.fromarray((np.asarray(image, dtype=np.int16) + 20).astype(np.uint8))
    assert 1 - 20.5 / 255 <= likeness(image, brighter, WHOLE) < 1 - 15 / 255


def test_a_crop_resized_and_recompressed_is_liked_more_than_another_picture(
    tmp_path: Any,
) -> None:
    """A crop of 24 x 26 of a 32 px picture, resized to 20 x 20 and saved as JPEG (quality 40),
    aligned on the proposed box: within 6 grey levels RMS; a distinct picture of the same
    layout, at its best box and offset, is not."""
    from PIL import Image

    image = picture(3)
    crop = image.crop((5, 2, 29, 28)).resize((20, 20), Image.Resampling.BICUBIC)
    crop.save(tmp_path / "c.jpg", quality=40)
    copy = Image.open(tmp_path / "c.jpg").convert("L")
    box = (5 / 32, 2 / 32, 29 / 32, 28 / 32)
    assert likeness(image, copy, box) > 1 - 6 / 255
    other = picture(4).crop((5, 2, 29, 28)).resize((20, 20), Image.Resampling.BICUBIC)
    assert likeness(image, other, box) < 1 - 15 / 255


def test_the_proposed_box_size_is_searched_around() -> None:
    """The crop is 24 x 26 of 32 px: sides within 10% (4 px) of the proposal's are tried, so a
    proposal off by 2 px each way still finds it exactly, one off by 6 px does not."""
    image = picture(5)
    crop = image.crop((4, 3, 28, 29))
    near = (4 / 32, 3 / 32, 30 / 32, 31 / 32)  # 26 x 28: 2 px off
    far = (0.0, 0.0, 30 / 32, 32 / 32)  # 30 x 32: 6 px off
    assert likeness(image, crop, near) == pytest.approx(1.0, abs=0.5 / 255)
    assert likeness(image, crop, far) < likeness(image, crop, near) - 2 / 255


def test_working_size_caps_the_longer_side_and_keeps_the_aspect() -> None:
    from PIL import Image

    assert working(Image.new("RGB", (256, 128))).size == (WORK, WORK // 2)
    assert working(Image.new("L", (30, 20))).size == (30, 20)


def test_processes_align_the_same_as_one(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seven pairs (a copy, pictures against each other, an unreadable file) in chunks of 2
    across 2 fresh processes: the same likeness as in this process, NaN for the unreadable."""
    from pactl.audit import copies
    from pactl.console import QUIET

    paths = []
    for i in range(4):
        picture(10 + i).save(tmp_path / f"{i}.png")
        paths.append(str(tmp_path / f"{i}.png"))
    picture(10).crop((2, 2, 30, 29)).save(tmp_path / "copy.png")
    (tmp_path / "broken.png").write_bytes(b"not a picture")
    pairs = [
        (paths[0], str(tmp_path / "copy.png"), WHOLE),
        (paths[0], str(tmp_path / "broken.png"), WHOLE),
    ]
    pairs += [(paths[i], paths[j], WHOLE) for i, j in ((0, 1), (1, 2), (2, 3), (3, 0), (1, 3))]
    monkeypatch.setattr(copies, "ALIGN_CHUNK", 2)
    monkeypatch.setattr(copies, "ALIGN_PARALLEL_FROM", 1)
    here = copies.align(pairs, 1, QUIET)
    apart = copies.align(pairs, 2, QUIET)
    assert np.isnan(here[1]) and np.isnan(apart[1])
    assert np.allclose(np.delete(here, 1), np.delete(apart, 1)) and here[0] > 0.97


def heart(colour: tuple[int, int, int], side: int = 48) -> Any:
    """A heart of one colour on white: two discs and a triangle."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (side, side), "white")
    draw = ImageDraw.Draw(image)
    r = side // 4
    draw.ellipse([side // 4 - r, side // 3 - r, side // 4 + r, side // 3 + r], fill=colour)
    draw.ellipse([3 * side // 4 - r, side // 3 - r, 3 * side // 4 + r, side // 3 + r], fill=colour)
    draw.polygon(
        [(0, side // 3 + 2), (side - 1, side // 3 + 2), (side // 2, side - 2)], fill=colour
    )
    return image


def test_shapes_that_differ_only_in_colour_are_not_copies(tmp_path: Any) -> None:
    """A red heart and the same heart in blue, or in a green of the same grey level: their grey
    pictures align (equal for the green one, likeness 1 in grey), their colours do not. A colour
    copy cropped, resized and saved as JPEG still aligns; the colour pairs fall far below it
    (and below any threshold the calibration could take from copies like it)."""
    from PIL import Image

    red, blue = heart((220, 20, 30)), heart((30, 20, 220))
    grey_twin = heart((0, 138, 0))  # grey 0.587 x 138 = 81.0; red's 65.8 + 11.7 + 3.4 = 80.9
    assert (
        np.abs(np.asarray(red.convert("L"), float) - np.asarray(grey_twin.convert("L"))).max() <= 1
    )
    assert likeness(working(red).convert("L"), working(grey_twin).convert("L"), WHOLE) > 0.99
    copy = red.crop((3, 2, 45, 46)).resize((30, 31), Image.Resampling.BICUBIC)
    copy.save(tmp_path / "c.jpg", quality=60)
    copied = likeness(
        working(red), working(Image.open(tmp_path / "c.jpg")), (3 / 48, 2 / 48, 45 / 48, 46 / 48)
    )
    assert copied > 1 - 10 / 255
    for other in (blue, grey_twin):
        assert likeness(working(red), working(other), WHOLE) < 1 - 60 / 255 < copied


def test_thumbnails_decode_each_photo_once_at_draft_size(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three 640 x 480 JPEGs read for their thumbnails (and the image checks, from the same
    decode): each file decoded once, by libjpeg at a quarter of its size (160 x 120, the least
    draft scale that keeps both sides at or above the 64 px base), not in full."""
    from PIL import Image, ImageFile

    from pactl.audit.thumbnails import read_pictures

    paths = []
    for i in range(3):
        picture(20 + i).convert("RGB").resize((640, 480)).save(tmp_path / f"{i}.jpg")
        paths.append(str(tmp_path / f"{i}.jpg"))
    decoded: list[tuple[str, tuple[int, int]]] = []
    load = ImageFile.ImageFile.load

    def counted(self: Image.Image) -> Any:
        decoding = bool(getattr(self, "tile", None))
        name = getattr(getattr(self, "fp", None), "name", "")
        if isinstance(name, int):  # pactl opens images by descriptor (never a FIFO)
            name = os.readlink(f"/proc/self/fd/{name}")
        pixels = load(self)  # type: ignore[arg-type]
        if decoding:
            decoded.append((str(name), self.size))
        return pixels

    monkeypatch.setattr(ImageFile.ImageFile, "load", counted)
    pictures = read_pictures(paths)
    assert pictures.read.all()
    assert sorted(decoded) == [(p, (160, 120)) for p in paths]


def test_sizes_tried_coarse_then_fine_keep_the_exhaustive_likeness(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve crops (80 to 95% of each side) of 64 px pictures, resized and saved as JPEG,
    aligned on the box they were cut from and on the whole image: sizes tried every STEP
    pixels, then around the best, give the likeness every size gives (STEP 1: all of them)
    within 0.005 (docs/benchmarks/audit.md: 4 of 200 planted photo copies moved, by at most
    0.0042), and an uncropped copy's exactly."""
    from PIL import Image

    from pactl.audit import alignment

    rng = np.random.default_rng(7)
    cases = []
    for i in range(12):
        image = picture(40 + i, side=64)
        kw, kh = rng.uniform(0.8, 0.95, size=2)
        w, h = round(64 * kw), round(64 * kh)
        x, y = int(rng.integers(0, 64 - w + 1)), int(rng.integers(0, 64 - h + 1))
        copy = image.crop((x, y, x + w, y + h)).resize((48, 40), Image.Resampling.BICUBIC)
        copy.save(tmp_path / f"{i}.jpg", quality=50)
        copy = Image.open(tmp_path / f"{i}.jpg").convert("L")
        cases.append((image, copy, (x / 64, y / 64, (x + w) / 64, (y + h) / 64)))
        cases.append((image, image.resize((40, 40), Image.Resampling.BICUBIC), WHOLE))
    coarse = [likeness(a, b, box) for a, b, box in cases]
    monkeypatch.setattr(alignment, "STEP", 1)
    every = [likeness(a, b, box) for a, b, box in cases]
    assert np.abs(np.subtract(coarse, every)).max() <= 0.005
    assert coarse[1::2] == every[1::2]
    assert min(every[0::2]) > 0.97  # the crops are copies: there is a best size to find
