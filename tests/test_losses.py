"""Losses against plain float64 transcriptions of their papers' formulas and hand-computed cases."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from pactl.losses import (
    LOSSES,
    CosineContrastiveLoss,
    MultiSimilarityLoss,
    ProxyAnchorLoss,
    ProxyNCALoss,
    TripletLoss,
    build_loss,
    proxy_anchor_loss,
)

Matrix = list[list[float]]


def unit_rows(t: Tensor) -> Matrix:
    rows = t.double().tolist()
    return [[v / math.sqrt(sum(u * u for u in row)) for v in row] for row in rows]


def dot(a: list[float], b: list[float]) -> float:
    return sum(u * v for u, v in zip(a, b, strict=True))


def cosines(a: Tensor, b: Tensor) -> Matrix:
    ua, ub = unit_rows(a), unit_rows(b)
    return [[dot(x, p) for p in ub] for x in ua]


def log1p_sum_exp(terms: list[float]) -> float:
    """log(1 + sum exp(t)) in float64, shifted by the largest exponent (0 for the "1")."""
    top = max([0.0, *terms])
    return top + math.log(math.exp(-top) + sum(math.exp(t - top) for t in terms))


def reference_proxy_anchor(
    x: Tensor, y: Tensor, proxies: Tensor, alpha: float, delta: float
) -> float:
    """Eq. 4 of Kim et al. (CVPR 2020), written out term by term."""
    s = cosines(x, proxies)
    labels = y.tolist()
    num_classes = proxies.shape[0]
    with_pos = sorted(set(labels))
    pos = 0.0
    for p in with_pos:
        terms = [-alpha * (s[i][p] - delta) for i in range(len(labels)) if labels[i] == p]
        pos += log1p_sum_exp(terms)
    neg = 0.0
    for p in range(num_classes):
        terms = [alpha * (s[i][p] + delta) for i in range(len(labels)) if labels[i] != p]
        neg += log1p_sum_exp(terms)
    return pos / len(with_pos) + neg / num_classes


def random_case(
    seed: int, batch: int, classes: int, dim: int, num_labels: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, dim, generator=gen, dtype=torch.float64) * 3.0
    proxies = torch.randn(classes, dim, generator=gen, dtype=torch.float64)
    y = torch.randint(0, num_labels or classes, (batch,), generator=gen)
    return x, y, proxies


PA_CASES = [
    # seed, batch, classes, dim, labels drawn from the first n classes (others have no positives)
    (0, 8, 5, 4, None),
    (1, 12, 30, 6, None),  # most proxies without positives
    (2, 6, 4, 3, 1),  # a batch of a single class
    (3, 1, 3, 2, None),  # one sample
    (4, 16, 6, 8, 3),
]


@pytest.mark.parametrize(("seed", "batch", "classes", "dim", "num_labels"), PA_CASES)
# alpha 64 (float32) and 400 (float64) take the per-column max shift instead of the constant one.
@pytest.mark.parametrize(("alpha", "delta"), [(32.0, 0.1), (8.0, 0.3), (64.0, 0.1), (400.0, 0.05)])
def test_proxy_anchor_matches_paper_equation(
    seed: int,
    batch: int,
    classes: int,
    dim: int,
    num_labels: int | None,
    alpha: float,
    delta: float,
) -> None:
    x, y, proxies = random_case(seed, batch, classes, dim, num_labels)
    expected = reference_proxy_anchor(x, y, proxies, alpha, delta)
    got64 = proxy_anchor_loss(x, y, proxies, alpha, delta)
    assert got64.dtype == torch.float64
    assert got64.item() == pytest.approx(expected, rel=1e-6)
    got32 = proxy_anchor_loss(x.float(), y, proxies.float(), alpha, delta)
    assert got32.dtype == torch.float32
    assert got32.item() == pytest.approx(expected, rel=1e-5)


def at_angle(degrees: float, radius: float = 1.0) -> list[float]:
    return [radius * math.cos(math.radians(degrees)), radius * math.sin(math.radians(degrees))]


def test_proxy_anchor_hand_computed_2d() -> None:
    # x0 at 0 deg (length 2), x1 at 90 deg (length 0.5); proxies at 30, 120 and 225 deg.
    x = torch.tensor([at_angle(0, 2.0), at_angle(90, 0.5)], dtype=torch.float64)
    proxies = torch.tensor([at_angle(30), at_angle(120, 3.0), at_angle(225)], dtype=torch.float64)
    y = torch.tensor([0, 1])
    a, d = 32.0, 0.1
    c30, c60, c120, c135 = math.sqrt(3) / 2, 0.5, -0.5, -math.sqrt(2) / 2
    # Positives: x0 with proxy 0 (30 deg apart), x1 with proxy 1 (30 deg apart); proxy 2 has none.
    pos = (math.log(1 + math.exp(-a * (c30 - d))) + math.log(1 + math.exp(-a * (c30 - d)))) / 2
    neg = (
        math.log(1 + math.exp(a * (c60 + d)))  # proxy 0: x1, 60 deg away
        + math.log(1 + math.exp(a * (c120 + d)))  # proxy 1: x0, 120 deg away
        + math.log(1 + math.exp(a * (c135 + d)) + math.exp(a * (c135 + d)))  # proxy 2: both
    ) / 3
    got = proxy_anchor_loss(x, y, proxies, alpha=a, delta=d)
    assert got.item() == pytest.approx(pos + neg, rel=1e-12)


@pytest.mark.parametrize(
    ("seed", "batch", "classes", "num_labels"), [(5, 6, 5, None), (6, 5, 4, 1)]
)
def test_proxy_anchor_gradcheck(
    seed: int, batch: int, classes: int, num_labels: int | None
) -> None:
    x, y, proxies = random_case(seed, batch, classes, 3, num_labels)
    x.requires_grad_()
    proxies.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda e, p: proxy_anchor_loss(e, y, p, alpha=4.0, delta=0.1), (x, proxies)
    )


def test_proxy_anchor_gradient_with_per_column_shift() -> None:
    # alpha = 64 shifts float32 per column, float64 by a constant: the gradients must agree.
    x, y, proxies = random_case(7, 10, 6, 4)
    grads = []
    for dtype in (torch.float64, torch.float32):
        xd, pd = x.to(dtype).requires_grad_(), proxies.to(dtype).requires_grad_()
        grads.append(torch.autograd.grad(proxy_anchor_loss(xd, y, pd, alpha=64.0), (xd, pd)))
    for want, got in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)


def test_proxy_anchor_backward_twice_with_retained_graph() -> None:
    x, y, proxies = random_case(7, 6, 4, 3)
    x.requires_grad_()
    loss = proxy_anchor_loss(x, y, proxies)
    (first,) = torch.autograd.grad(loss, x, retain_graph=True)
    (second,) = torch.autograd.grad(loss, x)
    assert torch.equal(first, second)


def extreme_case(dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """Embeddings equal to their own proxy, opposite to it, and equal to another class's proxy."""
    gen = torch.Generator().manual_seed(8)
    proxies = torch.randn(4, 8, generator=gen)
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    x = torch.stack([proxies[0], -proxies[1], proxies[3], -proxies[3], 7 * proxies[2], proxies[1]])
    return x.to(dtype), y, proxies.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_proxy_anchor_half_precision_inputs(dtype: torch.dtype) -> None:
    x, y, proxies = extreme_case(dtype)
    x.requires_grad_()
    proxies.requires_grad_()
    loss = proxy_anchor_loss(x, y, proxies)
    assert loss.dtype == torch.float32
    assert torch.isfinite(loss)
    # The half inputs are exact in float64, so the float32 math must match the reference.
    expected = reference_proxy_anchor(x.detach(), y, proxies.detach(), 32.0, 0.1)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    grad_x, grad_p = torch.autograd.grad(loss, (x, proxies))
    assert grad_x.dtype == dtype and grad_p.dtype == dtype
    assert torch.isfinite(grad_x).all() and torch.isfinite(grad_p).all()


