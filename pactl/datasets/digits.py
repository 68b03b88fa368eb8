"""scikit-learn's handwritten digits (1,797 real 8x8 scans) as PNG files in class folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from pactl.console import Reporter
from pactl.datasets.archives import writing_to
from pactl.datasets.manifest import write_manifest


def prepare_digits(target: Path, reporter: Reporter) -> None:
    """Write `target/<digit>/<n>.png` and a manifest: digits 0-4 train, 5-9 test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.clip(digits.images * (255.0 / 16.0), 0, 255).astype(np.uint8)  # 0..16 -> 0..255
    rows = []
    with reporter.bar("writing digits", total=len(images)) as advance:
        for n, (pixels, label) in enumerate(zip(images, digits.target, strict=True)):
            rel = f"{label}/{n:04d}.png"
            with writing_to(target / rel):
                (target / str(label)).mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels, mode="L").save(target / rel)
            rows.append((rel, int(label), "train" if label < 5 else "test", str(label)))
            advance()
    write_manifest(target / "manifest.csv", rows)
