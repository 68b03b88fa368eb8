"""Binary codes of float vectors: the rotation learned before taking signs, and the packed codes.

A code is the signs of a vector after a linear map: bit j is 1 where (x @ W)_j - b_j > 0, packed
8 bits a byte as numpy's packbits does (and pactl.codes.hamming, whose order FAISS's binary indexes
take as they come). The map is one of ROTATION_KINDS:

- none: the vector's own signs (W the identity, b 0): what a network trained with `--bits N`
  makes, and the cheapest for any vectors; N must be the dimension.
- itq: iterative quantisation (Gong and Lazebnik, CVPR 2011): the vectors centred on their mean,
  projected on their top N principal directions when N is below the dimension (PCA-ITQ), then
  turned by the orthogonal R that minimises ||sign(VR) - VR||, found by alternating the codes and
  an orthogonal Procrustes step. Signs of a rotation that spreads the variance evenly over the
  bits keep more of the cosine order than the raw signs of a few dominant directions.
- lsh: a seeded Gaussian projection of the centred vectors (Charikar's SimHash): any N, more bits
  than dimensions included, where a learned map has only as many directions as the vectors.

A map is stored as one (dim + 1, bits) float32 array: W, then b (rotation.npy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pactl.errors import PactlError

ROTATION_KINDS = ("none", "itq", "lsh")
ROTATION_CHOICES = ("auto", *ROTATION_KINDS)  # auto: measured (pactl.index.binary.build)
ITQ_ITERATIONS = 50  # Gong and Lazebnik's setting: the quantisation loss has settled by then
CODE_BLOCK = 65_536  # vectors coded at a time: (block, bits) float32 of projections


@dataclass(frozen=True)
class Rotation:
    """The map before the signs: codes(x) = packbits((x @ matrix - offset) > 0)."""

    kind: str  # one of ROTATION_KINDS
    matrix: np.ndarray  # (dim, bits) float32
    offset: np.ndarray  # (bits,) float32: the mean's projection, so the codes are of x - mean

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def bits(self) -> int:
        return int(self.matrix.shape[1])

    def project(self, x: np.ndarray) -> np.ndarray:
        """(n, bits) float32: the values whose signs are the codes."""
        x = np.asarray(x, dtype=np.float32)
        if self.kind == "none":
            return x  # the identity, without a (dim x dim) product
        return x @ self.matrix - self.offset

    def codes(self, x: np.ndarray) -> np.ndarray:
        """(n, bits / 8) uint8 packed codes of (n, dim) float vectors, a block at a time."""
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise PactlError(f"vectors of shape {x.shape} for codes of {self.dim}-d vectors")
        out = np.empty((len(x), self.bits // 8), dtype=np.uint8)
        for start in range(0, len(x), CODE_BLOCK):
            block = self.project(x[start : start + CODE_BLOCK])
            out[start : start + len(block)] = np.packbits(block > 0, axis=1)
        return out

    def to_array(self) -> np.ndarray:
        """The (dim + 1, bits) float32 array rotation.npy holds."""
        return np.vstack([self.matrix, self.offset[None, :]]).astype(np.float32)

    @classmethod
    def from_array(cls, kind: str, array: np.ndarray, where: str) -> Rotation:
        """The map of a rotation.npy, checked: one line naming `where` when it cannot be one."""
        if kind not in ROTATION_KINDS:
            raise PactlError(
                f"{where}: rotation {kind!r} is not one of {', '.join(ROTATION_KINDS)}"
            )
        ok = array.dtype == np.float32 and array.ndim == 2 and array.shape[0] >= 2
        if not ok or not np.isfinite(array).all():
            raise PactlError(f"{where} is not a finite float32 (dimension + 1, bits) array")
        return cls(kind, np.ascontiguousarray(array[:-1]), np.ascontiguousarray(array[-1]))


def check_bits(bits: int, dim: int, kind: str) -> None:
    """One line when `bits` cannot be coded from `dim`-d vectors with rotation `kind` (auto:
    whichever is measured best; more bits than dimensions need a projection chosen, lsh)."""
    if kind not in ROTATION_CHOICES:
        raise PactlError(f"--rotation {kind!r}: choose one of {', '.join(ROTATION_CHOICES)}")
    if bits < 8 or bits % 8:
        raise PactlError(
            f"--bits {bits}: codes are whole bytes; give a multiple of 8 (64, 128 ...)"
        )
    if kind == "none" and bits != dim:
        raise PactlError(
            f"--bits {bits} with --rotation none: a vector's own signs are {dim} bits; give "
            f"--bits {dim}, or --rotation itq (fewer bits) or lsh (any number)"
        )
    if bits > dim and kind != "lsh":
        raise PactlError(
            f"--bits {bits} is more than the vectors' {dim} dimensions, which give at most one "
            f"sign each: give --bits {dim // 8 * 8} or fewer, or --rotation lsh (a random "
            "projection to more bits)"
        )


def learn_rotation(sample: np.ndarray, bits: int, kind: str, seed: int) -> Rotation:
    """The map of `kind` for `bits`-bit codes, learned on `sample` ((m, dim) float32 vectors)
    with a generator seeded by `seed`: the same sample and seed give the same map."""
    dim = sample.shape[1]
    check_bits(bits, dim, kind)
    if kind == "none":
        return Rotation(kind, np.eye(dim, dtype=np.float32), np.zeros(dim, dtype=np.float32))
    rng = np.random.default_rng(seed)
    mean = sample.mean(axis=0, dtype=np.float64)
    if kind == "lsh":
        matrix = rng.standard_normal((dim, bits)) / np.sqrt(dim)
    elif kind == "itq":
        matrix = _itq(sample, mean, bits, rng)
    else:
        raise PactlError(f"rotation {kind!r}: choose one of {', '.join(ROTATION_CHOICES)}")
    offset = mean @ matrix
    return Rotation(kind, matrix.astype(np.float32), offset.astype(np.float32))


def _itq(sample: np.ndarray, mean: np.ndarray, bits: int, rng: np.random.Generator) -> np.ndarray:
    """(dim, bits) float64: the top `bits` principal directions of the centred sample, turned by
    ITQ's rotation (ITQ_ITERATIONS of: codes B = sign(VR); R = U W^T for U S W^T = svd(V^T B))."""
    centred = sample.astype(np.float64) - mean
    covariance = centred.T @ centred / max(1, len(centred) - 1)
    _, vectors = np.linalg.eigh(covariance)  # ascending eigenvalues
    principal = vectors[:, ::-1][:, :bits]  # (dim, bits)
    v = (centred @ principal).astype(np.float32)  # (m, bits) the sample in those directions
    r, _ = np.linalg.qr(rng.standard_normal((bits, bits)))  # a random orthogonal start
    for _ in range(ITQ_ITERATIONS):
        b = np.where(v @ r.astype(np.float32) > 0, np.float32(1), np.float32(-1))
        u, _, wt = np.linalg.svd((v.T @ b).astype(np.float64))
        r = u @ wt
    return principal @ r


def hamming_scores(distances: np.ndarray, bits: int) -> np.ndarray:
    """Hamming distances as scores on the cosine's scale, 1 - 2 h / bits: the cosine of the
    codes held as +-1 vectors (1 for equal codes, -1 for opposite ones); what a hit's score
    is when nothing is rescored."""
    return (1.0 - 2.0 * distances.astype(np.float32) / np.float32(bits)).astype(np.float32)
