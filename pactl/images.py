"""Image decoding: one file to one RGB image, or one clear reason why not.

Decoding is strict and explicit: every way a file can fail (missing, unreadable, empty, not a
regular file, truncated, not an image, too many pixels) becomes one `ImageError` with a short
reason, so a training or embedding run can skip the file, count it and say why, instead of
dying in a DataLoader worker, hanging on a FIFO or silently learning from a half-decoded picture.

Reproducibility of the random augmentations: torchvision's random transforms draw from torch's
global generator of the process that runs them. Inside a DataLoader worker that generator is
seeded by the DataLoader itself (from its `generator=` argument, plus the worker id), so a loader
built with a seeded `torch.Generator` gives the same augmentations run after run. With
`num_workers=0` the transforms run in the main process, and the caller seeds torch's global
generator (`torch.manual_seed`) before iterating.

Everything here is picklable (plain module-level classes and functions, no module state), so
the Dataset, transforms and `collate` work with worker processes under fork or spawn.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import struct
import warnings
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError, features

from pactl.console import Reporter
from pactl.errors import PactlError
from pactl.store.regular_files import NotRegular, one_line, open_regular, os_reason

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "ImageError",
    "check_header",
    "load_image",
    "to_rgb",
    "unreadable_images",
]

# Twice PIL's default warning threshold, i.e. the size at which PIL itself refuses an image.
DEFAULT_MAX_PIXELS = 178_956_970

# Modes holding more than 8 bits per sample that PIL's convert("L") would clip, not scale.
_WIDE_INT_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N"})
_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})
_GPU_JPEG_MODES = frozenset({"RGB", "L"})  # JPEGs a GPU decodes to the colours PIL gives
_ORIENTATION = 0x0112  # the EXIF tag
_JPEG_END = b"\xff\xd9"  # the end-of-image marker

# What PIL's plugins raise on corrupt data: there is no common base class, so the set is named.
_DECODE_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    IndexError,
    TypeError,
    KeyError,
    struct.error,
    zlib.error,
    Image.DecompressionBombError,
)


class ImageError(PactlError):
    """Why one image could not be decoded; `str()` is one line: '<path>: <reason>'."""

    def __init__(self, path: str | Path, reason: str) -> None:
        # Both values go to Exception.args so the error survives pickling between processes.
        super().__init__(str(path), reason)
        self.path = str(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def reason_of(path: str | Path, message: str) -> str:
    """The reason alone from an ImageError's line ('<path>: <reason>'), to show beside a name
    given once."""
    return message.removeprefix(f"{path}: ")


# --------------------------------------------------------------------------- decoding


def load_image(
    path: Path | str,
    target_size: int | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> Image.Image:
    """Decode `path` into an 8-bit RGB image, upright, with transparency on white.

    `target_size`: the smallest side the caller will still need. A JPEG larger than that is
    decoded by libjpeg at 1/2, 1/4 or 1/8 scale (draft mode), each side staying >= target_size,
    which makes huge photos several times cheaper to read. `None` decodes at full size.

    `max_pixels`: images whose header claims more pixels are refused before any pixel data is
    decoded (decompression-bomb guard), checked per call without touching PIL's globals.
    PIL's own hard limit (2 x `Image.MAX_IMAGE_PIXELS`) still applies on top of it.

    Raises ImageError for every failure.
    """
    if target_size is not None and target_size < 1:
        raise ValueError(f"target_size must be >= 1, got {target_size}")
    with _image_errors(path), _open_regular(path) as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise ImageError(path, "file is empty (0 bytes)")
        return _decode(fh, path, target_size, max_pixels)


@contextmanager
def _image_errors(path: Path | str) -> Iterator[None]:
    """Any failure to open or decode `path` as an ImageError with a short reason."""
    if Path(path).suffix.lower() in HEIF_SUFFIXES:
        heif_support()
    try:
        yield
    except OSError as e:
        if isinstance(e, UnidentifiedImageError):
            raise ImageError(path, _format_missing(path) or _decode_reason(e)) from e
        if e.errno is None:
            raise ImageError(path, _decode_reason(e)) from e
        raise ImageError(path, os_reason(e)) from e
    except _DECODE_ERRORS as e:
        raise ImageError(path, _decode_reason(e)) from e


HEIF_SUFFIXES = (".heic", ".heif")  # read through pillow-heif, the `heif` extra
HEIF_INSTALL = "pip install 'pactl[heif]'"


@functools.cache
def heif_support() -> bool:
    """Whether HEIC/HEIF images can be read: pillow-heif (the `heif` extra) is installed, and
    then its opener is registered with PIL (once per process, workers included)."""
    if importlib.util.find_spec("pillow_heif") is None:
        return False
    import pillow_heif

    pillow_heif.register_heif_opener()
    return True


def _format_missing(path: Path | str) -> str | None:
    """Why a photo format PIL does not know here is unreadable, when the fix is an install."""
    suffix = Path(path).suffix.lower()
    if suffix in HEIF_SUFFIXES and not heif_support():
        return f"a HEIC/HEIF image, and pillow-heif is not installed: {HEIF_INSTALL}"
    if suffix == ".avif" and not features.check("avif"):
        return "an AVIF image, and this Pillow reads no AVIF: install Pillow 11.2 or newer"
    return None


def jpeg_bytes(path: Path | str, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> bytes | None:
    """The bytes of a JPEG file for a decoder elsewhere (the GPU's), or None when the file is
    another format (for load_image). The same checks as load_image come first: a regular,
    non-empty file whose header's pixel count is within `max_pixels`, read before any pixel
    data is decoded. Raises ImageError like load_image."""
    with _header(path) as (fh, img):
        if img.format != "JPEG" or img.mode not in _GPU_JPEG_MODES:
            return None
        _check_pixels(path, img.size, max_pixels)
        if img.getexif().get(_ORIENTATION, 1) != 1:
            return None  # nvJPEG does not turn it upright; PIL does
        fh.seek(0)
        data = fh.read()
    # A file cut short may decode on the GPU into a half-grey picture: PIL says it is truncated.
    return data if data.rstrip(b"\0\r\n ").endswith(_JPEG_END) else None


def check_header(path: Path | str, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> None:
    """What can be told of `path` without decoding its pixels: a regular, non-empty file whose
    header PIL reads, with a pixel count within `max_pixels`, whose structure PIL's verify()
    accepts (chunk checksums of a PNG, for one). Raises ImageError like load_image."""
    with _header(path) as (_, img):
        _check_pixels(path, img.size, max_pixels)
        img.verify()


def pixel_size(path: Path | str) -> tuple[int, int]:
    """(width, height) from the header alone; ImageError as load_image's."""
    with _header(path) as (_, img):
        return img.size


@contextmanager
def _header(path: Path | str) -> Iterator[tuple[BinaryIO, Image.Image]]:
    """A regular, non-empty file and its image with only the header read, errors as
    ImageError: what jpeg_bytes and check_header look at before any pixel is decoded."""
    with _image_errors(path), _open_regular(path) as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            raise ImageError(path, "file is empty (0 bytes)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(fh)  # reads the header only
        with img:
            yield fh, img


def unreadable_images(
    files: Sequence[Path], reporter: Reporter, threads: int | None = None
) -> list[tuple[str, str]]:
    """(path, reason) of each file whose header check_header refuses, in input order. Headers
    are read by a pool of threads (file reads release the GIL), with a progress bar."""
    from concurrent.futures import ThreadPoolExecutor

    def one(path: Path) -> tuple[str, str] | None:
        try:
            check_header(path)
        except ImageError as e:
            return str(path), e.reason
        return None

    workers = threads or min(16, 2 * (os.cpu_count() or 1))
    bad = []
    with (
        reporter.bar("checking image headers", len(files)) as advance,
        ThreadPoolExecutor(workers) as pool,
    ):
        for result in pool.map(one, files):
            advance()
            if result is not None:
                bad.append(result)
    return bad


def _check_pixels(path: Path | str, size: tuple[int, int], max_pixels: int | None) -> None:
    width, height = size
    if max_pixels is not None and width * height > max_pixels:
        raise ImageError(
            path,
            f"{width}x{height} = {width * height} pixels is over the limit of "
            f"{max_pixels} (possible decompression bomb)",
        )


def _open_regular(path: Path | str) -> BinaryIO:
    """Open `path` only if it is a regular file (pactl.store.regular_files.open_regular): never a
    FIFO, which would block, or a device."""
    try:
        return open_regular(path)
    except NotRegular as e:
        raise ImageError(path, str(e)) from None


def _decode(
    fh: BinaryIO, path: Path | str, target_size: int | None, max_pixels: int | None
) -> Image.Image:
    with warnings.catch_warnings():
        # Our own limit below replaces PIL's warning threshold; the warning would only be noise.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        img = Image.open(fh)
    with img:
        _check_pixels(path, img.size, max_pixels)
        full = img.size
        if target_size is not None:
            # No-op for formats other than JPEG; for JPEG it must come before load().
            img.draft("RGB", (target_size, target_size))
        img.load()  # first frame of an animated GIF/WebP: the file opens positioned on it
        upright = ImageOps.exif_transpose(img)
        turned = upright.size != img.size
        rgb = to_rgb(upright)
        # The size before draft mode shrank it (the image checks judge the file's own size).
        rgb.info[FULL_SIZE] = full[::-1] if turned else full
        return rgb


FULL_SIZE = "pactl_full_size"  # load_image's info key: (width, height) of the file, upright


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB from any PIL mode: 16-bit scaled, transparency composited onto white."""
    if img.mode in _WIDE_INT_MODES:
        img = _wide_to_l(img)
    if img.mode in _ALPHA_MODES or "transparency" in img.info:  # alpha, or a tRNS colour/index
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if img.mode == "RGB":
        return img.copy()  # a copy owns its pixels, detached from the (closing) file
    return img.convert("RGB")


def _wide_to_l(img: Image.Image) -> Image.Image:
    # Mode "I" is 32-bit but in practice holds 16-bit samples (PNG, TIFF); values outside
    # [0, 65535] are clipped. 65535 -> 255, 32768 -> 128 (v / 257, rounded).
    values = np.asarray(img).astype(np.float64)
    scaled = np.rint(np.clip(values, 0, 65535) / 257.0).astype(np.uint8)
    return Image.fromarray(scaled, mode="L")


def _decode_reason(e: BaseException) -> str:
    if isinstance(e, UnidentifiedImageError):
        return "not an image (or a format PIL cannot read)"
    if isinstance(e, Image.DecompressionBombError):
        return f"too many pixels (possible decompression bomb): {one_line(e)}"
    text = one_line(e)
    if "truncated" in text.lower() or isinstance(e, EOFError):
        return f"truncated file ({text})"
    return f"corrupt image data ({type(e).__name__}: {text})"


# --------------------------------------------------------------------------- transforms


# --------------------------------------------------------------------------- dataset


# --------------------------------------------------------------------------- sampler
