"""HEIC photos: read with the `heif` extra, skipped with the reason without it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pillow_heif = pytest.importorskip("pillow_heif")


def write_heic(path: Path) -> np.ndarray:
    pixels = np.zeros((32, 48, 3), dtype=np.uint8)
    pixels[:, :24] = (200, 30, 30)
    pixels[:, 24:] = (20, 40, 220)
    pillow_heif.from_pillow(Image.fromarray(pixels)).save(str(path), quality=95)
    return pixels


def test_heic_is_read_with_the_extra(tmp_path: Path) -> None:
    from pactl.images import load_image

    pixels = write_heic(tmp_path / "photo.heic")
    img = load_image(tmp_path / "photo.heic")
    assert img.mode == "RGB" and img.size == (48, 32)
    # Lossy, chroma-subsampled: each half's mean colour within a few levels of what was written.
    got = np.asarray(img).astype(np.float64)
    for half in (slice(4, 20), slice(28, 44)):
        assert (
            np.abs(got[8:24, half].mean(axis=(0, 1)) - pixels[8:24, half].mean(axis=(0, 1))).max()
            < 12
        )


def test_heic_without_the_extra_is_skipped_with_the_reason(tmp_path: Path) -> None:
    write_heic(tmp_path / "photo.heic")
    Image.new("RGB", (16, 16), "red").save(tmp_path / "ok.png")
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["pillow_heif"] = None  # as if the extra were not installed
        from pathlib import Path
        from pactl.datasets import list_images
        from pactl.images import ImageError, load_image
        files = list_images(Path({str(tmp_path)!r}))
        print(sorted(f.name for f in files))
        for f in files:
            try:
                load_image(f)
                print(f.name, "read")
            except ImageError as e:
                print(f.name, "skipped:", e.reason)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "['ok.png', 'photo.heic']"
    assert "ok.png read" in lines
    assert (
        "photo.heic skipped: a HEIC/HEIF image, and pillow-heif is not installed: "
        "pip install 'pactl[heif]'"
    ) in lines
