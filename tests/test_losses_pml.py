"""The public loss modules against pytorch-metric-learning's classes of the same name (a test
dependency): the same value and gradients on seeded batches, in float32 and under CPU bfloat16
autocast, and a small training loop that learns alike with either."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from pytorch_metric_learning import distances, losses, miners, reducers
from torch import Tensor, nn

import pactl

C, D = 8, 16  # proxies, embedding size; the batches' labels use 6 of the 8 classes
Case = tuple[Callable[[], nn.Module], Callable[[], nn.Module], Callable[[], Any] | None]


def cosine() -> distances.CosineSimilarity:
    return distances.CosineSimilarity()


# name -> (pactl's module, pytorch-metric-learning's, pml's miner or None)
CASES: dict[str, Case] = {
    "proxy_anchor": (
        lambda: pactl.ProxyAnchorLoss(C, D),
        lambda: losses.ProxyAnchorLoss(C, D),
        None,
    ),
    "proxy_anchor margin alpha": (
        lambda: pactl.ProxyAnchorLoss(num_classes=C, embedding_size=D, margin=0.2, alpha=16),
        lambda: losses.ProxyAnchorLoss(num_classes=C, embedding_size=D, margin=0.2, alpha=16),
        None,
    ),
    "proxy_nca": (lambda: pactl.ProxyNCALoss(C, D), lambda: losses.ProxyNCALoss(C, D), None),
    "proxy_nca scale": (
        lambda: pactl.ProxyNCALoss(C, D, softmax_scale=8),
        lambda: losses.ProxyNCALoss(C, D, softmax_scale=8),
        None,
    ),
    "multi_similarity": (pactl.MultiSimilarityLoss, losses.MultiSimilarityLoss, None),
    "multi_similarity alpha beta base": (
        lambda: pactl.MultiSimilarityLoss(alpha=3, beta=40, base=0.6),
        lambda: losses.MultiSimilarityLoss(alpha=3, beta=40, base=0.6),
        None,
    ),
    "multi_similarity mined": (
        lambda: pactl.MultiSimilarityLoss(epsilon=0.1),
        losses.MultiSimilarityLoss,
        lambda: miners.MultiSimilarityMiner(epsilon=0.1),
    ),
    "triplet_margin": (pactl.TripletMarginLoss, losses.TripletMarginLoss, None),
    "triplet_margin margin": (
        lambda: pactl.TripletMarginLoss(margin=0.2),
        lambda: losses.TripletMarginLoss(margin=0.2),
        None,
    ),
    "triplet batch-hard": (
        lambda: pactl.TripletLoss(margin=0.1),
        lambda: losses.TripletMarginLoss(0.1, distance=cosine(), reducer=reducers.MeanReducer()),
        lambda: miners.BatchHardMiner(distance=cosine()),
    ),
    "contrastive": (pactl.ContrastiveLoss, losses.ContrastiveLoss, None),
    "contrastive margins": (
        lambda: pactl.ContrastiveLoss(pos_margin=0.2, neg_margin=0.8),
        lambda: losses.ContrastiveLoss(pos_margin=0.2, neg_margin=0.8),
        None,
    ),
    "cosine contrastive": (
        lambda: pactl.CosineContrastiveLoss(pos_margin=0.0, neg_margin=0.5),
        lambda: losses.ContrastiveLoss(1.0, 0.5, distance=cosine(), reducer=reducers.MeanReducer()),
        None,
    ),
}


def batch(seed: int, spread: float = 1.0) -> tuple[Tensor, Tensor]:
    """(32, D) embeddings around 6 class centres (so mining and margins have work to do) and
    their labels; `spread` scales the noise around the centres."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(6, D, generator=gen)
    labels = torch.randint(0, 6, (32,), generator=gen)
    return centres[labels] + spread * torch.randn(32, D, generator=gen), labels


def pair(name: str, seed: int) -> tuple[nn.Module, nn.Module, Any]:
    """pactl's module and pml's for a case, pml's holding a copy of pactl's proxies."""
    ours_of, theirs_of, miner_of = CASES[name]
    torch.manual_seed(seed)  # pml's proxies draw from the global generator
    ours, theirs = ours_of(), theirs_of()
    if "proxies" in dict(ours.named_parameters()):
        with torch.no_grad():
            theirs.get_parameter("proxies").copy_(ours.get_parameter("proxies"))
    return ours, theirs, miner_of() if miner_of else None


def pml_loss(theirs: nn.Module, miner: Any, x: Tensor, y: Tensor) -> Tensor:
    return theirs(x, y, miner(x, y)) if miner is not None else theirs(x, y)


def grads(loss: Tensor, x: Tensor, module: nn.Module) -> list[Tensor]:
    return [g.float() for g in torch.autograd.grad(loss, [x, *module.parameters()])]


