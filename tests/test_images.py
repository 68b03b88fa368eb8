"""Decoding, transforms, dataset/collate and the M-per-class sampler, on images made here."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import socket
import struct
import threading
import warnings
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pactl.errors import PactlError
from pactl.images import DEFAULT_MAX_PIXELS, ImageError, load_image
from pactl.loaders import Batch, ImageDataset, collate
from pactl.training.samplers import MPerClassSampler
from pactl.transforms import build_transform

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def pixels(img: Image.Image) -> np.ndarray:
    assert img.mode == "RGB"
    return np.asarray(img).astype(np.int64)  # (H, W, 3)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png_claiming(width: int, height: int) -> bytes:
    """A syntactically valid PNG whose header claims width x height, with one tiny IDAT."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    idat = zlib.compress(b"\x00" * 16)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", idat)
        + png_chunk(b"IEND", b"")
    )


# --------------------------------------------------------------------------- failures


def test_zero_byte_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jpg"
    path.touch()
    with pytest.raises(ImageError, match="empty"):
        load_image(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="not found"):
        load_image(tmp_path / "nope.png")
    with pytest.raises(ImageError, match="directory"):
        load_image(tmp_path)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_file(tmp_path: Path, fmt: str) -> None:
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)  # incompressible: data is long
    path = tmp_path / f"cut.{fmt.lower()}"
    Image.fromarray(noise).save(path, fmt)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError) as info:
        load_image(path)
    assert str(info.value).startswith(str(path))
    assert "\n" not in str(info.value)


def test_text_file_named_jpg(tmp_path: Path) -> None:
    path = tmp_path / "notes.jpg"
    path.write_text("this is not a picture\n")
    with pytest.raises(ImageError, match="not an image"):
        load_image(path)


def test_bomb_refused_from_header(tmp_path: Path) -> None:
    # 100000 x 100000 = 1e10 pixels: refused before a single pixel is decoded.
    path = tmp_path / "bomb.png"
    path.write_bytes(png_claiming(100_000, 100_000))
    before = Image.MAX_IMAGE_PIXELS
    with pytest.raises(ImageError, match="pixels"):
        load_image(path)
    assert before == Image.MAX_IMAGE_PIXELS


def test_bomb_limit_is_a_parameter(tmp_path: Path) -> None:
    # 10000 x 10000 = 1e8 pixels is above PIL's warning threshold but below its error one.
    path = tmp_path / "big.png"
    path.write_bytes(png_claiming(10_000, 10_000))
    before = Image.MAX_IMAGE_PIXELS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DecompressionBombWarning may escape
        with pytest.raises(ImageError, match="10000x10000 = 100000000 pixels"):
            load_image(path, max_pixels=50_000_000)
        # Under the default limit it is let through, then fails on its missing pixel data.
        with pytest.raises(ImageError) as info:
            load_image(path)
    assert "limit" not in info.value.reason
    assert before == Image.MAX_IMAGE_PIXELS
    assert DEFAULT_MAX_PIXELS == 2 * 89_478_485

    small = tmp_path / "small.png"
    Image.new("RGB", (100, 100)).save(small)
    with pytest.raises(ImageError, match="limit of 9999"):
        load_image(small, max_pixels=9_999)
    assert load_image(small, max_pixels=10_000).size == (100, 100)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root can read any file"
)
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "secret.png"
    Image.new("RGB", (4, 4)).save(path)
    path.chmod(0)
    try:
        with pytest.raises(ImageError, match="permission denied"):
            load_image(path)
    finally:
        path.chmod(0o644)


