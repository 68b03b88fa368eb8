"""Proxy-Anchor loss (Kim et al., CVPR 2020, arXiv 2003.13911) and the baselines it is compared to.

Every loss here is a module with ``forward(embeddings, labels) -> scalar``. The math runs in at
least float32 with autocast switched off inside, because exp(32 * 1.1) overflows half precision;
inputs are cast, parameters are never changed. Modules that learn proxies keep them in a
parameter named ``proxies``, which optimizer_groups gives their own learning rate.

The modules are public (`from pactl import ProxyAnchorLoss`, docs/api.md): each takes the
arguments of pytorch-metric-learning's class of the same name, with its defaults, and computes
what that class computes (tests/test_losses_pml.py holds them to it). `pactl train` builds them
through LOSSES with its own settings; TripletLoss and CosineContrastiveLoss are the triplet and
contrastive variants it trains with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pactl.arguments import ANY, checked


def _math_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 stays float64 (for gradcheck); anything narrower is computed in float32."""
    dtype = torch.float32
    for tensor in tensors:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def _no_autocast(device: torch.device) -> AbstractContextManager[Any]:
    return torch.autocast(device_type=device.type, enabled=False)


def _check_batch(embeddings: Tensor, labels: Tensor) -> None:
    if embeddings.dim() != 2 or embeddings.shape[0] == 0:
        raise ValueError(f"embeddings must be (B, D) with B >= 1, got {tuple(embeddings.shape)}")
    if labels.shape != embeddings.shape[:1]:
        raise ValueError(
            f"labels must be ({embeddings.shape[0]},) to match the embeddings, "
            f"got {tuple(labels.shape)}"
        )


def _check_proxies(proxies: Tensor, embeddings: Tensor) -> None:
    if proxies.dim() != 2 or proxies.shape[1] != embeddings.shape[1] or proxies.shape[0] == 0:
        raise ValueError(
            f"proxies must be (C, {embeddings.shape[1]}) with C >= 1 to match the embeddings, "
            f"got {tuple(proxies.shape)}"
        )


def _cosine_to_proxies(embeddings: Tensor, proxies: Tensor) -> Tensor:
    """(B, C) cosine similarities, in the math dtype; call with autocast disabled."""
    _check_proxies(proxies, embeddings)
    dtype = _math_dtype(embeddings, proxies)
    x = F.normalize(embeddings.to(dtype), dim=1)
    p = F.normalize(proxies.to(dtype), dim=1)
    return x @ p.T


def _cosine_within_batch(embeddings: Tensor) -> Tensor:
    """(B, B) cosine similarities between the batch's embeddings; call with autocast disabled."""
    x = F.normalize(embeddings.to(_math_dtype(embeddings)), dim=1)
    return x @ x.T


def _log1p_sum_exp(values: Tensor, keep: Tensor, dim: int) -> Tensor:
    """log(1 + sum of exp(values) where keep) along dim, as a log-sum-exp with a zero prepended.

    Dropped entries become -inf, so they contribute exactly 0 to the value and the gradient.
    """
    masked = values.masked_fill(~keep, float("-inf"))
    zero = masked.new_zeros(()).expand_as(masked.narrow(dim, 0, 1))
    return torch.logsumexp(torch.cat([zero, masked], dim=dim), dim=dim)


def _column_shift(logits: Tensor, alpha: float, delta: float) -> Tensor:
    """A shift >= every exponent alpha * (cos + delta) of its column and >= 0 (the "1" in the log).

    Since cos <= 1, alpha * (1 + delta) bounds every column. While exp of everything shifted by
    that constant (which lies in [-2 alpha, 0]) stays a normal number, the constant serves and
    saves a pass over (B, C); otherwise each column is shifted by its own largest exponent.
    """
    bound = alpha * (1.0 + delta)
    if max(2.0 * alpha, bound) <= -0.9 * math.log(torch.finfo(logits.dtype).tiny):
        return logits.new_full((), max(bound, 0.0))
    return (logits.amax(dim=0) + alpha * delta).clamp_(min=0.0)  # (C,)


