"""Image decoding, transforms, the Dataset and the class-balanced sampler.

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError, features
from torchvision import transforms as T

from pactl.console import Reporter
from pactl.errors import PactlError
from pactl.files import NotRegular, one_line, open_regular, os_reason

__all__ = [
    "AUGMENTS",
    "DEFAULT_MAX_PIXELS",
    "Batch",
    "ImageDataset",
    "ImageError",
    "MPerClassSampler",
    "build_transform",
    "check_header",
    "collate",
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

Transform = Callable[[Image.Image], torch.Tensor]


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
    """Open `path` only if it is a regular file (pactl.files.open_regular): never a FIFO, which
    would block, or a device."""
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
        if target_size is not None:
            # No-op for formats other than JPEG; for JPEG it must come before load().
            img.draft("RGB", (target_size, target_size))
        img.load()  # first frame of an animated GIF/WebP: the file opens positioned on it
        upright = ImageOps.exif_transpose(img)
        return to_rgb(upright)


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


# --------------------------------------------------------------------------- dataset


Sample = tuple[torch.Tensor | None, int, int, str]


class ImageDataset(torch.utils.data.Dataset):
    """Files (+ labels) -> (image or None, label or -1, index, failure reason or "")."""

    def __init__(
        self,
        files: Sequence[Path | str],
        labels: np.ndarray | None,
        transform: Transform,
        target_size: int | None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        raw_jpeg: bool = False,
    ) -> None:
        """`raw_jpeg`: a JPEG (within `max_pixels`) comes back as its bytes, a 1-D uint8
        tensor, for a decoder on the GPU; other images are decoded here as usual."""
        if labels is not None and len(labels) != len(files):
            raise ValueError(f"{len(files)} files but {len(labels)} labels")
        # Plain strings pickle small and fast when the dataset is sent to worker processes.
        self.files = [str(f) for f in files]
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.transform = transform
        self.target_size = target_size
        self.max_pixels = max_pixels
        self.raw_jpeg = raw_jpeg

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Sample:
        if self.raw_jpeg:
            label = -1 if self.labels is None else int(self.labels[i])
            try:
                data = jpeg_bytes(self.files[i], self.max_pixels)
            except ImageError as e:
                return None, label, i, str(e)
            if data is not None:
                return torch.frombuffer(bytearray(data), dtype=torch.uint8), label, i, ""
        return self.decoded(i)

    def decoded(self, i: int) -> Sample:
        """Sample i decoded by PIL and transformed (or the reason it failed)."""
        label = -1 if self.labels is None else int(self.labels[i])
        try:
            img = load_image(Path(self.files[i]), self.target_size, self.max_pixels)
        except ImageError as e:
            return None, label, i, str(e)
        return self.transform(img), label, i, ""


@dataclass
class Batch:
    images: torch.Tensor  # (B, 3, H, W) float
    labels: torch.Tensor  # (B,) int64, -1 where unlabelled
    indices: torch.Tensor  # (B,) int64 positions in the dataset
    failed: list[tuple[int, str]] = field(default_factory=list)  # (index, reason) dropped
    raw: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (index, JPEG bytes)

    def __len__(self) -> int:
        return int(self.indices.numel())

    def pin_memory(self) -> Batch:
        # DataLoader(pin_memory=True) calls this on custom batch types.
        return Batch(
            self.images.pin_memory(),
            self.labels.pin_memory(),
            self.indices.pin_memory(),
            self.failed,
            self.raw,
        )


def _is_raw(sample: Sample) -> bool:
    return sample[0] is not None and sample[0].dim() == 1  # JPEG bytes (raw_jpeg datasets)


def collate(samples: list[Sample]) -> Batch:
    """Stack the decoded samples; record the failed ones instead of raising. JPEG bytes from a
    `raw_jpeg` dataset go to `raw`, in order, for the caller to decode."""
    raw = [(s[2], s[0]) for s in samples if _is_raw(s) and s[0] is not None]
    samples = [s for s in samples if not _is_raw(s)]
    good = [s for s in samples if s[0] is not None]
    failed = [(s[2], s[3]) for s in samples if s[0] is None]
    if good:
        images = torch.stack([s[0] for s in good if s[0] is not None])
    else:
        images = torch.empty((0, 3, 0, 0))
    labels = torch.tensor([s[1] for s in good], dtype=torch.int64)
    indices = torch.tensor([s[2] for s in good], dtype=torch.int64)
    return Batch(images, labels, indices, failed, raw)


# --------------------------------------------------------------------------- sampler


class MPerClassSampler(torch.utils.data.Sampler[int]):
    """Batches of `batch_size // m` distinct classes with `m` images each.

    Use with `DataLoader(batch_size=batch_size, sampler=...)`: every consecutive chunk of
    `batch_size` indices is one such batch. Classes are visited in a shuffled order, a fresh
    shuffle once too few remain for a batch, so every class is seen about equally often; a
    class with fewer than `m` images is sampled with replacement. The order depends only on
    the generator's state at construction and the epoch: call `set_epoch(e)` before each epoch
    to get the same order for epoch e on every run (and on resume). Without it, each new
    iteration moves on to the next epoch's order.
    """

    def __init__(
        self,
        labels: np.ndarray,
        m: int,
        batch_size: int,
        generator: torch.Generator | np.random.Generator,
        length: int | None = None,
    ) -> None:
        if m < 1 or batch_size < m or batch_size % m:
            raise ValueError(f"batch_size ({batch_size}) must be a positive multiple of m ({m})")
        labels = np.asarray(labels)
        classes, inverse = np.unique(labels, return_inverse=True)
        self.classes_per_batch = batch_size // m
        if len(classes) < self.classes_per_batch:
            raise PactlError(
                f"a batch of {batch_size} with {m} images per class needs "
                f"{self.classes_per_batch} classes, but there are only {len(classes)}; "
                "lower the batch size or raise m"
            )
        order = np.argsort(inverse, kind="stable")
        bounds = np.cumsum(np.bincount(inverse))[:-1]
        self.members = np.split(order, bounds)  # per class: its dataset indices
        self.m = m
        self.batch_size = batch_size
        total = len(labels) if length is None else length
        self.num_batches = max(1, total // batch_size)
        self.seed = _draw_seed(generator)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches * self.batch_size

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        k, m = self.classes_per_batch, self.m
        n_classes = len(self.members)
        class_order = rng.permutation(n_classes)
        pos = 0
        out = np.empty(self.num_batches * self.batch_size, dtype=np.int64)
        for b in range(self.num_batches):
            if pos + k > n_classes:  # a batch never straddles two shuffles: no repeated class
                class_order, pos = rng.permutation(n_classes), 0
            for j, c in enumerate(class_order[pos : pos + k]):
                members = self.members[c]
                picked = rng.choice(members, size=m, replace=len(members) < m)
                start = b * self.batch_size + j * m
                out[start : start + m] = picked
            pos += k
        return iter(out.tolist())


def _draw_seed(generator: torch.Generator | np.random.Generator) -> int:
    if isinstance(generator, torch.Generator):
        return int(torch.randint(0, 2**62, (1,), generator=generator).item())
    return int(generator.integers(0, 2**62))
