"""The orders a training epoch draws its images in: shuffled, or m images per class in each
batch (MPerClassSampler), and each process's share of a global batch (RankSlice).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from pactl.config import TrainConfig
from pactl.errors import PactlError
from pactl.training.distributed import World


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


class RankSlice(torch.utils.data.Sampler[int]):
    """This process's share of each global batch drawn by `base` (all of it in one process)."""

    def __init__(self, base: torch.utils.data.Sampler[int], batch_size: int, world: World) -> None:
        self.base, self.batch_size, self.world = base, batch_size, world
        self.share = batch_size // world.size

    def __iter__(self) -> Iterator[int]:
        order = list(self.base)
        whole = len(order) - len(order) % self.batch_size
        for start in range(0, whole, self.batch_size):
            first = start + self.world.rank * self.share
            yield from order[first : first + self.share]

    def __len__(self) -> int:
        return (len(self.base) // self.batch_size) * self.share  # type: ignore[arg-type]


def shuffled(
    labels: np.ndarray, cfg: TrainConfig, generator: torch.Generator
) -> torch.utils.data.Sampler[int]:
    """Every training image once an epoch, in a shuffled order."""
    return torch.utils.data.RandomSampler(range(len(labels)), generator=generator)


def m_per_class(
    labels: np.ndarray, cfg: TrainConfig, generator: torch.Generator
) -> torch.utils.data.Sampler[int]:
    """Batches of cfg.m_per_class images from each of batch_size / m classes."""
    return MPerClassSampler(labels, cfg.m_per_class, cfg.batch_size, generator)


# --sampler NAME: the epoch's order of the training images (its names are TrainConfig's choices).
SAMPLERS: dict[
    str, Callable[[np.ndarray, TrainConfig, torch.Generator], torch.utils.data.Sampler[int]]
] = {
    "shuffle": shuffled,
    "m_per_class": m_per_class,
}
