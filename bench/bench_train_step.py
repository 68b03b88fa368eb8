"""One Proxy-Anchor training step: pactl against the official training loop's step, on the CPU.

Target: a training step of the same model and batch at least as fast as the official loop's.

The official repository (github.com/tjddus9597/Proxy-Anchor-CVPR2020, code/train.py and
code/losses.py) does per step: m = model(x) with an embedding net that ends in an L2
normalisation; loss = Proxy_Anchor(m, y), which normalises embeddings and proxies again, takes
their cosines, builds a one-hot positive mask and its complement, exponentiates both margins
over the whole (B, C) matrix, masks with torch.where, sums per proxy and averages the logs over
the proxies with positives (positive term) and over all proxies (negative term); then
opt.zero_grad(), loss.backward(), clip_grad_value_(10) on the model's and the criterion's
parameters, and opt.step() with AdamW over three groups (backbone at lr, embedding at lr,
proxies at lr x 100). The baseline below is an independent re-implementation of that step.

The pactl side is built by pactl.training.trainer.build_trainer (pactl.model.build_model,
pactl.losses.build_loss, param_groups, AdamW, GradScaler) with pactl's default TrainConfig
(channels_last on, unless --nchw) and runs pactl.training.trainer.train_step on each batch, as
train_one_epoch does. Both start from the same weights and proxies, see
the same batch and use the same threads; BatchNorm is frozen (eval mode, parameters trained),
the steady state after the warm-up epoch of the Cars recipe. The sides are timed interleaved,
in a shuffled order each round, so a busy machine slows them alike; the figures are medians.

    python -m bench train_step               # resnet18 at 112 px, batch 32, 98 classes
    python -m bench train_step --quick       # small backbone, small sizes
    python -m bench train_step --backbone resnet50 --image-size 224 --rounds 8

Results (the markdown table) go to stdout, progress to stderr. Exit 1 when the first-step
losses of the two sides differ by more than 1e-4 (relative).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench import harness
from pactl.config import ModelConfig, TrainConfig
from pactl.loaders import Batch
from pactl.model import EmbeddingNet, freeze_batchnorm
from pactl.training.distributed import World
from pactl.training.trainer import Trainer, build_trainer, set_warmup, train_step

MAX_REL_DIFF = 1e-4
TARGET = 1.0  # official / pactl at least
RESNETS = ("resnet18", "resnet50", "resnet101")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- official baseline


def official_l2_norm(x: Tensor) -> Tensor:
    """Rows divided by sqrt(sum of squares + 1e-12), the official helper's formula."""
    return x / torch.sqrt(x.pow(2).sum(dim=1).add(1e-12)).view(-1, 1)


class OfficialNet(nn.Module):
    """The official embedding net: backbone, GAP + GMP summed, Linear, L2 normalisation.

    For torchvision ResNets the backbone is torchvision's own model called layer by layer, as
    the official code does; other backbones are a copy of pactl's feature extractor.
    """

    def __init__(self, net: EmbeddingNet, backbone: str) -> None:
        super().__init__()
        self.resnet = backbone in RESNETS
        if self.resnet:
            import torchvision

            self.body = getattr(torchvision.models, backbone)(weights=None)
            self.body.fc = nn.Identity()
            load_sequential_into(self.body, net.backbone)
        else:
            self.body = copy.deepcopy(net.backbone)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.gmp = nn.AdaptiveMaxPool2d(1)
        self.embedding = copy.deepcopy(net.embedding)

    def features(self, x: Tensor) -> Tensor:
        if not self.resnet:
            return self.body(x)
        b = self.body
        x = b.maxpool(b.relu(b.bn1(b.conv1(x))))
        return b.layer4(b.layer3(b.layer2(b.layer1(x))))

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = self.gap(x) + self.gmp(x)
        x = self.embedding(x.view(x.size(0), -1))
        return official_l2_norm(x)


def load_sequential_into(model: nn.Module, body: nn.Module) -> None:
    """pactl's backbone is the model's children in order: '3.0.conv1.weight' -> 'layer1...'."""
    names = [name for name, _ in model.named_children()]
    state = {}
    for key, value in body.state_dict().items():
        index, rest = key.split(".", 1)
        state[f"{names[int(index)]}.{rest}"] = value
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.startswith("fc.")]:
        raise SystemExit(f"weights do not map onto torchvision: {missing[:3]} {unexpected[:3]}")


