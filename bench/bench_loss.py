"""Proxy-Anchor forward+backward at SOP scale against a matmul floor and pytorch-metric-learning.

pactl's side is the public module, `pactl.ProxyAnchorLoss(num_classes, embedding_size)` called
as `loss(embeddings, labels)`, as a training loop of one's own calls it (docs/api.md).

Targets: within 1.25x of the floor (normalise both matrices, multiply, sum; forward and
backward) and at least 1.5x faster than pytorch-metric-learning's ProxyAnchorLoss, with equal
values (1e-5 relative). The three are timed interleaved, in a shuffled order each round, so a
busy machine slows them alike; the figures are medians.

    python -m bench loss                 # batch 180, 11,318 classes, 512 dims
    python -m bench loss --quick         # small smoke run
    python -m bench loss --device cuda

Results (the markdown table) go to stdout, progress to stderr. Exit 2 when
pytorch-metric-learning (a bench-only dependency) is missing, 1 when the values disagree.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench import harness
from pactl.losses import ProxyAnchorLoss, proxy_anchor_loss

SOP = (180, 11318, 512)  # batch, classes (SOP's training split), embedding dim
QUICK = (32, 500, 64)
MAX_REL_DIFF = 1e-5
FLOOR_TARGET = 1.25  # ours / floor at most
PML_TARGET = 1.5  # pml / ours at least


@dataclass(frozen=True)
class Problem:
    embeddings: Tensor  # (B, D), requires grad
    labels: Tensor  # (B,)
    proxies: nn.Parameter  # (C, D)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def make_problem(batch: int, classes: int, dim: int, device: torch.device, seed: int) -> Problem:
    gen = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(batch, dim, generator=gen).to(device).requires_grad_()
    labels = torch.randint(0, classes, (batch,), generator=gen).to(device)
    proxies = torch.empty(classes, dim)
    nn.init.kaiming_normal_(proxies, mode="fan_out", generator=gen)
    return Problem(embeddings, labels, nn.Parameter(proxies.to(device)))


def make_steps(problem: Problem, pml_loss: nn.Module) -> dict[str, Callable[[], Tensor]]:
    """Each step is one forward+backward; gradients come back from autograd.grad, not .grad."""
    x, y, p = problem.embeddings, problem.labels, problem.proxies
    pml_p = pml_loss.get_parameter("proxies")
    module = ProxyAnchorLoss(p.shape[0], p.shape[1], margin=0.1, alpha=32.0).to(p.device)
    with torch.no_grad():
        module.proxies.copy_(p)

    def floor() -> Tensor:
        value = (F.normalize(x, dim=1) @ F.normalize(p, dim=1).T).sum()
        torch.autograd.grad(value, [x, p])
        return value

    def ours() -> Tensor:
        value = module(x, y)
        torch.autograd.grad(value, [x, module.proxies])
        return value

    def pml() -> Tensor:
        value = pml_loss(x, y)
        torch.autograd.grad(value, [x, pml_p])
        return value

    return {"floor": floor, "pactl": ours, "pml": pml}


def time_interleaved(
    steps: dict[str, Callable[[], Tensor]], rounds: int, warmup: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds per step for each name, one call of each per round in a shuffled order
    (harness.interleaved; on a GPU the clock waits for the queued work)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    timings = harness.interleaved(steps, rounds=rounds, warmup=warmup, sync=sync)
    return {name: list(timing.wall) for name, timing in timings.items()}


def check_values(problem: Problem, pml_loss: nn.Module) -> tuple[float, float]:
    """Relative differences between our loss and pml's on the same proxies: of the values, and
    of the gradients (embeddings and proxies together)."""
    x, p = problem.embeddings, problem.proxies
    pml_p = pml_loss.get_parameter("proxies")
    ours = proxy_anchor_loss(x, problem.labels, p)
    theirs = pml_loss(x, problem.labels)
    ours_grad = torch.cat([g.flatten() for g in torch.autograd.grad(ours, [x, p])])
    theirs_grad = torch.cat([g.flatten() for g in torch.autograd.grad(theirs, [x, pml_p])])
    log(f"loss values: pactl {ours.item():.8f}  pml {theirs.item():.8f}")
    value_diff = abs(ours.item() - theirs.item()) / max(abs(theirs.item()), 1e-30)
    grad_diff = float((ours_grad - theirs_grad).norm() / theirs_grad.norm().clamp_min(1e-30))
    return value_diff, grad_diff


def table(medians: dict[str, float], header: str) -> str:
    floor = medians["floor"]
    lines = [
        header,
        "",
        "| step (forward + backward) | median ms | x floor |",
        "| --- | ---: | ---: |",
    ]
    labels = {
        "floor": "floor: normalize, matmul, sum",
        "pactl": "pactl ProxyAnchorLoss (module)",
        "pml": "pytorch-metric-learning ProxyAnchorLoss",
    }
    for name in ("floor", "pactl", "pml"):
        lines.append(
            f"| {labels[name]} | {medians[name] * 1e3:.2f} | {medians[name] / floor:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 40)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if importlib.util.find_spec("pytorch_metric_learning") is None:
        log(
            "pytorch-metric-learning is not installed; it is needed only by this bench: "
            "pip install pytorch-metric-learning"
        )
        return 2
    from importlib.metadata import version

    from pytorch_metric_learning.losses import ProxyAnchorLoss as PmlProxyAnchorLoss

    pml_version = version("pytorch-metric-learning")

    if args.device == "cuda" and not torch.cuda.is_available():
        log("--device cuda: no CUDA device is visible")
        return 2
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    batch, classes, dim = QUICK if args.quick else SOP
    rounds = args.rounds or (10 if args.quick else 40)

    problem = make_problem(batch, classes, dim, device, args.seed)
    pml_loss = PmlProxyAnchorLoss(classes, dim, margin=0.1, alpha=32).to(device)
    with torch.no_grad():
        pml_loss.get_parameter("proxies").copy_(problem.proxies)

    rel_diff, grad_diff = check_values(problem, pml_loss)
    log(f"relative difference {rel_diff:.2e} (must be <= {MAX_REL_DIFF:.0e})")
    if rel_diff > MAX_REL_DIFF or grad_diff > MAX_REL_DIFF:
        log("values disagree; timings would compare different computations")
        return 1

    log(f"timing {rounds} rounds (+3 warm-up) on {device}, {args.threads} threads ...")
    times = time_interleaved(make_steps(problem, pml_loss), rounds, 3, device)
    medians = {name: statistics.median(values) for name, values in times.items()}

    vs_floor = medians["pactl"] / medians["floor"]
    vs_pml = medians["pml"] / medians["pactl"]
    header = (
        f"Proxy-Anchor forward+backward, batch {batch}, {classes} classes, {dim} dims, "
        f"float32 on {device} ({args.threads} threads), torch {torch.__version__}, "
        f"pytorch-metric-learning {pml_version}; median of {rounds} interleaved rounds."
    )
    print(table(medians, header))
    print()
    verdict_floor = "met" if vs_floor <= FLOOR_TARGET else "MISSED"
    verdict_pml = "met" if vs_pml >= PML_TARGET else "MISSED"
    if args.quick:  # per-call overhead dominates at these sizes; the targets are for SOP scale
        verdict_floor = verdict_pml = "not judged (--quick)"
    print(f"- pactl / floor = {vs_floor:.2f} (target <= {FLOOR_TARGET}): {verdict_floor}")
    print(f"- pml / pactl = {vs_pml:.2f} (target >= {PML_TARGET}): {verdict_pml}")
    print(f"- values: relative difference {rel_diff:.1e} (target <= {MAX_REL_DIFF:.0e})")
    print(f"- gradients: relative difference {grad_diff:.1e} (target <= {MAX_REL_DIFF:.0e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
