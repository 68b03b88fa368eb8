"""Binary codes learned with the loss (`pactl train --bits N`): the quantisation term, the hash
centres, and the code losses that combine them with a metric-learning loss.

A network trained with --bits N ends in an N-d head whose outputs are centred at test on the
mean of those training saw (pactl.model.TrainingMean: each bit then splits the images about
evenly); its L2-normalised output u is the relaxed code and sign(u) the code. For N-bit codes
held as +-1 vectors b and c, cos(b, c) = 1 - 2 hamming(b, c) / N, so a loss on cosines is a
loss on Hamming distances once u is a normalised +-1 vector, that is once |u_i| = 1 / sqrt(N)
for every i. The quantisation term measures how far u is from there as 1 - cos(u, sign(u)) =
1 - |u|_1 / (|u|_2 sqrt(N)): 0 for a code, below 1 (HashNet, DPN and CSQ add such a term beside
their similarity loss). Two ways to learn codes (CODE_PROXIES):

- learned: the run's own loss (Proxy-Anchor by default) on u, its proxies learned as usual, plus
  `quantization` times the term on u and on the proxies;
- hadamard: fixed binary proxies, one hash centre per class (CSQ's: the rows of a Hadamard
  matrix and their negatives, any two of them at least N/2 bits apart), learned towards with
  OrthoHash's cross-entropy over cosines with a margin, plus the same term on u.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pactl.losses import build_loss


def quantization_loss(embeddings: Tensor) -> Tensor:
    """Mean over the rows of 1 - cos(x, sign(x)) = 1 - |x|_1 / (|x|_2 sqrt(D)): 0 where a row is
    a multiple of a +-1 code, up to 1 - 1/sqrt(D) for a row with one non-zero component.
    Computed in float32 (float64 for float64 input) with autocast off, like the losses."""
    if embeddings.dim() != 2 or embeddings.shape[0] == 0:
        raise ValueError(f"embeddings must be (B, D) with B >= 1, got {tuple(embeddings.shape)}")
    with torch.autocast(device_type=embeddings.device.type, enabled=False):
        x = embeddings.to(torch.promote_types(embeddings.dtype, torch.float32))
        l1 = x.abs().sum(dim=1)  # (B,)
        l2 = torch.linalg.vector_norm(x, dim=1).clamp_min(1e-12)  # (B,)
        return (1.0 - l1 / (l2 * math.sqrt(x.shape[1]))).mean()


def hadamard(size: int) -> Tensor:
    """Sylvester's (size, size) +-1 Hadamard matrix (rows pairwise orthogonal); size a power
    of 2."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"a Sylvester Hadamard matrix needs a power of 2, got {size}")
    h = torch.ones(1, 1)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


def hash_centres(num_classes: int, bits: int, generator: torch.Generator | None = None) -> Tensor:
    """(num_classes, bits) +-1 centres, CSQ's way: the rows of a bits x bits Hadamard matrix and
    their negatives while they suffice (bits a power of 2, at most 2 bits classes), any two at
    least bits/2 apart; else each bit +-1 at random from `generator` (bits/2 apart on average)."""
    if bits & (bits - 1) == 0 and num_classes <= 2 * bits:
        h = hadamard(bits)
        return torch.cat([h, -h], dim=0)[:num_classes].contiguous()
    draws = torch.randint(0, 2, (num_classes, bits), generator=generator)
    return draws.float().mul_(2).sub_(1)


class CodeLoss(nn.Module):
    """`base` on the relaxed codes plus `weight` times the quantisation term on them and on
    the base's proxies (which then lean to codes too)."""

    def __init__(self, base: nn.Module, weight: float) -> None:
        super().__init__()
        self.base = base
        self.weight = weight

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        loss = self.base(embeddings, labels)
        if self.weight:
            quantization = quantization_loss(embeddings)
            proxies = getattr(self.base, "proxies", None)
            if isinstance(proxies, Tensor):
                quantization = quantization + quantization_loss(proxies)
            loss = loss + self.weight * quantization
        return loss

    def extra_repr(self) -> str:
        return f"weight={self.weight}"


class CentreCosineLoss(nn.Module):
    """OrthoHash's objective (Hoe et al., NeurIPS 2021): softmax cross-entropy over the scaled
    cosines to fixed +-1 centres, the true class's cosine lowered by a margin,

        loss = mean_i -log softmax_k(scale (cos(x_i, c_k) - margin [k = y_i]))_{y_i},

    with its published defaults (scale 8, margin 0.2). The centres are a buffer: nothing to
    learn. Computed in float32 (float64 for float64 input) with autocast off."""

    def __init__(self, centres: Tensor, scale: float = 8.0, margin: float = 0.2) -> None:
        super().__init__()
        self.scale = scale
        self.margin = margin
        self.register_buffer("centres", centres.float())  # (C, bits) +-1

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        centres = self.centres
        assert isinstance(centres, Tensor)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            x = embeddings.to(torch.promote_types(embeddings.dtype, torch.float32))
            cos = F.normalize(x, dim=1) @ F.normalize(centres.to(x.dtype), dim=1).T  # (B, C)
            margins = F.one_hot(labels.long(), cos.shape[1]).to(cos.dtype) * self.margin
            return F.cross_entropy(self.scale * (cos - margins), labels.long())

    def extra_repr(self) -> str:
        centres = self.centres
        assert isinstance(centres, Tensor)
        num_classes, bits = centres.shape
        return f"num_classes={num_classes}, bits={bits}, scale={self.scale}, margin={self.margin}"


def _learned(
    loss: str, num_classes: int, bits: int, alpha: float, delta: float, weight: float
) -> nn.Module:
    return CodeLoss(build_loss(loss, num_classes, bits, alpha, delta), weight)


def _hadamard(
    loss: str, num_classes: int, bits: int, alpha: float, delta: float, weight: float
) -> nn.Module:
    generator = torch.Generator().manual_seed(bits * 1_000_003 + num_classes)
    return CodeLoss(CentreCosineLoss(hash_centres(num_classes, bits, generator)), weight)


# How a --bits network's proxies are made; each takes (loss, num_classes, bits, alpha, delta,
# quantisation weight). `hadamard` has a loss of its own: --loss, --alpha and --delta are the
# learned proxies' (pactl.recipe.describe_codes says so).
CODE_PROXIES: dict[str, Callable[[str, int, int, float, float, float], nn.Module]] = {
    "learned": _learned,
    "hadamard": _hadamard,
}


def build_code_loss(
    proxies: str,
    loss: str,
    num_classes: int,
    bits: int,
    alpha: float = 32.0,
    delta: float = 0.1,
    weight: float = 0.0,
) -> nn.Module:
    """The code loss registered as `proxies`; KeyError listing the choices for an unknown one."""
    if proxies not in CODE_PROXIES:
        raise KeyError(f"unknown code proxies {proxies!r}; choices: {', '.join(CODE_PROXIES)}")
    return CODE_PROXIES[proxies](loss, num_classes, bits, alpha, delta, weight)