class OfficialProxyAnchor(nn.Module):
    """The official Proxy_Anchor criterion, written out step by step over the full (B, C)."""

    def __init__(self, proxies: Tensor, mrg: float = 0.1, alpha: float = 32.0) -> None:
        super().__init__()
        self.proxies = nn.Parameter(proxies.detach().clone())
        self.nb_classes = proxies.shape[0]
        self.mrg, self.alpha = mrg, alpha

    def forward(self, X: Tensor, T: Tensor) -> Tensor:
        cos = F.linear(official_l2_norm(X), official_l2_norm(self.proxies))  # (B, C)
        # The official code builds this with scikit-learn's label_binarize; one_hot is no slower.
        P_one_hot = F.one_hot(T, self.nb_classes).float()
        N_one_hot = 1 - P_one_hot
        pos_exp = torch.exp(-self.alpha * (cos - self.mrg))
        neg_exp = torch.exp(self.alpha * (cos + self.mrg))
        with_pos_proxies = torch.nonzero(P_one_hot.sum(dim=0) != 0).squeeze(dim=1)
        num_valid_proxies = len(with_pos_proxies)
        zeros = torch.zeros_like(pos_exp)
        P_sim_sum = torch.where(P_one_hot == 1, pos_exp, zeros).sum(dim=0)
        N_sim_sum = torch.where(N_one_hot == 1, neg_exp, zeros).sum(dim=0)
        pos_term = torch.log(1 + P_sim_sum).sum() / num_valid_proxies
        neg_term = torch.log(1 + N_sim_sum).sum() / self.nb_classes
        return pos_term + neg_term


@dataclass
class Official:
    model: OfficialNet
    criterion: OfficialProxyAnchor
    opt: torch.optim.Optimizer


def build_official(t: Trainer, backbone: str) -> Official:
    """Same weights and proxies as pactl's trainer; the official optimiser's three groups."""
    cfg = t.cfg
    model = OfficialNet(t.net, backbone)
    proxies = t.criterion.get_parameter("proxies")
    criterion = OfficialProxyAnchor(proxies, mrg=cfg.delta, alpha=cfg.alpha)
    embedding = set(model.embedding.parameters())
    groups = [
        {"params": list(set(model.parameters()).difference(embedding)), "lr": cfg.lr},
        {"params": model.embedding.parameters(), "lr": cfg.lr * 1},
        {"params": criterion.parameters(), "lr": cfg.lr * 100},
    ]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    model.train()
    for m in model.modules():  # bn_freeze after warm-up: statistics fixed, affine trained
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    return Official(model, criterion, opt)


def official_step(o: Official, x: Tensor, y: Tensor) -> float:
    m = o.model(x)
    loss = o.criterion(m, y)
    o.opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(o.model.parameters(), 10)
    torch.nn.utils.clip_grad_value_(o.criterion.parameters(), 10)
    value = float(loss.data.cpu().numpy())  # the official loop logs every step's loss
    o.opt.step()
    return value


# --------------------------------------------------------------------------- pactl


def build_pactl(args: argparse.Namespace) -> Trainer:
    model_cfg = ModelConfig(
        backbone=args.backbone,
        weights="none",
        embedding_dim=args.dim,
        image_size=args.image_size,
        resize_size=args.image_size,
    )
    cfg = TrainConfig(batch_size=args.batch, device="cpu", workers=0, seed=args.seed)
    if args.nchw:
        cfg = dataclasses.replace(cfg, channels_last=False)
    t = build_trainer(model_cfg, cfg, args.classes, World())
    # What train_one_epoch does before its loop, for an epoch after the warm-up.
    t.model.train()
    set_warmup(t.net, t.cfg.warmup_epochs, t.cfg)
    if t.cfg.freeze_bn:
        freeze_batchnorm(t.net.backbone)
    return t


def pactl_step(t: Trainer, batch: Batch) -> float:
    """What train_one_epoch does with each batch: to the device, train_step."""
    images = batch.images.to(t.device, non_blocking=True)
    labels = batch.labels.to(t.device, non_blocking=True)
    value = float(train_step(t, images, labels))
    if not math.isfinite(value):
        raise SystemExit(f"pactl's loss became {value}")
    return value


# --------------------------------------------------------------------------- timing


def make_batch(args: argparse.Namespace) -> Batch:
    gen = torch.Generator().manual_seed(args.seed)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=gen)
    labels = torch.randint(0, args.classes, (args.batch,), generator=gen)
    return Batch(images, labels, torch.arange(args.batch))


Times = dict[str, list[float]]


def time_interleaved(
    steps: dict[str, Callable[[], float]], rounds: int, warmup: int, quiet: bool = False
) -> tuple[Times, Times]:
    """Wall and CPU seconds per step for each name, one call of each per round, shuffled
    (harness.interleaved).

    CPU seconds are the process's, all threads together: steadier than wall time when other
    jobs share the machine, though threads waiting for each other count too.
    """

    def progress(done: int, so_far: dict[str, harness.Timing]) -> None:
        if not quiet:
            log(
                f"  round {done}/{rounds}: "
                + ", ".join(f"{n} {so_far[n].wall[-1]:.3f}s" for n in steps)
            )

    timings = harness.interleaved(steps, rounds=rounds, warmup=warmup, on_round=progress)
    return (
        {name: list(t.wall) for name, t in timings.items()},
        {name: list(t.cpu) for name, t in timings.items()},
    )


def check_losses(t: Trainer, o: Official, batch: Batch) -> tuple[list[float], list[float]]:
    """Two real steps on each side: the first compares the forward, the second the update."""
    ours, theirs = [], []
    for _ in range(2):
        ours.append(pactl_step(t, batch))
        theirs.append(official_step(o, batch.images, batch.labels))
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        log(f"step {i + 1} loss: pactl {a:.8f}  official {b:.8f}  rel diff {rel(a, b):.1e}")
    return ours, theirs