def _negative_term(logits: Tensor, labels: Tensor, alpha: float, delta: float) -> Tensor:
    """1/C sum_p log(1 + sum_{i: y_i != p} exp(alpha (cos_ip + delta))) from logits = alpha * cos.

    Overwrites logits (B, C) with the term's gradient with respect to cos, 0 at positive entries
    (which are masked out before the per-column max, lest they alone set the shift).
    """
    num_classes = logits.shape[1]
    rows = torch.arange(logits.shape[0], device=logits.device)
    logits[rows, labels] = float("-inf")  # a sample is not a negative of its own proxy
    shift = _column_shift(logits, alpha, delta)
    scaled = logits.add_(alpha * delta - shift).exp_()  # (B, C) exp(exponent - shift)
    denom = scaled.sum(dim=0).add_(torch.exp(-shift))  # (C,) exp(-shift) * (1 + sum exp)
    scaled.mul_(alpha / (num_classes * denom))  # softmax weight times the exponent's slope
    return (shift + torch.log(denom)).sum() / num_classes


def _positive_term(
    pos_logits: Tensor, labels: Tensor, num_classes: int, alpha: float, delta: float
) -> tuple[Tensor, Tensor]:
    """1/|P+| sum_{p in P+} log(1 + sum_{i: y_i = p} exp(-alpha (cos_ip - delta))).

    pos_logits (B,) is alpha * cos(x_i, p_{y_i}); only these B entries are involved. Proxies
    without positives get log(1) = 0. Returns the term and its gradient with respect to them.
    """
    exponent = alpha * delta - pos_logits  # (B,)
    shift = pos_logits.new_zeros(num_classes).scatter_reduce_(
        0, labels, exponent, reduce="amax", include_self=True
    )  # (C,) >= 0 and >= the exponents of its positives
    scaled = torch.exp(exponent - shift[labels])  # (B,)
    denom = torch.exp(-shift).index_add_(0, labels, scaled)  # (C,)
    num_with_pos = pos_logits.new_zeros(num_classes).index_fill_(0, labels, 1.0).sum()
    term = (shift + torch.log(denom)).sum() / num_with_pos
    return term, scaled / denom[labels] * (-alpha / num_with_pos)


def _inverse_norms(rows: Tensor) -> Tensor:
    """(N,) 1 / max(|row|, 1e-12): the scaling F.normalize applies."""
    return torch.linalg.vector_norm(rows, dim=1).clamp_min_(1e-12).reciprocal_()


def _through_normalize(h: Tensor, raw: Tensor, inv: Tensor) -> Tensor:
    """d loss / d raw for unit = raw * inv (per row), given h = inv * d loss / d unit.

    The Jacobian of normalising removes the row's own direction: h - raw inv^2 (raw . h).
    Overwrites h.
    """
    along = torch.linalg.vecdot(raw, h) * inv * inv  # (N,)
    return h.addcmul_(raw, along[:, None], value=-1.0)


