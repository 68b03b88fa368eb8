"""The float vectors a bundle keeps beside lossy codes, and the exact cosine that rescores the
codes' candidates with them: a binary bundle's Hamming candidates (pactl.index.binary.search)
and a float bundle's product-quantised ones (RescoredIndex) alike.

floats.npy is the bundle's own file (a clone of the vectors file where the file system shares
blocks, else a copy), memory-mapped; row i is the item table's row i.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.console import Reporter
from pactl.errors import PactlError
from pactl.index.mapped import Part, blocks, count_rows, drop_pages, random_access

MAX_RESCORE = 10_000  # candidates per hit a search may be asked to rescore
RESCORE_BYTES = 32 * 2**20  # gathered candidate vectors per block of queries
GATHER_ROWS = 65_536  # rows gathered at a time where a float copy is written again

FLOATS_FILE = "floats.npy"  # the bundle's float vectors, row i = item row i: rescoring reads them


def place_floats(parts: Sequence[Part], path: Path, reporter: Reporter) -> np.ndarray:
    """The parts' vectors as one float32 .npy at `path`, memory-mapped read-only: a file of the
    bundle's own, never a hard link to the vectors folder's (a write there would change the
    bundle's answers unseen): a clone of that file where the file system shares blocks (one
    part mapped whole from a float32 .npy), else a copy written a block at a time."""
    if len(parts) == 1 and clone_npy(parts[0][0], path):
        return np.load(path, mmap_mode="r", allow_pickle=False)
    reporter.log(f"copying the float vectors to {path.name} for rescoring")
    n, dim = count_rows(parts), int(parts[0][0].shape[1])  # the parts are checked
    return write_floats(path, (n, dim), (b for v, _ in parts for _, b in blocks(v)))


FICLONE = 0x40049409  # Linux's ioctl that makes a copy-on-write clone of a whole file


def clone_npy(vectors: np.ndarray, path: Path) -> bool:
    """Clone the .npy file `vectors` maps whole to `path` (copy-on-write: later writes to
    either never reach the other); False where it cannot (the copy is then made by rows)."""
    source = getattr(vectors, "filename", None)
    if not isinstance(vectors, np.memmap) or not source or vectors.dtype != np.float32:
        return False
    if os.name != "posix":
        return False
    import fcntl

    try:
        with open(source, "rb") as src, open(path, "wb") as dst:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        cloned = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return False
    whole = cloned.shape == vectors.shape and cloned.offset == vectors.offset
    if not (whole and cloned.dtype == np.float32 and cloned.flags.c_contiguous):
        del cloned
        path.unlink()
        return False
    return True


def write_floats(path: Path, shape: tuple[int, int], chunks: Iterable[np.ndarray]) -> np.ndarray:
    """Write `chunks` (row blocks, in order, `shape` in all) as one float32 .npy, through the
    file, so the pages written never count in this process's memory; returns it mapped."""
    written = 0
    with open(path, "wb") as f:
        header = {"descr": "<f4", "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(f, header)
        for chunk in chunks:
            if chunk.ndim != 2 or chunk.shape[1] != shape[1]:
                raise PactlError(f"float vectors of shape {chunk.shape} for a {shape[1]}-d file")
            np.ascontiguousarray(chunk, dtype=np.float32).tofile(f)
            written += len(chunk)
    if written != shape[0]:
        raise PactlError(f"{written:,} float vectors written for {shape[0]:,}")
    return np.load(path, mmap_mode="r", allow_pickle=False)


def rows_of(vectors: np.ndarray, rows: np.ndarray) -> Iterator[np.ndarray]:
    """vectors[rows] (rows sorted) a block at a time, each block's pages dropped after it."""
    step = GATHER_ROWS
    for start in range(0, len(rows), step):
        block = rows[start : start + step]
        if len(block):
            yield np.ascontiguousarray(vectors[block])
            drop_pages(vectors)


def rescore(
    floats: np.ndarray,
    positions: Callable[[np.ndarray], np.ndarray],
    queries: np.ndarray,
    found: np.ndarray,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The k best of each query's candidate ids `found` (nq, m; -1 for none) by exact cosine
    with their float vectors: (scores float32, ids int64), (nq, min(k, m)), best first, level
    scores in candidate order. A block of queries at a time (RESCORE_BYTES of gathered
    vectors), each block's candidates read once, in file order, and their pages dropped from
    the process after (pactl.index.mapped.drop_pages): memory stays the block's whatever the
    number of queries or the size of the file."""
    random_access(floats)  # scattered rows: no read-around of each page fault
    at = positions(found)  # (nq, m) rows of `floats`, -1 for none
    if ((found >= 0) & (at < 0)).any():
        raise PactlError("a candidate of the binary index is not an item: rebuild the bundle")
    scores = np.full(found.shape, -np.inf, dtype=np.float32)
    step = max(1, RESCORE_BYTES // max(1, found.shape[1] * floats.shape[1] * 4))
    for start in range(0, len(found), step):
        rows = at[start : start + step]
        needed = np.unique(rows[rows >= 0])
        if not len(needed):
            continue
        vectors = np.ascontiguousarray(floats[needed], dtype=np.float32)  # (u, d)
        drop_pages(floats[needed[0] : needed[-1] + 1])
        gathered = vectors[np.searchsorted(needed, np.maximum(rows, 0))]  # (b, m, d)
        scores[start : start + step] = np.einsum(
            "bmd,bd->bm", gathered, queries[start : start + step]
        )
    scores[at < 0] = -np.inf
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    kept = np.take_along_axis(scores, order, 1)
    ids = np.where(np.isfinite(kept), np.take_along_axis(found, order, 1), -1)
    return kept, ids


def padded(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """k columns: fewer found are padded with -inf and -1, as FAISS pads."""
    short = k - ids.shape[1]
    if short <= 0:
        return scores[:, :k], ids[:, :k]
    pad = ((0, 0), (0, short))
    return np.pad(scores, pad, constant_values=-np.inf), np.pad(ids, pad, constant_values=-1)


@dataclass
class RescoredIndex:
    """A float index with lossy codes (PQ, SQ, ...) searched as its codes' k x rescore nearest
    candidates, rescored by exact cosine on the bundle's float vectors: the ceiling the codes
    set on recall lifted. It has the surface pactl.index.search reads of a FAISS index."""

    index: Any  # faiss.Index over the items' codes, item ids as its ids
    floats: np.ndarray  # (ntotal, d) float32, memory-mapped: row i is the item table's row i
    positions: Callable[[np.ndarray], np.ndarray]  # item ids -> rows of `floats` (-1: none)
    rescore: int  # candidates per hit rescored by cosine; 0: hits in the codes' order

    @property
    def d(self) -> int:
        return int(self.index.d)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def metric_type(self) -> int:
        return int(self.index.metric_type)

    def with_rescore(self, rescore: int) -> RescoredIndex:
        """The same index searched with another rescoring depth (0: the codes' order)."""
        if not 0 <= rescore <= MAX_RESCORE:
            raise PactlError(f"--rescore {rescore}: give 0 (the codes' order) to {MAX_RESCORE:,}")
        return dataclasses.replace(self, rescore=rescore)

    def search(self, x: np.ndarray, k: int, params: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids), (nq, k), best first, -1 / -inf padded: the k best cosines among each
        query's k x rescore nearest codes (rescore 0: the k nearest codes, as they score)."""
        queries = np.ascontiguousarray(x, dtype=np.float32)
        kwargs = {} if params is None else {"params": params}
        if self.rescore == 0:
            return self.index.search(queries, k, **kwargs)
        _, found = self.index.search(queries, min(k * self.rescore, self.ntotal), **kwargs)
        return padded(*rescore(self.floats, self.positions, queries, found, k), k)

    def widening(self) -> tuple[Callable[[int], Any], Callable[[int], bool]]:
        """The inner index's widening (pactl.index.search.float_widening)."""
        from pactl.index.search import float_widening

        return float_widening(self.index)


def lossy(index: Any) -> bool:
    """Whether the index scores its vectors other than by their exact cosine: codes that store
    them approximately (PQ, SQ, ...), or a pre-transform that changes inner products in front
    of exact lists (PCA64,IVF1024,Flat; OPQ16_64,...; PCAR32,Flat): exact cosine on the float
    vectors can then rank its candidates better than it does."""
    import faiss

    inner = faiss.downcast_index(index)
    while isinstance(inner, faiss.IndexIDMap | faiss.IndexPreTransform):
        if isinstance(inner, faiss.IndexPreTransform):
            chain: Any = inner.chain  # a SWIG vector (its stub types it as a list)
            steps = (faiss.downcast_VectorTransform(chain.at(i)) for i in range(chain.size()))
            if any(not keeps_scores(step) for step in steps):
                return True
        inner = faiss.downcast_index(inner.index)
    ivf = faiss.try_extract_index_ivf(inner)
    if ivf is not None:
        return not isinstance(faiss.downcast_index(ivf), faiss.IndexIVFFlat)
    if isinstance(inner, faiss.IndexHNSW):
        return not isinstance(faiss.downcast_index(inner.storage), faiss.IndexFlat)
    return not isinstance(inner, faiss.IndexFlat)


def keeps_scores(step: Any) -> bool:
    """Whether a FAISS pre-transform leaves every inner product of unit vectors as it was: an
    orthonormal map with no shift into as many dimensions or more (a random rotation, OPQ's
    full-width rotation), padding, or normalising (pactl's vectors are unit already). A PCA
    cuts dimensions and, even at full width, shifts by the mean, which changes a query's
    inner products by a term of each item's own: its order is not the cosine's."""
    import faiss

    if isinstance(step, faiss.NormalizationTransform):
        return True
    if isinstance(step, faiss.RemapDimensionsTransform):
        return step.d_out >= step.d_in
    if isinstance(step, faiss.LinearTransform):
        return bool(step.is_orthonormal and not step.have_bias and step.d_out >= step.d_in)
    return False