def loss_steps(t: Trainer, o: Official, args: argparse.Namespace) -> dict[str, Callable[[], float]]:
    """The two criteria alone, forward + backward on the step's (B, D) embedding shape."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    x = F.normalize(torch.randn(args.batch, args.dim, generator=gen), dim=1).requires_grad_()
    y = torch.randint(0, args.classes, (args.batch,), generator=gen)

    def run(criterion: nn.Module) -> float:
        loss = criterion(x, y)
        torch.autograd.grad(loss, [x, criterion.get_parameter("proxies")])
        return float(loss.detach())

    return {"pactl": lambda: run(t.criterion), "official": lambda: run(o.criterion)}


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small backbone and sizes")
    parser.add_argument("--backbone", default=None, help="pactl backbone (default resnet18)")
    parser.add_argument("--image-size", type=int, default=None, help="side in px (default 112)")
    parser.add_argument("--batch", type=int, default=None, help="images per step (default 32)")
    parser.add_argument("--classes", type=int, default=98, help="proxies (Cars train split: 98)")
    parser.add_argument("--dim", type=int, default=512, help="embedding size")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 30)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--nchw", action="store_true", help="pactl with channels_last off (its default is on)"
    )
    args = parser.parse_args(argv)
    quick = ("small", 48, 16, 5)
    full = ("resnet18", 112, 32, 30)
    defaults = quick if args.quick else full
    args.backbone = args.backbone or defaults[0]
    args.image_size = args.image_size or defaults[1]
    args.batch = args.batch or defaults[2]
    args.rounds = args.rounds or defaults[3]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t = build_pactl(args)
    o = build_official(t, args.backbone)
    batch = make_batch(args)
    ours, theirs = check_losses(t, o, batch)
    first_diff, second_diff = rel(ours[0], theirs[0]), rel(ours[1], theirs[1])
    if first_diff > MAX_REL_DIFF:
        log("first-step losses disagree; the timings would compare different computations")
        return 1

    log(f"timing {args.rounds} rounds (+{args.warmup} warm-up), {args.threads} threads ...")
    steps: dict[str, Callable[[], float]] = {
        "pactl": lambda: pactl_step(t, batch),
        "official": lambda: official_step(o, batch.images, batch.labels),
    }
    times, cpu_times = time_interleaved(steps, args.rounds, args.warmup)
    log("timing the criteria alone ...")
    loss_times, _ = time_interleaved(loss_steps(t, o, args), 50, 5, quiet=True)
    loss_med = {name: statistics.median(values) for name, values in loss_times.items()}
    med = {name: statistics.median(values) for name, values in times.items()}
    cpu_med = {name: statistics.median(values) for name, values in cpu_times.items()}
    ratio = med["official"] / med["pactl"]
    # Both sides of a round ran seconds apart: their ratio cancels slow drifts of the load.
    paired = statistics.median(
        a / b for a, b in zip(times["official"], times["pactl"], strict=True)
    )
    layout = "channels_last" if t.cfg.channels_last else "NCHW"
    print(
        f"Training step (forward, Proxy-Anchor loss, backward, clip, AdamW), {args.backbone} at "
        f"{args.image_size} px, batch {args.batch}, {args.classes} classes, {args.dim} dims, "
        f"float32 on the CPU ({args.threads} threads), pactl in {layout}, the official loop "
        f"in NCHW; torch {torch.__version__}; median of {args.rounds} interleaved rounds."
    )
    print()
    print("| step | median ms | min ms | median CPU ms | x official |")
    print("| --- | ---: | ---: | ---: | ---: |")
    labels = {
        "official": "official loop (re-implemented)",
        "pactl": "pactl.training.trainer.train_step",
    }
    for name in ("official", "pactl"):
        print(
            f"| {labels[name]} | {med[name] * 1e3:.1f} | {min(times[name]) * 1e3:.1f} | "
            f"{cpu_med[name] * 1e3:.1f} | {med[name] / med['official']:.3f} |"
        )
    print()
    print("Of which the criterion (forward + backward to embeddings and proxies, 50 rounds):")
    print()
    print("| criterion | median ms |")
    print("| --- | ---: |")
    print(f"| official Proxy_Anchor (re-implemented) | {loss_med['official'] * 1e3:.2f} |")
    print(f"| pactl ProxyAnchorLoss | {loss_med['pactl'] * 1e3:.2f} |")
    print()
    verdict = "met" if ratio >= TARGET else "MISSED"
    if args.quick:
        verdict = "not judged (--quick)"
    print(f"- official / pactl = {ratio:.3f} (target >= {TARGET}): {verdict}")
    print(f"- median of the per-round ratios official / pactl = {paired:.3f}")
    print(f"- CPU time official / pactl = {cpu_med['official'] / cpu_med['pactl']:.3f}")
    print(f"- first-step loss: relative difference {first_diff:.1e} (target <= {MAX_REL_DIFF:.0e})")
    print(f"- second-step loss (after one update each): relative difference {second_diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