def test_proxy_anchor_under_cpu_autocast_runs_in_float32() -> None:
    torch.manual_seed(0)  # module initialisation below draws from the global generator
    gen = torch.Generator().manual_seed(9)
    head = nn.Linear(6, 8)
    criterion = ProxyAnchorLoss(num_classes=5, embedding_size=8, generator=gen)
    inputs = torch.randn(10, 6, generator=gen)
    y = torch.randint(0, 5, (10,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = head(inputs)
        assert embeddings.dtype == torch.bfloat16
        loss = criterion(embeddings, y)
    assert loss.dtype == torch.float32
    loss.backward()
    assert criterion.proxies.dtype == torch.float32
    assert criterion.proxies.grad is not None and criterion.proxies.grad.dtype == torch.float32
    assert torch.isfinite(criterion.proxies.grad).all()
    assert head.weight.grad is not None and torch.isfinite(head.weight.grad).all()
    # The same bfloat16 embeddings outside autocast: equal only if the loss ignored autocast.
    plain = proxy_anchor_loss(embeddings.detach().float(), y, criterion.proxies.detach())
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)


def test_proxy_anchor_under_autocast_with_extreme_embeddings() -> None:
    x, y, proxies = extreme_case(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = proxy_anchor_loss(x.bfloat16().requires_grad_(), y, proxies)
    assert torch.isfinite(loss)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_proxy_anchor_under_cuda_autocast_float16() -> None:
    x, y, proxies = extreme_case(torch.float32)
    x, y, proxies = x.cuda().requires_grad_(), y.cuda(), proxies.cuda().requires_grad_()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = proxy_anchor_loss(x.half(), y, proxies)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert proxies.dtype == torch.float32
    assert proxies.grad is not None and torch.isfinite(proxies.grad).all()
    expected = reference_proxy_anchor(x.detach().half().cpu(), y.cpu(), proxies.cpu(), 32.0, 0.1)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_proxy_anchor_rejects_mismatched_shapes() -> None:
    x, y, proxies = random_case(10, 4, 3, 5)
    with pytest.raises(ValueError, match="labels"):
        proxy_anchor_loss(x, y[:3], proxies)
    with pytest.raises(ValueError, match="proxies"):
        proxy_anchor_loss(x, y, proxies[:, :4])


# Baselines, each against a plain transcription of its formula.


def reference_proxy_nca(x: Tensor, y: Tensor, proxies: Tensor, scale: float) -> float:
    ux, up = unit_rows(x), unit_rows(proxies)
    total = 0.0
    for xi, yi in zip(ux, y.tolist(), strict=True):
        logits = [-scale * sum((a - b) ** 2 for a, b in zip(xi, p, strict=True)) for p in up]
        top = max(logits)
        log_norm = top + math.log(sum(math.exp(v - top) for v in logits))
        total += log_norm - logits[yi]
    return total / len(ux)


def batch_pairs(y: Tensor) -> tuple[list[list[int]], list[list[int]]]:
    labels = y.tolist()
    n = len(labels)
    pos = [[k for k in range(n) if k != i and labels[k] == labels[i]] for i in range(n)]
    neg = [[k for k in range(n) if labels[k] != labels[i]] for i in range(n)]
    return pos, neg


def reference_multi_similarity(
    x: Tensor, y: Tensor, alpha: float, beta: float, base: float, eps: float
) -> tuple[float, int]:
    """MS loss of Wang et al. (CVPR 2019) with its mining; also how many pairs mining dropped."""
    s = cosines(x, x)
    pos, neg = batch_pairs(y)
    total, dropped = 0.0, 0
    for i in range(len(s)):
        kept_neg = [j for j in neg[i] if pos[i] and s[i][j] + eps > min(s[i][k] for k in pos[i])]
        kept_pos = [k for k in pos[i] if neg[i] and s[i][k] - eps < max(s[i][j] for j in neg[i])]
        dropped += len(pos[i]) + len(neg[i]) - len(kept_pos) - len(kept_neg)
        total += log1p_sum_exp([-alpha * (s[i][k] - base) for k in kept_pos]) / alpha
        total += log1p_sum_exp([beta * (s[i][j] - base) for j in kept_neg]) / beta
    return total / len(s), dropped


def reference_triplet_all_triplets(x: Tensor, y: Tensor, margin: float) -> float:
    """Batch-hard equals, per anchor, the largest hinge over all its (positive, negative) pairs."""
    s = cosines(x, x)
    pos, neg = batch_pairs(y)
    hinges = [
        max(max(0.0, s[i][n] - s[i][p] + margin) for p in pos[i] for n in neg[i])
        for i in range(len(s))
        if pos[i] and neg[i]
    ]
    return sum(hinges) / len(hinges) if hinges else 0.0


def reference_contrastive(x: Tensor, y: Tensor, pos_margin: float, neg_margin: float) -> float:
    s = cosines(x, x)
    pos, neg = batch_pairs(y)
    pos_terms = [max(0.0, 1 - s[i][k] - pos_margin) for i in range(len(s)) for k in pos[i]]
    neg_terms = [max(0.0, neg_margin - (1 - s[i][k])) for i in range(len(s)) for k in neg[i]]
    pos_mean = sum(pos_terms) / len(pos_terms) if pos_terms else 0.0
    neg_mean = sum(neg_terms) / len(neg_terms) if neg_terms else 0.0
    return pos_mean + neg_mean


def clustered_batch(seed: int, batch: int, dim: int, num_labels: int) -> tuple[Tensor, Tensor]:
    """Embeddings near per-class directions, so the similarities spread over a wide range."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_labels, dim, generator=gen, dtype=torch.float64)
    y = torch.randint(0, num_labels, (batch,), generator=gen)
    x = centres[y] + 0.8 * torch.randn(batch, dim, generator=gen, dtype=torch.float64)
    return x, y


@pytest.mark.parametrize("seed", [11, 12])
def test_proxy_nca_matches_reference(seed: int) -> None:
    x, y, _ = random_case(seed, 9, 6, 5)
    criterion = ProxyNCALoss(6, 5, softmax_scale=3.0, generator=torch.Generator().manual_seed(seed))
    proxies = criterion.proxies.detach()
    got = criterion(x, y)
    assert got.item() == pytest.approx(reference_proxy_nca(x, y, proxies, 3.0), rel=1e-9)


@pytest.mark.parametrize(("seed", "num_labels"), [(13, 3), (14, 5), (15, 1)])
def test_multi_similarity_matches_reference(seed: int, num_labels: int) -> None:
    x, y = clustered_batch(seed, 14, 6, num_labels)
    expected, dropped = reference_multi_similarity(x, y, 2.0, 50.0, 0.5, 0.1)
    if num_labels > 1:
        assert dropped > 0  # the case exercises the mining
    got = MultiSimilarityLoss(alpha=2.0, beta=50.0, base=0.5, epsilon=0.1)(x, y)
    assert got.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(("seed", "num_labels"), [(16, 3), (17, 6), (18, 1)])
def test_triplet_matches_all_triplets_reference(seed: int, num_labels: int) -> None:
    x, y = clustered_batch(seed, 12, 5, num_labels)
    got = TripletLoss(margin=0.1)(x, y)
    assert got.item() == pytest.approx(reference_triplet_all_triplets(x, y, 0.1), abs=1e-12)


@pytest.mark.parametrize(("seed", "num_labels"), [(19, 3), (20, 12)])
def test_contrastive_matches_reference(seed: int, num_labels: int) -> None:
    x, y = clustered_batch(seed, 12, 5, num_labels)
    got = CosineContrastiveLoss(pos_margin=0.0, neg_margin=0.5)(x, y)
    assert got.item() == pytest.approx(reference_contrastive(x, y, 0.0, 0.5), rel=1e-9)


def test_triplet_hand_computed_2d() -> None:
    # Anchor at 0 deg, positive at 60 deg, negative at 45 deg; the other two anchors have a
    # positive and a negative too. cos(45) - cos(60) + 0.1 for the anchor at 0 deg, etc.
    x = torch.tensor([at_angle(0), at_angle(60), at_angle(45)], dtype=torch.float64)
    y = torch.tensor([0, 0, 1])
    c = [[math.cos(math.radians(a - b)) for b in (0, 60, 45)] for a in (0, 60, 45)]
    anchor0 = max(0.0, c[0][2] - c[0][1] + 0.1)
    anchor1 = max(0.0, c[1][2] - c[1][0] + 0.1)
    # The anchor at 45 deg has no positive, so only two anchors count.
    assert TripletLoss(0.1)(x, y).item() == pytest.approx((anchor0 + anchor1) / 2, rel=1e-12)


def toy_problem(seed: int) -> tuple[Tensor, Tensor]:
    """Four separable classes in 8-D, 6 samples each, all offset the same way.

    The shared offset makes every embedding of a fresh head point roughly alike, so each loss
    starts well above 0 and has to pull the classes apart.
    """
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=gen)
    y = torch.arange(4).repeat_interleave(6)
    return centres[y] + 0.5 * torch.randn(24, 8, generator=gen) + 3.0, y


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_goes_down_on_separable_toy_data(name: str) -> None:
    torch.manual_seed(21)  # nn.Linear draws its initial weights from the global generator
    inputs, y = toy_problem(21)
    head = nn.Linear(8, 4)
    criterion = build_loss(name, num_classes=4, dim=4)
    groups: list[dict[str, Any]] = [
        {"params": list(head.parameters())},
        {"params": list(criterion.parameters()), "lr": 0.1},  # proxies learn faster
    ]
    optimiser = torch.optim.Adam(groups, lr=0.02)
    values = []
    for _ in range(30):
        loss = criterion(head(inputs), y)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        values.append(loss.item())
    assert all(math.isfinite(v) for v in values)
    assert values[0] > 0.01
    assert values[-1] < 0.5 * values[0]


def test_registry_modules_keep_proxies_in_a_parameter_named_proxies() -> None:
    for name in LOSSES:
        criterion = build_loss(name, num_classes=7, dim=3, alpha=16.0, delta=0.2)
        names = [n for n, _ in criterion.named_parameters()]
        assert names in ([], ["proxies"]), name
        if names:
            assert tuple(criterion.get_parameter("proxies").shape) == (7, 3)
    pa = build_loss("proxy_anchor", 7, 3, alpha=16.0, delta=0.2)
    assert isinstance(pa, ProxyAnchorLoss) and (pa.alpha, pa.margin) == (16.0, 0.2)


def test_build_loss_unknown_name_lists_choices() -> None:
    with pytest.raises(KeyError, match="proxy_anchor") as info:
        build_loss("arcface", 3, 2)
    assert "arcface" in str(info.value) and "multi_similarity" in str(info.value)


# Survivors of make mutate (docs/mutation.md), each with the bug it stands for.


def test_optimizer_groups_give_the_proxies_the_multiplied_rate() -> None:
    """Guards against the proxies at the model's rate (or divided), a model group's own rate
    ignored, and a default other than the paper's 100 x."""
    from pactl.losses import optimizer_groups

    model, loss = nn.Linear(3, 2), ProxyAnchorLoss(4, 2)
    groups = optimizer_groups(model, loss, lr=1e-3)
    assert [g["lr"] for g in groups] == [1e-3, pytest.approx(0.1)]
    assert groups[1]["params"] == [loss.proxies] and len(groups[0]["params"]) == 2
    own = [{"params": [model.weight], "lr": 5e-4}, {"params": [model.bias]}]
    groups = optimizer_groups(own, loss, lr=1e-3, proxy_lr_mult=10.0)
    assert [g["lr"] for g in groups] == [5e-4, 1e-3, pytest.approx(1e-2)]
    assert len(optimizer_groups(model, TripletLoss(), lr=1e-3)) == 1  # no proxies, no group


def test_proxy_checks_at_their_limits() -> None:
    """Guards against limits moved by one: no proxy is refused, a single one is a loss; alpha
    0 is refused, alpha below 1 is a scale like any other."""
    x, y, proxies = random_case(5, 6, 3, 4, 1)
    with pytest.raises(ValueError, match="proxies must be"):
        proxy_anchor_loss(x, y, proxies[:0])
    one = proxy_anchor_loss(x, y, proxies[:1], 0.5, 0.1)
    assert one.item() == pytest.approx(reference_proxy_anchor(x, y, proxies[:1], 0.5, 0.1))
    with pytest.raises(ValueError, match="alpha must be > 0"):
        proxy_anchor_loss(x, y, proxies, alpha=0.0)


def test_proxies_start_kaiming_normal_over_fan_out_from_the_generator() -> None:
    """Guards against the generator given being ignored (runs that do not repeat) and the
    start drawn over fan-in: each module's proxies are torch's Kaiming-normal, fan-out, drawn
    from the same seed (5 classes, 3 dims: the two fans differ)."""
    want = torch.empty(5, 3)
    nn.init.kaiming_normal_(want, mode="fan_out", generator=torch.Generator().manual_seed(7))
    for make in (ProxyAnchorLoss, ProxyNCALoss):
        module = make(5, 3, generator=torch.Generator().manual_seed(7))
        assert torch.equal(module.proxies.data, want), make
        module.reset_parameters(torch.Generator().manual_seed(7))
        assert torch.equal(module.proxies.data, want), make
    assert build_loss("proxy_anchor", 5, 3).alpha == 32.0  # the paper's default scale


def test_a_float64_input_makes_the_loss_float64() -> None:
    """Guards against the precision being taken from one input only: float64 embeddings with
    float32 proxies, or the reverse, are computed (and returned) in float64."""
    x, y, proxies = random_case(6, 8, 4, 3)
    for emb, prox in ((x, proxies.float()), (x.float(), proxies)):
        assert proxy_anchor_loss(emb, y, prox).dtype == torch.float64
    nca = ProxyNCALoss(4, 3, softmax_scale=8.0).double()
    assert nca(x.float(), y).dtype == torch.float64


def test_proxy_anchor_at_a_scale_whose_exponents_overflow_float32() -> None:
    """Guards against a per-column shift below the column's largest exponent: at alpha 1000
    exp(alpha * 2 delta) alone overflows float32, and the loss must still be the equation's."""
    x, y, proxies = random_case(7, 10, 4, 5)
    expected = reference_proxy_anchor(x, y, proxies, 1000.0, 0.1)
    got = proxy_anchor_loss(x.float(), y, proxies.float(), 1000.0, 0.1)
    assert math.isfinite(got.item()) and got.item() == pytest.approx(expected, rel=1e-5)


def test_contrastive_with_a_positive_margin_and_identical_pairs() -> None:
    """Guards against the positive margin added instead of subtracted (invisible at the
    default 0), the documented defaults (0 and 0.5) drifting, and identical embeddings put at
    distance 1, or given a NaN gradient, by the Euclidean form."""
    from pactl.losses import ContrastiveLoss

    x, y = clustered_batch(21, 10, 4, 3)
    got = CosineContrastiveLoss(pos_margin=0.2, neg_margin=0.6)(x, y)
    assert got.item() == pytest.approx(reference_contrastive(x, y, 0.2, 0.6), rel=1e-9)
    default = CosineContrastiveLoss()(x, y)
    assert default.item() == pytest.approx(reference_contrastive(x, y, 0.0, 0.5), rel=1e-9)
    twins = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    loss = ContrastiveLoss()(twins, torch.tensor([0, 0, 1]))
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # the twins are 0 apart, the negative 1.41
    loss.backward()
    assert twins.grad is not None and torch.isfinite(twins.grad).all()


@pytest.mark.parametrize(("alpha", "delta"), [(39.0, 3.0), (80.0, 0.1), (70.0, 0.1)])
def test_proxy_anchor_near_the_limit_of_the_constant_shift(alpha: float, delta: float) -> None:
    """Guards against the one shift for all columns being used where float32 cannot hold it:
    a margin of 3 puts exponents at 4 alpha, and alpha 70 or 80 put exp(-alpha (1 + delta))
    (the "1" of the log) at the edge of float32's range; a proxy opposite every sample makes
    the smallest exponents. The loss must still be the equation's."""
    x, y, proxies = random_case(8, 10, 4, 5)
    proxies[3] = -x.mean(dim=0)
    expected = reference_proxy_anchor(x, y, proxies, alpha, delta)
    got = proxy_anchor_loss(x.float(), y, proxies.float(), alpha, delta)
    assert math.isfinite(got.item()) and got.item() == pytest.approx(expected, rel=1e-5)


def test_batches_without_a_sample_or_a_matrix_are_refused_and_one_sample_is_a_batch() -> None:
    """Guards against an empty batch or a single vector taken for a batch, and a batch of one
    sample (no pairs: a loss of 0) failing in the log-sum-exp."""
    x, y = clustered_batch(22, 6, 4, 2)
    for embeddings, labels in ((x[:0], y[:0]), (x[0], y[:4])):
        with pytest.raises(ValueError, match="embeddings must be"):
            MultiSimilarityLoss()(embeddings, labels)
    assert MultiSimilarityLoss()(x[:1], y[:1]).item() == 0.0
