"""--drop-noisy RATE: the images whose label is doubted most kept out of the loss, in the manner
of PRISM (Liu et al., CVPR 2021), which ranks each batch by the probability of the given label
under class centres kept in a memory of past embeddings and leaves out the lowest share.

A memory holds every training image's embedding as last seen (by this process) and the sum of
each class's, by the labels trained on. From the second epoch on, each image of a batch is asked
two things (pactl.audit.doubt): its own class's softmax share among the memory's class means (its
own class without its own remembered embedding), and the share of its nearest remembered images
carrying its label; the RATE share of the batch with the lowest blend of the two is left out of
that step's loss. The first epoch fills the memory and trains on everything. The class means,
not a proxy loss's proxies, stand for the classes: proxies trained on the noisy labels follow
them, and rank flipped labels worse (docs/audit.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pactl.audit import doubt


@dataclass
class LabelDoubt:
    """The memory and the share to leave out; built by label_doubt()."""

    labels: torch.Tensor  # (N,) int64 codes the run trains with
    memory: torch.Tensor  # (N, D) float32 last embedding of each training image
    seen: torch.Tensor  # (N,) bool
    sums: torch.Tensor  # (C, D) sum of the remembered embeddings of each class
    rate: float
    epoch: int = 0  # set by the epoch: the memory is asked from epoch 1 (the second) on

    def select(
        self, embeddings: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's (embeddings, labels) without its most doubted share; the memory updated."""
        indices = indices.to(self.memory.device)
        keep = None
        if self.epoch >= 1 and len(labels) > 2:
            with torch.no_grad():
                keep = self.kept(embeddings.detach().float(), indices)
        self.remember(embeddings.detach().float(), indices)
        if keep is None:
            return embeddings, labels
        return embeddings[keep], labels[keep]

    def remember(self, embeddings: torch.Tensor, indices: torch.Tensor) -> None:
        old = self.memory[indices] * self.seen[indices, None]
        codes = self.labels[indices]
        self.sums.index_add_(0, codes, embeddings - old)
        self.memory[indices] = embeddings
        self.seen[indices] = True

    def kept(self, embeddings: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """(B,) True for the images the loss keeps: all but the `rate` share of lowest belief
        (2 at least)."""
        belief = self.belief(embeddings, indices)
        drop = min(int(self.rate * len(belief)), len(belief) - 2)
        keep = torch.ones(len(belief), dtype=torch.bool, device=embeddings.device)
        if drop > 0:
            keep[torch.as_tensor(np.argsort(belief, kind="stable")[:drop])] = False
        return keep

    def belief(self, embeddings: torch.Tensor, indices: torch.Tensor) -> np.ndarray:
        """(B,) the blended probability that each image's label is right: its class's mean
        (without its own remembered embedding) against the other classes', and its remembered
        neighbours' labels."""
        own = self.labels[indices]
        centres = nn.functional.normalize(self.sums, dim=1)
        cosines = embeddings @ centres.T  # (B, C)
        rest = self.sums[own] - self.memory[indices] * self.seen[indices, None]  # (B, D)
        mine = (embeddings * nn.functional.normalize(rest, dim=1)).sum(dim=1)
        cosines = cosines.scatter(1, own[:, None], float("nan"))
        empty = self.sums.abs().sum(dim=1) == 0  # classes not remembered yet: no centre
        cosines[:, empty] = float("nan")
        classes = doubt.class_share(mine.cpu().numpy(), cosines.cpu().numpy())
        sims = embeddings @ self.memory.T  # (B, N)
        sims[:, ~self.seen] = -torch.inf
        sims[torch.arange(len(indices)), indices] = -torch.inf  # never its own memory
        k = min(doubt.NEIGHBOURS, len(self.labels) - 1)
        near, rows = sims.topk(k, dim=1)  # (B, k)
        neighbours = doubt.neighbour_share(
            self.labels[rows].cpu().numpy(), torch.isfinite(near).cpu().numpy(), own.cpu().numpy()
        )
        return doubt.blend(classes, neighbours)


def label_doubt(
    rate: float, labels: np.ndarray, classes: int, dim: int, device: torch.device
) -> LabelDoubt | None:
    """The memory --drop-noisy keeps for `labels` (N,) codes of `classes` classes in `dim`
    dimensions; None when `rate` is 0."""
    if rate <= 0:
        return None
    n = len(labels)
    return LabelDoubt(
        labels=torch.as_tensor(np.asarray(labels, dtype=np.int64), device=device),
        memory=torch.zeros(n, dim, device=device),
        seen=torch.zeros(n, dtype=torch.bool, device=device),
        sums=torch.zeros(classes, dim, device=device),
        rate=rate,
    )
