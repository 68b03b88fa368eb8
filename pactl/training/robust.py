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

--drop-noisy auto guesses no rate: at the start of each epoch from the second on, every
remembered image is asked the same two things, and the noise rate of each class is estimated
from the labels of the same nearest remembered images (pactl.audit.noise_rate, Confident
Learning's count; a class with no confident image takes the overall rate). In each class, that
share of its remembered images, those of lowest belief, is left out of the epoch's loss, and
the epoch's row of metrics.csv records the overall rate and the count (noise_rate, dropped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pactl.audit import doubt
from pactl.audit.noise_rate import NoiseEstimate, estimate_noise
from pactl.rules import AUTO

CHUNK = 2048  # remembered images asked at once by --drop-noisy auto ((CHUNK, N) similarities)


@dataclass(frozen=True)
class Judged:
    """--drop-noisy auto's choice for one epoch: the estimate and the rows left out."""

    estimate: NoiseEstimate
    left_out: np.ndarray  # (N,) bool over the training images
    asked: int  # remembered images the estimate was made on

    @property
    def dropped(self) -> int:
        return int(self.left_out.sum())

    def words(self, epoch: int) -> str:
        return (
            f"epoch {epoch + 1}: --drop-noisy auto: estimated noise rate "
            f"{self.estimate.overall:.3f}; {self.dropped:,} of {self.asked:,} training images "
            "left out of its loss"
        )


@dataclass
class LabelDoubt:
    """The memory and the share to leave out; built by label_doubt()."""

    labels: torch.Tensor  # (N,) int64 codes the run trains with
    memory: torch.Tensor  # (N, D) float32 last embedding of each training image
    seen: torch.Tensor  # (N,) bool
    sums: torch.Tensor  # (C, D) sum of the remembered embeddings of each class
    rate: float | str  # a share of each batch, or "auto"
    epoch: int = 0  # set by the epoch: the memory is asked from epoch 1 (the second) on
    judged: Judged | None = None  # auto: this epoch's choice (None before the second epoch)

    def start_epoch(self, epoch: int) -> Judged | None:
        """Set the epoch; for auto from the second epoch on, choose the rows it leaves out."""
        self.epoch = epoch
        self.judged = self.judge() if self.rate == AUTO and epoch >= 1 else None
        return self.judged

    def select(
        self, embeddings: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's (embeddings, labels) without its most doubted share; the memory updated."""
        indices = indices.to(self.memory.device)
        keep = None
        if self.judged is not None:
            keep = ~torch.as_tensor(self.judged.left_out, device=indices.device)[indices]
            keep = keep if int(keep.sum()) >= 2 else None  # a loss needs two images
        elif self.epoch >= 1 and len(labels) > 2 and self.rate != AUTO:
            with torch.no_grad():
                keep = self.kept(embeddings.detach().float(), indices)
        self.remember(embeddings.detach().float(), indices)
        if keep is None:
            return embeddings, labels
        return embeddings[keep], labels[keep]

    @torch.no_grad()
    def judge(self) -> Judged:
        """Every remembered image's belief and nearest remembered labels (CHUNK at a time), the
        noise rate of each class estimated from those labels, and in each class that share of
        its images, of lowest belief, left out (a class keeps one image at least)."""
        rows = torch.nonzero(self.seen).flatten()
        beliefs, near = [], []
        for start in range(0, len(rows), CHUNK):
            part = rows[start : start + CHUNK]
            belief, labels = self.witnesses(self.memory[part], part)
            beliefs.append(belief)
            near.append(labels)
        given = self.labels[rows].cpu().numpy()
        left_out = np.zeros(len(self.labels), dtype=bool)
        if not len(rows):
            empty = estimate_noise(np.zeros((0, 1), np.int64), given, len(self.sums))
            return Judged(empty, left_out, 0)
        belief = np.concatenate(beliefs)
        estimate = estimate_noise(np.concatenate(near), given, len(self.sums))
        rates = np.where(np.isnan(estimate.per_class), estimate.overall, estimate.per_class)
        chosen = rows.cpu().numpy()
        for c in np.unique(given):
            mine = np.flatnonzero(given == c)
            count = min(round(float(rates[c]) * len(mine)), len(mine) - 1)
            order = mine[np.argsort(belief[mine], kind="stable")]
            left_out[chosen[order[:count]]] = True
        return Judged(estimate, left_out, len(rows))

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
        drop = min(int(float(self.rate) * len(belief)), len(belief) - 2)
        keep = torch.ones(len(belief), dtype=torch.bool, device=embeddings.device)
        if drop > 0:
            keep[torch.as_tensor(np.argsort(belief, kind="stable")[:drop])] = False
        return keep

    def belief(self, embeddings: torch.Tensor, indices: torch.Tensor) -> np.ndarray:
        """(B,) the blended probability that each image's label is right: its class's mean
        (without its own remembered embedding) against the other classes', and its remembered
        neighbours' labels."""
        return self.witnesses(embeddings, indices)[0]

    def witnesses(
        self, embeddings: torch.Tensor, indices: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray]:
        """belief's (B,), and (B, k) the labels of each image's k nearest remembered images
        (-1: none), never its own memory."""
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
        found = torch.isfinite(near).cpu().numpy()
        labels = np.where(found, self.labels[rows].cpu().numpy(), -1)
        neighbours = doubt.neighbour_share(labels, found, own.cpu().numpy())
        return doubt.blend(classes, neighbours), labels


def label_doubt(
    rate: float | str, labels: np.ndarray, classes: int, dim: int, device: torch.device
) -> LabelDoubt | None:
    """The memory --drop-noisy keeps for `labels` (N,) codes of `classes` classes in `dim`
    dimensions; None when `rate` is 0."""
    if rate != AUTO and float(rate) <= 0:
        return None
    n = len(labels)
    return LabelDoubt(
        labels=torch.as_tensor(np.asarray(labels, dtype=np.int64), device=device),
        memory=torch.zeros(n, dim, device=device),
        seen=torch.zeros(n, dtype=torch.bool, device=device),
        sums=torch.zeros(classes, dim, device=device),
        rate=rate,
    )