class _ProxyAnchor(torch.autograd.Function):
    """Eq. 4 of the paper from raw embeddings and proxies, normalising both, by hand both ways.

    Autograd through F.normalize and masked log-sum-exps would make many passes over (C, D)
    and (B, C) temporaries. Here the proxies are never normalised into a copy: their inverse
    norms scale the columns of the product instead, the product's own output is turned in
    place into d loss / d cos (columns scaled by the same inverse norms), and the backward
    needs two matrix products plus two cheap passes over (C, D). The backward leaves what it
    saved untouched, so a retained graph can be differentiated again.
    """

    @staticmethod
    def forward(
        ctx: Any, emb: Tensor, prox: Tensor, labels: Tensor, alpha: float, delta: float
    ) -> Tensor:
        rows = torch.arange(emb.shape[0], device=emb.device)
        inv_x, inv_p = _inverse_norms(emb), _inverse_norms(prox)  # (B,), (C,)
        x = emb * (inv_x * alpha)[:, None]  # (B, D) alpha * unit embeddings
        logits = (x @ prox.T).mul_(inv_p)  # (B, C) alpha * cos, later its gradient
        pos_term, pos_grad = _positive_term(
            logits[rows, labels], labels, prox.shape[0], alpha, delta
        )
        neg_term = _negative_term(logits, labels, alpha, delta)
        logits[rows, labels] = pos_grad  # the negative gradient is 0 there
        grad_cos = logits.mul_(inv_p)  # (B, C) d loss / d cos, columns over |p|
        ctx.save_for_backward(emb, prox, inv_x, inv_p, grad_cos)
        return pos_term + neg_term

    @staticmethod
    def backward(
        ctx: Any, grad_out: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        emb, prox, inv_x, inv_p, grad_cos = ctx.saved_tensors
        grad_emb = grad_prox = None
        # grad_out is a scalar: fold it into the small (B, D) side of each product.
        if ctx.needs_input_grad[0]:
            h_x = (grad_cos @ prox).mul_((inv_x * grad_out)[:, None])  # (B, D)
            grad_emb = _through_normalize(h_x, emb, inv_x)
        if ctx.needs_input_grad[1]:
            unit_x = emb * (inv_x * grad_out)[:, None]  # (B, D)
            grad_prox = _through_normalize(grad_cos.T @ unit_x, prox, inv_p)  # (C, D)
        return grad_emb, grad_prox, None, None, None


def proxy_anchor_loss(
    embeddings: Tensor,
    labels: Tensor,
    proxies: Tensor,
    alpha: float = 32.0,
    delta: float = 0.1,
) -> Tensor:
    """Proxy-Anchor loss, eq. 4 of Kim et al. (CVPR 2020).

    embeddings (B, D) and proxies (C, D) are compared by cosine similarity s(x, p) after L2
    normalisation; labels (B,) hold class indices in [0, C).

        loss = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (s(x, p) - delta)))
             + 1/|P|  sum_{p in P}  log(1 + sum_{x in X_p-} exp( alpha (s(x, p) + delta)))

    P+ are the proxies with at least one positive in the batch, P all C proxies. Each
    log(1 + sum exp) is computed in shifted log-sum-exp form; entries outside a sum get exactly
    zero gradient. Returns a 0-d tensor in float32 (float64 when an input is float64), whatever
    autocast is active.
    """
    _check_batch(embeddings, labels)
    _check_proxies(proxies, embeddings)
    if not (math.isfinite(alpha) and alpha > 0 and math.isfinite(delta)):  # NaN > 0 is False
        raise ValueError(f"alpha must be > 0 and finite, delta finite; got {alpha}, {delta}")
    with _no_autocast(embeddings.device):
        dtype = _math_dtype(embeddings, proxies)
        emb, prox = embeddings.to(dtype), proxies.to(dtype)
        loss = _ProxyAnchor.apply(emb, prox, labels.long(), float(alpha), float(delta))
    assert isinstance(loss, Tensor)
    return loss


def _init_proxies(proxies: Tensor, generator: torch.Generator | None) -> None:
    # The paper's code initialises proxies with Kaiming normal over fan-out.
    nn.init.kaiming_normal_(proxies, mode="fan_out", generator=generator)


class ProxyAnchorLoss(nn.Module):
    """Proxy-Anchor loss (:func:`proxy_anchor_loss`) with one learnable proxy per class.

    `margin` is the paper's delta, `alpha` its scale; the proxies start Kaiming-normal over
    fan-out, as the paper's code and pytorch-metric-learning start them. Called as
    ``loss(embeddings, labels)``: embeddings (B, embedding_size), labels (B,) in [0, num_classes).
    """

    @checked()
    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: float = 0.1,
        alpha: float = 32.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.margin = margin
        self.alpha = alpha
        self.proxies = nn.Parameter(torch.empty(num_classes, embedding_size))  # (C, D)
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        _init_proxies(self.proxies.data, generator)

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        return proxy_anchor_loss(embeddings, labels, self.proxies, self.alpha, self.margin)

    def extra_repr(self) -> str:
        num_classes, size = self.proxies.shape
        return (
            f"num_classes={num_classes}, embedding_size={size}, margin={self.margin}, "
            f"alpha={self.alpha}"
        )


class ProxyNCALoss(nn.Module):
    """Proxy-NCA (Movshovitz-Attias et al., ICCV 2017) in the form the Proxy-Anchor paper compares.

    Cross-entropy of a softmax over -softmax_scale * ||x - p||^2 for all C proxies, with x and
    p L2-normalised (so ||x - p||^2 = 2 - 2 cos). The positive proxy is in the denominator, as in
    the comparison's implementation and pytorch-metric-learning's; the 2017 paper leaves it out.
    pactl train's proxy_nca uses --alpha as the scale (32 in the Proxy-Anchor paper's
    comparison). The proxies start Kaiming-normal: the same directions as a plain normal start.
    """

    @checked()
    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        softmax_scale: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.softmax_scale = softmax_scale
        self.proxies = nn.Parameter(torch.empty(num_classes, embedding_size))  # (C, D)
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        _init_proxies(self.proxies.data, generator)

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        _check_batch(embeddings, labels)
        with _no_autocast(embeddings.device):
            cos = _cosine_to_proxies(embeddings, self.proxies)  # (B, C)
            logits = (2.0 - 2.0 * cos) * -self.softmax_scale  # (B, C) scaled -distance^2
            return F.cross_entropy(logits, labels.long())


def _pair_masks(labels: Tensor) -> tuple[Tensor, Tensor]:
    """(B, B) masks of positive pairs (same label, not the same sample) and negative pairs."""
    same = labels[:, None] == labels[None, :]
    self_pair = torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
    return same & ~self_pair, ~same


class MultiSimilarityLoss(nn.Module):
    """Multi-Similarity loss (Wang et al., CVPR 2019) on cosine similarity, with the paper's pair
    mining when `epsilon` is given (pactl train's multi_similarity: 0.1).

    Mining (on detached similarities): a negative pair is kept if S_ij + epsilon > the anchor's
    smallest positive similarity, a positive pair if S_ik - epsilon < its largest negative one.
    Without `epsilon` every pair counts: pytorch-metric-learning's MultiSimilarityLoss alone;
    with it, that loss given its MultiSimilarityMiner(epsilon)'s pairs, except where mining
    leaves at most one pair of each kind: there pml's loss is 0, and this one counts them.

        loss = mean_i [ 1/alpha log(1 + sum_{kept pos} exp(-alpha (S_ik - base)))
                      + 1/beta  log(1 + sum_{kept neg} exp( beta  (S_ij - base))) ]

    base (the paper's lambda) defaults to 0.5, the threshold of the authors' released training
    code and the common default; the paper's text reports lambda = 1. The mean runs over all B
    anchors; an anchor left without mined pairs contributes 0.
    """

    @checked()
    def __init__(
        self,
        alpha: float = 2.0,
        beta: float = 50.0,
        base: float = 0.5,
        epsilon: float | None = None,
    ) -> None:
        super().__init__()
        self.alpha = alpha
        self.beta = beta
        self.base = base
        self.epsilon = epsilon

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        _check_batch(embeddings, labels)
        with _no_autocast(embeddings.device):
            sim = _cosine_within_batch(embeddings)  # (B, B)
            keep_pos, keep_neg = _pair_masks(labels)
            if self.epsilon is not None:
                keep_pos, keep_neg = _mined_pairs(sim.detach(), keep_pos, keep_neg, self.epsilon)
            pos_loss = _log1p_sum_exp(-self.alpha * (sim - self.base), keep_pos, 1) / self.alpha
            neg_loss = _log1p_sum_exp(self.beta * (sim - self.base), keep_neg, 1) / self.beta
            return (pos_loss + neg_loss).mean()


def _mined_pairs(sim: Tensor, pos: Tensor, neg: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """The Multi-Similarity paper's informative pairs among the (B, B) masks pos and neg. A
    comparison with NaN keeps the pair (written as "not outside"), so NaN reaches the loss."""
    hardest_pos = sim.masked_fill(~pos, float("inf")).amin(dim=1, keepdim=True)
    hardest_neg = sim.masked_fill(~neg, float("-inf")).amax(dim=1, keepdim=True)
    return pos & ~(sim - epsilon >= hardest_neg), neg & ~(sim + epsilon <= hardest_pos)


class TripletLoss(nn.Module):
    """Triplet loss on cosine similarity with batch-hard mining (Hermans et al., 2017).

    For each anchor: the positive with the lowest similarity and the negative with the highest,
    loss_i = max(0, S_an - S_ap + margin). The mean runs over anchors that have at least one
    positive and one negative in the batch; with none, the loss is 0. pactl train's triplet:
    pytorch-metric-learning's TripletMarginLoss(margin, distance=CosineSimilarity(),
    reducer=MeanReducer()) given its BatchHardMiner's triplets.
    """

    @checked()
    def __init__(self, margin: float = 0.1) -> None:
        super().__init__()
        self.margin = margin

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        _check_batch(embeddings, labels)
        with _no_autocast(embeddings.device):
            sim = _cosine_within_batch(embeddings)  # (B, B)
            pos, neg = _pair_masks(labels)
            valid = pos.any(dim=1) & neg.any(dim=1)  # (B,)
            hardest_pos = sim.masked_fill(~pos, float("inf")).amin(dim=1)
            hardest_neg = sim.masked_fill(~neg, float("-inf")).amax(dim=1)
            # Invalid anchors hold +-inf; select before the sum so they add nothing, not NaN.
            hinge = F.relu(hardest_neg - hardest_pos + self.margin)
            hinge = torch.where(valid, hinge, sim.new_zeros(()))
            return hinge.sum() / valid.sum().clamp(min=1)


class TripletMarginLoss(nn.Module):
    """Triplet margin loss over every triplet of the batch, pytorch-metric-learning's default.

    For each anchor a, positive p (same label, p != a) and negative n (another label), on the
    distance d of L2-normalised embeddings: loss_apn = max(0, d_ap - d_an + margin), averaged
    over the triplets whose loss is above 0 (0 when none is). Memory grows as B^3.
    """

    @checked()
    def __init__(self, margin: float = 0.05) -> None:
        super().__init__()
        self.margin = margin

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        _check_batch(embeddings, labels)
        with _no_autocast(embeddings.device):
            dist = _distance_within_batch(embeddings)  # (B, B)
            pos, neg = _pair_masks(labels)
            triplets = pos[:, :, None] & neg[:, None, :]  # (B, B, B) anchor, positive, negative
            violation = dist[:, :, None] - dist[:, None, :] + self.margin
            return _mean_above_zero(F.relu(violation) * triplets)


class ContrastiveLoss(nn.Module):
    """Contrastive loss (Hadsell et al., 2006), pytorch-metric-learning's default form.

    On the distance d of L2-normalised embeddings, over ordered pairs (i, j), i != j:
    max(0, d - pos_margin) for each positive pair and max(0, neg_margin - d) for each negative
    one, each kind averaged over its pairs whose loss is above 0, the two averages added.
    """

    @checked()
    def __init__(self, pos_margin: float = 0.0, neg_margin: float = 1.0) -> None:
        super().__init__()
        self.pos_margin = pos_margin
        self.neg_margin = neg_margin

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        _check_batch(embeddings, labels)
        with _no_autocast(embeddings.device):
            dist = _distance_within_batch(embeddings)  # (B, B)
            pos, neg = _pair_masks(labels)
            pos_loss = _mean_above_zero(F.relu(dist - self.pos_margin) * pos)
            return pos_loss + _mean_above_zero(F.relu(self.neg_margin - dist) * neg)


def _distance_within_batch(embeddings: Tensor) -> Tensor:
    """(B, B) Euclidean distances of the L2-normalised embeddings, sqrt(2 - 2 cos); where one is
    0 its gradient is 0 (as torch.cdist's), not the infinite slope of sqrt at 0. A NaN stays NaN
    (a NaN embedding's distances are no distance of 0), so the loss is NaN as pml's is."""
    squared = (2.0 - 2.0 * _cosine_within_batch(embeddings)).clamp_min(0.0)
    same = squared == 0
    return torch.where(same, 0.0, squared.masked_fill(same, 1.0).sqrt())


def _mean_above_zero(losses: Tensor) -> Tensor:
    """The mean of the entries above 0, or 0 when there are none."""
    return losses.sum() / (losses > 0).sum().clamp(min=1)


class CosineContrastiveLoss(nn.Module):
    """Contrastive loss on cosine distance d = 1 - cos, pactl train's contrastive.

        loss = mean_{pos pairs} max(0, d - pos_margin) + mean_{neg pairs} max(0, neg_margin - d)

    Pairs are ordered (i, j) with i != j; each mean runs over all pairs of its kind, and a kind
    absent from the batch contributes 0.
    """

    @checked()
    def __init__(self, pos_margin: float = 0.0, neg_margin: float = 0.5) -> None:
        super().__init__()
        self.pos_margin = pos_margin
        self.neg_margin = neg_margin

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        _check_batch(embeddings, labels)
        with _no_autocast(embeddings.device):
            dist = 1.0 - _cosine_within_batch(embeddings)  # (B, B)
            pos, neg = _pair_masks(labels)
            pos_loss = (F.relu(dist - self.pos_margin) * pos).sum() / pos.sum().clamp(min=1)
            neg_loss = (F.relu(self.neg_margin - dist) * neg).sum() / neg.sum().clamp(min=1)
            return pos_loss + neg_loss


# Each constructor takes (num_classes, dim, alpha, delta). proxy_nca uses alpha as its softmax
# scale (32 in the Proxy-Anchor paper's comparison); the proxy-free losses keep their own
# published defaults and ignore all four.
LOSSES: dict[str, Callable[[int, int, float, float], nn.Module]] = {
    "proxy_anchor": lambda num_classes, dim, alpha, delta: ProxyAnchorLoss(
        num_classes, dim, margin=delta, alpha=alpha
    ),
    "proxy_nca": lambda num_classes, dim, alpha, delta: ProxyNCALoss(
        num_classes, dim, softmax_scale=alpha
    ),
    "multi_similarity": lambda num_classes, dim, alpha, delta: MultiSimilarityLoss(epsilon=0.1),
    "triplet": lambda num_classes, dim, alpha, delta: TripletLoss(),
    "contrastive": lambda num_classes, dim, alpha, delta: CosineContrastiveLoss(),
}


def build_loss(
    name: str, num_classes: int, dim: int, alpha: float = 32.0, delta: float = 0.1
) -> nn.Module:
    """The loss module registered as name; KeyError listing the choices for an unknown one."""
    if name not in LOSSES:
        raise KeyError(f"unknown loss {name!r}; choices: {', '.join(sorted(LOSSES))}")
    return LOSSES[name](num_classes, dim, alpha, delta)


@checked(model=ANY)
def optimizer_groups(
    model: nn.Module | Sequence[dict[str, Any]],
    loss: nn.Module,
    lr: float,
    proxy_lr_mult: float = 100.0,
) -> list[dict[str, Any]]:
    """Parameter groups for a torch optimizer: the model's parameters at `lr` (a module, or
    groups of its parameters as dicts, each at `lr` unless it names its own), then the loss's
    proxies, when it has any, at lr x proxy_lr_mult (100 in the Proxy-Anchor paper)."""
    if isinstance(model, nn.Module):
        model = [{"params": model.parameters()}]
    groups = [
        {**group, "params": list(group["params"]), "lr": group.get("lr", lr)} for group in model
    ]
    proxies = list(loss.parameters())
    if proxies:
        groups.append({"params": proxies, "lr": lr * proxy_lr_mult})
    return groups
