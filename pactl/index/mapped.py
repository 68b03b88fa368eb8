"""Reading memory-mapped vectors a block at a time without their pages piling up in memory.

A vectors file read through a memory map (np.load(mmap_mode="r")) stays resident in the process,
page after page, until the kernel runs short: a pass over 2 GiB of vectors adds 2 GiB to the
process's peak RSS. Dropping each block's pages once it has been used (madvise MADV_DONTNEED on
the shared, read-only mapping) keeps one block resident; the pages stay in the page cache, so a
block read again costs no disk read while memory lasts.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Sequence

import numpy as np

from pactl.errors import PactlError

BLOCK_BYTES = 32 * 2**20  # read per block: 16,384 rows of 512-d float32

# Maps whose pages are the file's own: dropping them loses nothing. A copy-on-write map ("c")
# holds private pages that MADV_DONTNEED would throw away.
SHARED_MODES = ("r", "r+", "w+")


def drop_pages(rows: np.ndarray) -> bool:
    """Drop the pages under `rows` (a contiguous view into a shared memory map) from this
    process's resident memory; reading them again maps them back from the file. Arrays in
    memory, copy-on-write maps, strided views and platforms without madvise are left alone.
    Returns whether pages were dropped."""
    owner = _shared_map(rows)
    if owner is None or rows.nbytes == 0 or not rows.flags.c_contiguous:
        return False
    if not hasattr(mmap, "MADV_DONTNEED"):
        return False
    first = rows.__array_interface__["data"][0] - _address(owner)
    start = first // mmap.PAGESIZE * mmap.PAGESIZE  # madvise takes whole pages from a boundary
    owner.madvise(mmap.MADV_DONTNEED, start, first + rows.nbytes - start)
    return True


def random_access(rows: np.ndarray) -> bool:
    """Mark the shared memory map under `rows` as read at random (MADV_RANDOM): a page fault
    reads that page alone, not the kernel's read-around of up to read_ahead_kb (8 MiB on a
    disk measured here). Rescoring reads a few rows of a float file scattered across it: at
    10,000,000 x 512 a tuning pass over a 20 GB floats.npy read about 1 GB/s from disk with
    read-around (vmstat) and nothing measurable with MADV_RANDOM. Returns whether the map was
    marked."""
    owner = _shared_map(rows)
    if owner is None or not hasattr(mmap, "MADV_RANDOM"):
        return False
    owner.madvise(mmap.MADV_RANDOM)
    return True


def blocks(vectors: np.ndarray, size: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, vectors[first : first + size]) in row order (size: BLOCK_BYTES of rows unless
    given), each block's pages dropped (drop_pages) once the caller asks for the next one or
    stops: a memory-mapped array is read with at most one block of it resident."""
    step = size or max(1, BLOCK_BYTES // max(1, vectors[:1].nbytes))
    for start in range(0, len(vectors), step):
        block = vectors[start : start + step]
        try:
            yield start, block
        finally:
            drop_pages(block)


def _shared_map(rows: np.ndarray) -> mmap.mmap | None:
    """The mmap under `rows` when every memmap on the way to it maps the file shared."""
    base: object = rows
    seen_memmap = False
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            if base.mode not in SHARED_MODES:
                return None
            seen_memmap = True
        base = base.base
    return base if isinstance(base, mmap.mmap) and seen_memmap else None


def _address(owner: mmap.mmap) -> int:
    """Where the map starts in this process's memory (read-only maps included)."""
    view = np.frombuffer(owner, dtype=np.uint8, count=1)
    return int(view.__array_interface__["data"][0])


# ---------------------------------------------------------------------------- parts of an index


NORM_TOLERANCE = 1e-2  # |norm - 1| allowed before vectors are taken as not L2-normalised


Part = tuple[np.ndarray, np.ndarray]  # one shard: (n_i, d) float32 vectors (memory-mapped), ids


def count_rows(parts: Sequence[Part]) -> int:
    return sum(len(vectors) for vectors, _ in parts)


def read_rows(parts: Sequence[Part], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vectors (float32, in memory) and ids at sorted `rows`, numbered across the parts in
    order. Each part gives its own rows, a block at a time (pactl.index.mapped.blocks), into
    one array made up front: the parts are never joined, a memory-mapped one is never resident
    as a whole, and the sample is held once (not once in pieces and again joined)."""
    dim = parts[0][0].shape[1] if parts else 0
    vectors = np.empty((len(rows), dim), dtype=np.float32)
    ids = np.empty(len(rows), dtype=np.int64)
    start = 0
    for part, part_ids in parts:
        low, high = np.searchsorted(rows, [start, start + len(part)])
        ids[low:high] = np.asarray(part_ids, dtype=np.int64)[rows[low:high] - start]
        for first, block in blocks(part):
            low, high = np.searchsorted(rows, [start + first, start + first + len(block)])
            vectors[low:high] = block[rows[low:high] - start - first]
        start += len(part)
    return vectors, ids


def unit_blocks(parts: Sequence[Part]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first row, float32 block, its int64 ids) over the parts' blocks (mapped.blocks), rows
    numbered across the parts, each block checked by check_unit_rows (float32 rows of a memory
    map are handed on without a copy)."""
    row = 0
    for vectors, ids in parts:
        for start, block in blocks(vectors):
            batch = np.ascontiguousarray(block, dtype=np.float32)
            first = row + start
            check_unit_rows(batch, np.arange(first, first + len(batch)))
            yield first, batch, np.ascontiguousarray(ids[start : start + len(batch)], np.int64)
        row += len(vectors)


def check_unit_rows(batch: np.ndarray, rows: np.ndarray) -> None:
    """Refuse NaN/inf and vectors far from unit length: inner product is cosine only on those."""
    norms = np.sqrt(np.einsum("ij,ij->i", batch, batch, dtype=np.float64))
    bad = np.flatnonzero(~(np.abs(norms - 1.0) <= NORM_TOLERANCE))
    if len(bad):
        i = bad[0]
        raise PactlError(
            f"vector {int(rows[i])} has norm {norms[i]:.4g}; pactl indexes L2-normalised vectors "
            "(cosine similarity as inner product): normalise them first"
        )