def test_permission_error_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Runs as root too: the OS refusal is simulated where load_image opens the file.
    import pactl.images

    def refuse(path: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(pactl.images, "_open_regular", refuse)
    with pytest.raises(ImageError, match="permission denied"):
        load_image(tmp_path / "locked.png")


def _load_with_deadline(path: Path, seconds: float = 10.0) -> object:
    """load_image(path) in a thread: its image or its exception. A call still blocked at the
    deadline fails the test, after a writer opened on the FIFO has set the thread free."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(load_image(path))
        except Exception as e:
            result.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(seconds)
        pytest.fail(f"load_image({path.name}) blocked for {seconds} s")
    return result[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_named_like_an_image_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "x.jpg"
    os.mkfifo(path)
    error = _load_with_deadline(path)
    assert isinstance(error, ImageError) and error.reason == "not a regular file (a FIFO)"
    # Training and embedding skip it like any other broken image.
    transform = build_transform(8, 8, MEAN, STD, train=False)
    image, _, _, reason = ImageDataset([path], None, transform, target_size=8)[0]
    assert image is None and reason.endswith("not a regular file (a FIFO)")


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets here")
def test_socket_and_device_named_like_images_are_refused(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "s.png"))
        error = _load_with_deadline(tmp_path / "s.png")
    assert isinstance(error, ImageError) and error.reason == "not a regular file (a socket)"
    if not os.path.exists("/dev/null"):
        return
    (tmp_path / "null.jpg").symlink_to("/dev/null")
    error = _load_with_deadline(tmp_path / "null.jpg")
    assert isinstance(error, ImageError)
    assert error.reason == "not a regular file (a character device)"


def test_file_name_that_is_not_utf8_is_decoded(tmp_path: Path) -> None:
    name = os.fsencode(tmp_path) + b"/caf\xe9.png"  # Latin-1, as an old camera or share writes
    try:
        with open(name, "wb") as f:
            Image.new("RGB", (3, 2), (10, 20, 30)).save(f, "PNG")
    except OSError as e:
        pytest.skip(f"this filesystem refuses the name ({e})")
    (path,) = tmp_path.iterdir()  # a str with the byte escaped (surrogateescape)
    assert os.fsencode(path) == name
    assert pixels(load_image(path))[0, 0].tolist() == [10, 20, 30]
    (path.parent / (path.stem + "-cut.png")).write_bytes(b"\x89PNG\r\n")
    error = _load_with_deadline(path.parent / (path.stem + "-cut.png"))
    assert isinstance(error, ImageError) and "caf" in str(error)


def test_image_error_is_one_line_and_pickles() -> None:
    err = ImageError(Path("a b/c.jpg"), "file is empty (0 bytes)")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == "a b/c.jpg: file is empty (0 bytes)"
    assert (back.path, back.reason) == ("a b/c.jpg", "file is empty (0 bytes)")
    assert isinstance(back, PactlError)


# --------------------------------------------------------------------------- decoding


def draft_scale(width: int, height: int, target: int) -> int:
    """libjpeg's reduction: the largest of 1/2/4/8 keeping both sides >= target."""
    return max(s for s in (1, 2, 4, 8) if width / s >= target and height / s >= target)


def test_large_jpeg_is_decoded_in_draft_mode(tmp_path: Path) -> None:
    width, height = 4000, 3000
    img = Image.new("RGB", (width, height), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, width // 2, height))  # left half red
    path = tmp_path / "big.jpg"
    img.save(path, quality=90)

    for target in (256, 1000, 3000):
        s = draft_scale(width, height, target)
        out = load_image(path, target_size=target)
        assert out.size == (-(-width // s), -(-height // s))
        assert min(out.size) >= target
    assert load_image(path, target_size=256).size == (500, 375)  # 1/8 scale

    arr = pixels(load_image(path, target_size=256))
    assert np.abs(arr[187, 60] - (255, 0, 0)).max() < 10
    assert np.abs(arr[187, 440] - (0, 0, 255)).max() < 10
    assert load_image(path).size == (width, height)


def test_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "dot.png"
    Image.new("RGB", (1, 1), (12, 34, 56)).save(path)
    out = load_image(path, target_size=224)
    assert out.size == (1, 1)
    assert pixels(out)[0, 0].tolist() == [12, 34, 56]


@pytest.mark.parametrize("mode", ["L", "1"])
def test_grayscale_becomes_rgb(tmp_path: Path, mode: str) -> None:
    value = 77 if mode == "L" else 255
    path = tmp_path / f"gray_{mode}.png"
    Image.new(mode, (5, 3), value if mode == "L" else 1).save(path)
    out = load_image(path)
    assert out.size == (5, 3)
    assert (pixels(out) == value).all()


def test_grayscale_jpeg(tmp_path: Path) -> None:
    path = tmp_path / "gray.jpg"
    Image.new("L", (32, 32), 100).save(path)
    out = pixels(load_image(path, target_size=8))
    assert np.abs(out - 100).max() <= 2


def test_cmyk_jpeg(tmp_path: Path) -> None:
    # CMYK -> RGB by hand: R = (255-C)(255-K)/255, likewise G from M and B from Y.
    patches = {
        (0, 0, 0, 0): (255, 255, 255),
        (0, 0, 0, 255): (0, 0, 0),
        (255, 0, 0, 0): (0, 255, 255),
        (0, 255, 0, 0): (255, 0, 255),
        (0, 0, 255, 0): (255, 255, 0),
    }
    img = Image.new("CMYK", (32 * len(patches), 32))
    for i, cmyk in enumerate(patches):
        img.paste(cmyk, (32 * i, 0, 32 * (i + 1), 32))
    path = tmp_path / "print.jpg"
    img.save(path, quality=95)
    assert Image.open(path).mode == "CMYK"
    out = pixels(load_image(path))
    for i, rgb in enumerate(patches.values()):
        assert np.abs(out[16, 32 * i + 16] - rgb).max() <= 12, (i, out[16, 32 * i + 16])


def test_rgba_composited_onto_white(tmp_path: Path) -> None:
    rgba = np.array(
        [[[0, 0, 0, 0], [255, 0, 0, 255], [255, 0, 0, 128], [0, 0, 255, 64]]], dtype=np.uint8
    )
    path = tmp_path / "alpha.png"
    Image.fromarray(rgba, "RGBA").save(path)
    out = pixels(load_image(path))
    # out = a * colour + (1 - a) * 255, a = alpha / 255
    a = rgba[0, :, 3:4] / 255.0
    expected = a * rgba[0, :, :3] + (1 - a) * 255.0
    assert np.abs(out[0] - expected).max() <= 1
    assert out[0, 0].tolist() == [255, 255, 255]


def test_gray_alpha_composited_onto_white(tmp_path: Path) -> None:
    la = np.array([[[0, 0], [0, 255]]], dtype=np.uint8)
    path = tmp_path / "la.png"
    Image.fromarray(la, "LA").save(path)
    assert pixels(load_image(path))[0].tolist() == [[255, 255, 255], [0, 0, 0]]


def test_palette_transparency_becomes_white(tmp_path: Path) -> None:
    img = Image.new("P", (3, 1))
    img.putpalette([255, 0, 0, 0, 0, 255, 0, 255, 0] + [0] * (768 - 9))
    img.putdata([0, 1, 2])
    path = tmp_path / "pal.png"
    img.save(path, transparency=1)  # palette entry 1 (blue) is transparent
    out = pixels(load_image(path))
    assert out[0].tolist() == [[255, 0, 0], [255, 255, 255], [0, 255, 0]]


def test_rgb_transparent_colour_becomes_white(tmp_path: Path) -> None:
    img = Image.new("RGB", (2, 1), (10, 20, 30))
    img.putpixel((1, 0), (0, 255, 0))
    path = tmp_path / "trns.png"
    img.save(path, transparency=(0, 255, 0))  # tRNS chunk: pure green is transparent
    assert pixels(load_image(path))[0].tolist() == [[10, 20, 30], [255, 255, 255]]


def test_sixteen_bit_png_is_scaled(tmp_path: Path) -> None:
    values = np.array([[0, 257 * 100, 32768, 65535]], dtype=np.uint16)
    path = tmp_path / "deep.png"
    Image.fromarray(values).save(path)
    data = path.read_bytes()
    assert data[24] == 16  # IHDR bit depth: the file really holds 16-bit samples
    out = pixels(load_image(path))
    expected = np.rint(values[0].astype(np.float64) * 255.0 / 65535.0)  # 0, 100, 128, 255
    assert expected.tolist() == [0, 100, 128, 255]
    assert (out[0] == expected[:, None]).all()


def test_int32_mode_treated_as_sixteen_bit(tmp_path: Path) -> None:
    values = np.array([[-5, 32768, 65535, 70000]], dtype=np.int32)
    path = tmp_path / "wide.tif"
    Image.fromarray(values, "I").save(path)
    assert Image.open(path).mode == "I"
    out = pixels(load_image(path))
    assert out[0, :, 0].tolist() == [0, 128, 255, 255]


@pytest.mark.parametrize(
    ("orientation", "size", "corner"),
    [
        (1, (40, 20), "top-left"),
        (3, (40, 20), "bottom-right"),
        (6, (20, 40), "top-right"),  # display = stored turned 90 degrees clockwise
        (8, (20, 40), "bottom-left"),
    ],
)
def test_exif_orientation(
    tmp_path: Path, orientation: int, size: tuple[int, int], corner: str
) -> None:
    stored = Image.new("RGB", (40, 20), (128, 128, 128))
    stored.paste((255, 0, 0), (0, 0, 8, 8))  # stored top-left corner marked red
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / f"rot{orientation}.jpg"
    stored.save(path, exif=exif.tobytes(), quality=95)

    out = load_image(path)
    assert out.size == size
    w, h = size
    where = {
        "top-left": (3, 3),
        "top-right": (w - 4, 3),
        "bottom-left": (3, h - 4),
        "bottom-right": (w - 4, h - 4),
    }
    arr = pixels(out)
    for name, (x, y) in where.items():
        is_red = np.abs(arr[y, x] - (255, 0, 0)).max() < 40
        assert is_red == (name == corner), (name, arr[y, x])


@pytest.mark.parametrize("fmt", ["GIF", "WEBP"])
def test_animated_first_frame(tmp_path: Path, fmt: str) -> None:
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 0, 255), (0, 255, 0))]
    path = tmp_path / f"anim.{fmt.lower()}"
    extra = {"lossless": True} if fmt == "WEBP" else {}
    frames[0].save(path, fmt, save_all=True, append_images=frames[1:], duration=50, **extra)
    assert getattr(Image.open(path), "n_frames", 1) == 3
    out = pixels(load_image(path))
    assert out.shape == (8, 8, 3)
    assert np.abs(out - (255, 0, 0)).max() <= 2


def test_paths_with_spaces_and_non_ascii(tmp_path: Path) -> None:
    folder = tmp_path / "my pictures ü"
    folder.mkdir()
    path = folder / "chat noir 猫 é.jpg"
    Image.new("RGB", (10, 6), (0, 200, 0)).save(path)
    out = load_image(path)
    assert out.size == (10, 6)
    assert np.abs(pixels(out) - (0, 200, 0)).max() <= 3
    with pytest.raises(ImageError) as info:
        load_image(folder / "manqué ü.png")
    assert "manqué ü.png" in str(info.value)


# --------------------------------------------------------------------------- transforms


def normalised(rgb: tuple[int, int, int]) -> np.ndarray:
    return (np.array(rgb, dtype=np.float64) / 255.0 - np.array(MEAN)) / np.array(STD)


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


# --------------------------------------------------------------------------- dataset


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


# --------------------------------------------------------------------------- sampler


def sampler_labels() -> np.ndarray:
    # 10 classes of sizes 2..11 (class 0 has fewer than m=4 images), shuffled order.
    labels = np.concatenate([np.full(c + 2, c) for c in range(10)])
    return np.random.default_rng(0).permutation(labels)


def test_m_per_class_batches() -> None:
    labels = sampler_labels()  # 65 images
    m, batch_size = 4, 12
    sampler = MPerClassSampler(labels, m, batch_size, torch.Generator().manual_seed(0))
    indices = list(sampler)
    assert len(sampler) == len(indices) == (65 // 12) * 12
    seen: Counter[int] = Counter()
    for start in range(0, len(indices), batch_size):
        chunk = indices[start : start + batch_size]
        per_class = Counter(int(labels[i]) for i in chunk)
        assert len(per_class) == batch_size // m
        assert set(per_class.values()) == {m}
        for c in per_class:
            members = [i for i in chunk if labels[i] == c]
            if (labels == c).sum() >= m:
                assert len(set(members)) == m  # no repeats when the class is big enough
        seen.update(per_class)

    long = MPerClassSampler(labels, m, batch_size, np.random.default_rng(0), length=1200)
    assert len(long) == 1200
    counts = Counter(int(labels[i]) for i in long)
    assert set(counts) == set(range(10))
    assert min(counts.values()) >= 0.6 * max(counts.values())  # classes seen about equally
    small = [i for i in long if labels[i] == 0]
    assert set(small) == set(np.flatnonzero(labels == 0).tolist())  # with replacement


def test_m_per_class_reproducible() -> None:
    labels = sampler_labels()

    def order(seed: int, epoch: int) -> list[int]:
        s = MPerClassSampler(labels, 4, 12, torch.Generator().manual_seed(seed))
        s.set_epoch(epoch)
        return list(s)

    assert order(0, 0) == order(0, 0)
    assert order(0, 1) == order(0, 1)
    assert order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0)

    s = MPerClassSampler(labels, 4, 12, np.random.default_rng(5))
    first, second = list(s), list(s)  # no set_epoch: each pass moves on
    assert first != second
    s.set_epoch(0)
    assert list(s) == first
    assert pickle.loads(pickle.dumps(s)).seed == s.seed


def test_m_per_class_refuses_bad_shapes() -> None:
    labels = sampler_labels()
    g = np.random.default_rng(0)
    with pytest.raises(ValueError, match="multiple"):
        MPerClassSampler(labels, 4, 10, g)
    with pytest.raises(PactlError, match="only 10"):
        MPerClassSampler(labels, 2, 24, g)  # needs 12 classes
