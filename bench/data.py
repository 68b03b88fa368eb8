"""What bench/ measures on: the synthetic vectors, seeded, and the offline real image sets.

Synthetic vectors. Real embeddings are clustered: images of one class sit close together, classes
of one kind (birds, shoes) nearer each other than the rest. Uniform random 512-d vectors have no
neighbours worth the name (every pair is at cosine ~0) and are the worst case for any index; well
separated classes are the easy case (each query's neighbours sit in one IVF list). `Mixture` is a
two-level mixture in between, all seeded:
  - n / 1000 "kinds", centres uniform on the sphere;
  - n / 50 classes (mean 50 items, like CUB's 60 per class), ~20 per kind, each centre =
    unit(kind centre + 0.5 g / sqrt(d)), g standard normal: classes of a kind at cosine ~0.8;
  - class sizes drawn from lognormal weights (sigma 1): a few big classes, a long tail of small;
  - item = unit(class centre + s g / sqrt(d)) with s uniform in [0.8, 1.5] per class, i.e. cosine
    ~0.55-0.8 to its class centre;
  - queries are fresh items drawn the same way (not in the index), as new photos would be.
`around` draws items around given centres with one noise scale (the on-disk and tombstone
benches); `planted_copies` writes unit vectors with near-copies planted among them (dedup).

Real sets: made offline by tools/real_sets.py and tools/lite0_weights.py under $PACTL_REAL
(default /tmp/pactl-real); `real_set` finds one or says which command makes it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

CHUNK = 65_536  # rows drawn at a time: memory of one chunk, whatever n
INTRINSIC_NOISE = 0.1  # norm of the full-rank noise on a unit item of low intrinsic dimension

REAL_ROOT = Path(os.environ.get("PACTL_REAL", "/tmp/pactl-real"))
# the command that makes each real set under ROOT (tools/real_sets.py, tools/lite0_weights.py)
REAL_SETS = {
    "fonts": "python -m tools.real_sets fonts {root}/fonts",
    "fonts28": "python -m tools.real_sets fonts {root}/fonts28 --size 28",
    "fashion": "python -m tools.real_sets fashion {root}/fashion",
    "lite0.pth": "python -m tools.lite0_weights {root}/lite0.pth",
}


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length."""
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class Mixture:
    """The two-level clustered distribution of the module docstring. With `intrinsic` D, the
    kinds, classes and items are drawn in D dimensions and set in `dim` by a seeded orthonormal
    map, with a little isotropic noise on top (INTRINSIC_NOISE): data of low intrinsic
    dimension, as image embeddings are, in place of a full-rank cloud."""

    def __init__(
        self, n: int, dim: int, rng: np.random.Generator, intrinsic: int | None = None
    ) -> None:
        space = intrinsic or dim
        kinds = max(1, n // 1000)
        classes = max(1, n // 50)
        kind_centres = unit(rng.standard_normal((kinds, space), dtype=np.float32))
        parent = rng.integers(0, kinds, classes)
        jitter = 0.5 * rng.standard_normal((classes, space), dtype=np.float32) / math.sqrt(space)
        self.centres = unit(kind_centres[parent] + jitter).astype(np.float32)
        weights = rng.lognormal(0.0, 1.0, classes)
        self.p = weights / weights.sum()
        self.spread = rng.uniform(0.8, 1.5, classes).astype(np.float32)
        self.dim, self.space = dim, space
        self.basis = None
        if intrinsic:  # rows: an orthonormal basis of a random D-dimensional subspace
            q, _ = np.linalg.qr(rng.standard_normal((dim, intrinsic)))
            self.basis = np.ascontiguousarray(q.T, dtype=np.float32)

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(n, dim) float32 unit vectors and their class ids, made a chunk at a time."""
        out = np.empty((n, self.dim), dtype=np.float32)
        labels = np.empty(n, dtype=np.int32)
        for start, c, x in self.chunks(n, rng):
            out[start : start + len(c)], labels[start : start + len(c)] = x, c
        return out, labels

    def chunks(
        self, n: int, rng: np.random.Generator
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(first row, class ids, float32 unit vectors) of n items, CHUNK rows at a time: the
        same items as draw(n) for the same generator state, never all in memory at once."""
        labels = rng.choice(len(self.centres), size=n, p=self.p).astype(np.int32)
        for start in range(0, n, CHUNK):
            c = labels[start : start + CHUNK]
            noise = rng.standard_normal((len(c), self.space), dtype=np.float32)
            scale = self.spread[c, None] / np.float32(math.sqrt(self.space))
            x = unit(self.centres[c] + noise * scale)
            if self.basis is not None:
                off = rng.standard_normal((len(c), self.dim), dtype=np.float32)
                x = unit(x @ self.basis + off * np.float32(INTRINSIC_NOISE / math.sqrt(self.dim)))
            yield start, c, x.astype(np.float32, copy=False)


def around(
    centres: np.ndarray, n: int, rng: np.random.Generator, *, scale: float | None = None
) -> np.ndarray:
    """(n, d) float32 unit vectors, each a random centre plus Gaussian noise: `scale` per
    coordinate in float64, or by default 1 / sqrt(d) in float32 (cosine ~0.7 to the centre)."""
    dim = centres.shape[1]
    picks = centres[rng.integers(0, len(centres), n)]
    if scale is None:
        noise = rng.standard_normal((n, dim), dtype=np.float32) / np.float32(math.sqrt(dim))
    else:
        noise = rng.standard_normal((n, dim)) * scale
    return unit(picks + noise).astype(np.float32)


def planted_copies(path: Path, n: int, dim: int, groups: int, seed: int) -> int:
    """n unit vectors at `path` (.npy), the last copies of the first `groups` shuffled in, and
    family.npy beside it (the original each vector is a copy of, or -1); returns how many are
    planted copies."""
    rng = np.random.default_rng(seed)
    copies = rng.integers(1, 4, size=groups)
    planted = int(copies.sum())
    originals = n - planted
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    for start in range(0, originals, CHUNK):
        stop = min(start + CHUNK, originals)
        x = rng.standard_normal((stop - start, dim), dtype=np.float32)
        out[start:stop] = x / np.linalg.norm(x, axis=1, keepdims=True)
    of = np.repeat(rng.choice(originals, size=groups, replace=False), copies)
    # cos(copy, original) = 1 / sqrt(1 + s^2): 0.98 to 0.90
    noise = rng.uniform(0.2, 0.48, size=(planted, 1)).astype(np.float32)
    x = out[of] + noise * unit(rng.standard_normal((planted, dim), dtype=np.float32))
    out[originals:] = unit(x)
    out.flush()
    family = np.full(n, -1, dtype=np.int64)
    family[of] = of
    family[originals:] = of
    np.save(path.with_name("family.npy"), family)
    return planted


def real_set(name: str, root: Path = REAL_ROOT) -> Path:
    """The folder (or file) of a real set under `root`; a SystemExit naming the command that
    makes it where it is missing."""
    path = root / name
    made = path.is_file() if name.endswith(".pth") else (path / "manifest.csv").is_file()
    if not made:
        command = REAL_SETS.get(name, "python -m tools.real_sets --help").format(root=root)
        raise SystemExit(f"error: no real set at {path}; make it with `{command}`")
    return path