def relative(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", sorted(CASES))
def test_same_value_and_gradients_as_pytorch_metric_learning(name: str, seed: int) -> None:
    ours, theirs, miner = pair(name, seed)
    x, y = batch(seed)
    x.requires_grad_()
    mine, its = ours(x, y), pml_loss(theirs, miner, x, y)
    assert mine.item() > 0.01  # a case where the loss has something to say
    assert mine.item() == pytest.approx(its.item(), rel=1e-5)
    for g, h in zip(grads(mine, x, ours), grads(its, x, theirs), strict=True):
        assert relative(g, h) < 1e-5


def test_the_mined_cases_do_mine() -> None:
    """Mining drops pairs on these batches, so the mined cases test the mining."""
    x, y = batch(0, spread=0.8)
    assert len(miners.MultiSimilarityMiner(epsilon=0.1)(x, y)[0]) < int(
        (y[:, None] == y[None]).sum() - len(y)
    )
    unmined = pactl.MultiSimilarityLoss()(x, y)
    assert pactl.MultiSimilarityLoss(epsilon=0.1)(x, y).item() != pytest.approx(unmined.item())


@pytest.mark.parametrize("name", sorted(CASES))
def test_under_bf16_autocast_the_value_is_float32s(name: str) -> None:
    """Under CPU bfloat16 autocast, pactl computes in float32 from the bfloat16 embeddings: its
    value and proxy gradients are pml's in float32 on the same embeddings (the embeddings'
    gradient comes back in bfloat16), and pml's own autocast value is near it (bfloat16's
    precision). pactl's proxies stay float32."""
    ours, theirs, miner = pair(name, 3)
    exact = copy.deepcopy(theirs)  # pml casts its proxies to the embeddings' dtype
    x, y = batch(3)
    half = x.to(torch.bfloat16).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mine = ours(half, y)
        its_autocast = pml_loss(theirs, miner, half, y)
    assert mine.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in ours.parameters())
    full = half.detach().float().requires_grad_()
    its = pml_loss(exact, miner, full, y)
    assert mine.item() == pytest.approx(its.item(), rel=1e-5)
    assert mine.item() == pytest.approx(its_autocast.float().item(), rel=3e-2)
    (g_x, *g_p), (h_x, *h_p) = grads(mine, half, ours), grads(its, full, exact)
    assert relative(g_x, h_x) < 1e-2  # bfloat16's rounding of the gradient
    for g, h in zip(g_p, h_p, strict=True):
        assert relative(g, h) < 1e-5


def toy_split(seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Four classes in 8-D told apart by 2 dimensions, drowned by noise in the other 6, 8
    training and 8 held-out samples each: the raw inputs' nearest neighbours are often of
    another class, and a head has to learn to look past the noise."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(4).repeat_interleave(8)
    corners = 2.0 * torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])

    def draw() -> Tensor:
        x = 2.0 * torch.randn(32, 8, generator=gen)
        x[:, :2] = corners[y] + 0.3 * torch.randn(32, 2, generator=gen)
        return x + 3.0  # all offset alike: a fresh head maps everything near one direction

    return draw(), y, draw(), y.clone()


def recall_at_1(vectors: Tensor, labels: Tensor) -> float:
    unit = nn.functional.normalize(vectors, dim=1)
    sim = unit @ unit.T - 2 * torch.eye(len(unit))  # leave each query out of its neighbours
    return float((labels[sim.argmax(dim=1)] == labels).float().mean())


def train(loss: nn.Module, miner: Any, seed: int, steps: int = 40) -> tuple[list[float], float]:
    """A loop of one's own: a linear head, AdamW over pactl.optimizer_groups (the proxies at
    100x the rate); returns the loss at each step and the held-out Recall@1 at the end."""
    x, y, held_out, held_labels = toy_split(seed)
    torch.manual_seed(seed)
    head = nn.Linear(8, D)
    optimizer = torch.optim.AdamW(pactl.optimizer_groups(head, loss, lr=0.02), weight_decay=0)
    values = []
    for _ in range(steps):
        value = pml_loss(loss, miner, head(x), y)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        values.append(value.item())
    with torch.no_grad():
        return values, recall_at_1(head(held_out), held_labels)


@pytest.mark.parametrize(
    "name", ["proxy_anchor", "proxy_nca scale", "multi_similarity", "triplet_margin"]
)  # not "multi_similarity mined": late in the loop the miner leaves one pair of each kind, where
# pml's loss is 0 by a shortcut (GenericPairLoss) and pactl's counts the two pairs
def test_a_loop_of_ones_own_learns_alike_with_either(name: str) -> None:
    """The same loop, the same start (pml's proxies a copy of pactl's), step for step the same
    losses; both end with the held-out samples' nearest neighbour of their own class."""
    ours, theirs, miner = pair(name, 5)
    mine, mine_recall = train(ours, None, 5)
    its, its_recall = train(theirs, miner, 5)
    assert mine == pytest.approx(its, rel=1e-3, abs=1e-3)
    assert mine[-1] < 0.6 * mine[0]
    assert mine_recall >= 0.95 and its_recall >= 0.95
    assert recall_at_1(*toy_split(5)[2:]) < 0.9  # the raw inputs' neighbours are not
