"""pactl.images: decoding what a folder holds (failures as one ImageError line, modes, EXIF,
animation, bombs, special files), on images made here."""

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
from pathlib import Path

import numpy as np
import pytest
from conftest import MEAN, STD
from PIL import Image

from pactl.errors import PactlError
from pactl.images import DEFAULT_MAX_PIXELS, ImageError, load_image
from pactl.loaders import ImageDataset
from pactl.transforms import build_transform


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
