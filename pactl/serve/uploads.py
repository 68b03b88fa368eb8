"""Files a request brings or names: uploads to a private scratch folder, images to add under
the upload folder (never overwriting), and paths checked against the --allow-root folders."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi import HTTPException

from pactl.datasets.manifest import IMAGE_EXTENSIONS
from pactl.fsutil import make_folder

SAFE = re.compile(r"[^\w.-]+")  # letters and digits of any script are kept
NAME_BYTES = 150  # of a kept name's end, in UTF-8: well inside a file system's 255
FORMAT_SUFFIX = {"JPEG": ".jpg", "PNG": ".png", "GIF": ".gif", "BMP": ".bmp", "WEBP": ".webp"}


def write_scratch(uploads: list[Any], folder: Path) -> list[Path]:
    """Each upload's bytes as `folder/<n>`: decoded later, by embed's own loader and limits."""
    files = []
    for n, upload in enumerate(uploads):
        target = folder / str(n)
        upload.file.seek(0)
        with open(target, "wb") as f:
            shutil.copyfileobj(upload.file, f, 1 << 20)
        files.append(target)
    return files


def store_for_add(uploads: list[Any], label: str, root: Path) -> Path:
    """Check that every upload decodes (embed's limits), then keep them in a new folder under
    `root` (`root/<time>-<random>/<label>/<n>-<name>`) and return that folder. Nothing is kept
    when one of them cannot be read."""
    from pactl.images import ImageError, load_image

    check_label(label)
    make_folder(root)
    batch = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=root))
    try:
        folder = batch / label if label else batch
        folder.mkdir(exist_ok=True)
        for n, upload in enumerate(uploads):
            name = _safe_name(upload.filename or "", n)
            target = folder / name
            upload.file.seek(0)
            with open(target, "xb") as f:  # x: a new name, never another file replaced
                shutil.copyfileobj(upload.file, f, 1 << 20)
            try:
                load_image(target)
            except ImageError as e:
                raise HTTPException(400, f"cannot read {upload.filename}: {e.reason}") from None
            _fix_suffix(target)
    except BaseException:
        shutil.rmtree(batch, ignore_errors=True)
        raise
    return batch


def check_label(label: str) -> None:
    """A label becomes a folder name: one plain path component."""
    if not label:
        return
    if label in (".", "..") or len(label) > 200 or any(c in label for c in "/\\\0"):
        raise HTTPException(400, "label must be one name: no slashes, at most 200 characters")
    if any(ord(c) < 32 for c in label):
        raise HTTPException(400, "label must not hold control characters")


def _safe_name(filename: str, n: int) -> str:
    """`<n>-<name>`: the upload's base name, its letters and digits kept (of any script) and
    anything else made `_`, with an image suffix."""
    base = SAFE.sub("_", os.path.basename(filename.replace("\\", "/")))
    while len(base.encode()) > NAME_BYTES:  # the end holds the suffix: cut from the front
        base = base[1:]
    base = base.lstrip(".")
    stem, suffix = os.path.splitext(base or "upload")
    if suffix.lower() not in IMAGE_EXTENSIONS:
        stem, suffix = stem + suffix.replace(".", "_"), ".img"
    return f"{n:03d}-{stem or 'upload'}{suffix}"


def _fix_suffix(target: Path) -> None:
    """A name without an image suffix gets the one of its format, so folder listings see it."""
    from PIL import Image

    if target.suffix != ".img":
        return
    with Image.open(target) as image:
        suffix = FORMAT_SUFFIX.get(image.format or "", ".png")
    final = target.with_suffix(suffix)
    os.link(target, final)  # fails rather than replace an existing file
    os.unlink(target)


def check_allowed(wanted: str, roots: tuple[Path, ...]) -> Path:
    """The real path of `wanted` if it lies inside one of the --allow-root folders (links
    resolved first, so none leads out), else a 403."""
    if not roots:
        raise HTTPException(403, "queries by path are off: start the service with --allow-root")
    if "\0" in wanted:
        raise HTTPException(400, "a path must not hold NUL")
    real = os.path.realpath(wanted)
    for root in roots:
        base = os.path.realpath(root)
        if os.path.commonpath([base, real]) == base:
            return Path(real)
    raise HTTPException(403, f"{wanted} is outside the --allow-root folders")
