"""The trainer: the network, the loss and its proxies, the optimiser groups and schedule built
once (build_trainer), and one step and one epoch of training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pactl.config import ModelConfig, TrainConfig
from pactl.console import Reporter
from pactl.datasets import Manifest
from pactl.errors import PactlError
from pactl.model import EmbeddingNet, build_model, freeze_batchnorm
from pactl.runtime import autocast, resolve_device
from pactl.training.distributed import World, gather_batch, share_sizes
from pactl.training.evaluation import score_network
from pactl.training.robust import LabelDoubt, label_doubt
from pactl.training.splits import Splits


@dataclass
class Best:
    """The epoch best.pt holds: its metrics and its selection score (pactl.runs.selection_score:
    the score, then the tie-breaker); epoch -1 before any."""

    epoch: int = -1
    metrics: dict[str, float] = field(default_factory=dict)
    score: float = -1.0
    then: float = -1.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Best:
        """From checkpoint.pt's `best` (checked by pactl.checkpoint; older ones lack the score)."""
        return cls(
            int(data["epoch"]),
            dict(data["metrics"]),
            float(data.get("score", -1.0)),
            float(data.get("then", -1.0)),
        )


@dataclass
class RunState:
    """What a run knows of its epochs so far: the best one, the last one's numbers, and epoch
    0's (the start each later epoch is held against). checkpoint.pt keeps it for --resume."""

    best: Best = field(default_factory=Best)
    last: dict[str, float] = field(default_factory=dict)
    start: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RunFolder:
    """Where a run writes and what it writes there: the folder, what it trains on (config.json
    and provenance.json name them), metrics.csv's columns, the classes in the proxies' order,
    and whether it continues a run (--resume)."""

    path: Path
    source: str
    manifest: Manifest
    columns: list[str]
    classes: list[str]
    resume: bool = False


# A split's vectors and labels as an evaluation leaves them: ((N, D) float32 unit rows, (N,)).
Vectors = tuple[np.ndarray, np.ndarray]


@dataclass
class Schedule:
    """What the run trains by now: its settings and the learning-rate scheduler that follows
    them. The recipe's at first; then a time budget's plans and its early stop change them, and
    pactl.training.timing is the one module that does."""

    cfg: TrainConfig
    scheduler: torch.optim.lr_scheduler.LRScheduler


@dataclass(frozen=True)
class Trainer:
    """Everything one epoch needs, built once by build_trainer and never replaced. What changes
    during a run lives in two records, each written by one module: `schedule` (timing.py: the
    budget's plans, the early stop) and `state` (epoch_records.py: what each recorded epoch
    leaves, and a resumed run's). The calibration vectors are no part of it: evaluate_epoch
    returns them, and the loop keeps those of the epoch best.pt holds."""

    model: nn.Module  # EmbeddingNet, possibly wrapped by DDP / torch.compile
    net: EmbeddingNet  # the bare network (for state_dicts and warm-up)
    criterion: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    device: torch.device
    world: World
    model_cfg: ModelConfig
    schedule: Schedule
    doubt: LabelDoubt | None = None  # --drop-noisy's memory of the training embeddings
    writer: Any = None  # a TensorBoard SummaryWriter with --tensorboard (first process only)
    state: RunState = field(default_factory=RunState)

    @property
    def cfg(self) -> TrainConfig:
        """The settings the run trains by now (the schedule's)."""
        return self.schedule.cfg

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self.schedule.scheduler


@dataclass(frozen=True)
class Evaluated:
    """An evaluation of the network: the test metrics and the validation ones (prefixed val_),
    and the vectors of the split that calibrates best.pt (validation, else test)."""

    metrics: dict[str, float]
    vectors: Vectors | None


def param_groups(net: EmbeddingNet, criterion: nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """Backbone and head at lr; the loss's proxies at lr x proxy_lr_mult (100 in the paper),
    by the rule pactl.losses.optimizer_groups holds for everyone's loops."""
    from pactl.losses import optimizer_groups

    head = {id(p) for p in net.head_parameters()}
    body = [p for p in net.parameters() if id(p) not in head]
    model = [{"params": body}, {"params": net.head_parameters()}]
    return optimizer_groups(model, criterion, cfg.lr, cfg.proxy_lr_mult)


def set_warmup(net: EmbeddingNet, epoch: int, cfg: TrainConfig) -> None:
    """During warm-up epochs only the head and the proxies learn; the backbone is frozen."""
    warming = epoch < cfg.warmup_epochs
    for p in net.backbone.parameters():
        p.requires_grad_(not warming)


def build_criterion(model_cfg: ModelConfig, cfg: TrainConfig, num_classes: int) -> nn.Module:
    """The run's loss; with --bits, the code loss made around it (pactl.codes.learned)."""
    from pactl.codes.learned import build_code_loss
    from pactl.losses import build_loss

    if model_cfg.bits:
        return build_code_loss(
            cfg.code_proxies, cfg.loss, num_classes, model_cfg.bits, cfg.alpha, cfg.delta,
            cfg.quantization,
        )  # fmt: skip
    return build_loss(cfg.loss, num_classes, model_cfg.embedding_dim, cfg.alpha, cfg.delta)


def build_trainer(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    num_classes: int,
    world: World,
    labels: np.ndarray | None = None,
    run_dir: Path | None = None,
) -> Trainer:
    """The network, its loss, optimiser and schedule on the run's device; with `labels` (the
    training labels, 0..C-1) --drop-noisy's memory of them, and with `run_dir` --tensorboard's
    writer into it (on the first process)."""
    device = resolve_device(cfg.device)
    if device.type == "cuda" and world.enabled:
        device = torch.device("cuda", world.local_rank)
    net, model_cfg = build_model(model_cfg, seed=cfg.seed)
    net.to(device)
    if cfg.channels_last:
        net.to(memory_format=torch.channels_last)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 1)
        criterion = build_criterion(model_cfg, cfg, num_classes).to(device)
    optimizer = torch.optim.AdamW(
        param_groups(net, criterion, cfg), lr=cfg.lr, weight_decay=cfg.weight_decay
    )
    schedule = Schedule(cfg, make_scheduler(optimizer, cfg))
    model: nn.Module = net
    if world.enabled and cfg.sync_bn:
        # Each GPU sees its share of the batch: BatchNorm that trains should see all of it.
        net.backbone = nn.SyncBatchNorm.convert_sync_batchnorm(net.backbone)
    if world.enabled:
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(
            net, device_ids=ids, find_unused_parameters=cfg.warmup_epochs > 0
        )
    if cfg.compile:
        model = torch.compile(model)  # type: ignore[assignment]
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    dim = model_cfg.dimension or model_cfg.embedding_dim
    doubt = (
        None if labels is None else label_doubt(cfg.drop_noisy, labels, num_classes, dim, device)
    )
    writer = None
    if run_dir is not None and cfg.tensorboard and world.is_main:
        writer = tensorboard_writer(run_dir)
    return Trainer(
        model, net, criterion, optimizer, scaler, device, world, model_cfg, schedule, doubt, writer
    )


def tensorboard_writer(run_dir: Path) -> Any:
    """A SummaryWriter into run_dir/tensorboard (`tensorboard --logdir runs/`)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise PactlError(
            "--tensorboard needs tensorboard: pip install 'pactl[tensorboard]'"
        ) from None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def make_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig, done: int = 0
) -> torch.optim.lr_scheduler.LRScheduler:
    """Step decay, stepped once an epoch (describe_schedule says it in words). With `done`
    epochs already run (a time budget's second plan), the rates are those this schedule would
    have reached by now had it been the schedule from the start."""
    step = max(cfg.lr_decay_step, 1)
    if done:
        # The scheduler steps once as it is made (to epoch `done`), decaying when `done` ends a
        # period: the rates it starts from are those of epoch done - 1.
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * cfg.lr_decay_gamma ** ((done - 1) // step)
    return torch.optim.lr_scheduler.StepLR(
        optimizer, step_size=step, gamma=cfg.lr_decay_gamma, last_epoch=done - 1
    )


def on_device(t: Trainer, images: torch.Tensor) -> torch.Tensor:
    """A batch of images on the training device, in the memory layout the network runs in."""
    images = images.to(t.device, non_blocking=True)
    if t.cfg.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images


def train_step(
    t: Trainer, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor | None = None
) -> torch.Tensor:
    """One optimiser step on a batch already on the device; returns the (detached) loss.
    `indices`: the images' positions in the train split, which --drop-noisy remembers them by."""
    images = on_device(t, images)
    with autocast(t.device, t.cfg.amp):
        embeddings = t.model(images)  # (B, D) float32, unit rows
    if t.doubt is not None and indices is not None:  # the most doubted labels leave the loss
        embeddings, labels = t.doubt.select(embeddings, labels, indices)
    embeddings, labels = gather_batch(embeddings, labels, t.world)
    loss = t.criterion(embeddings, labels)  # float32 inside, whatever the autocast
    if not bool(torch.isfinite(loss)):  # never a step on NaN/inf: the caller stops the run
        return loss.detach()
    t.optimizer.zero_grad(set_to_none=True)
    t.scaler.scale(loss).backward()
    if t.cfg.grad_clip > 0:
        t.scaler.unscale_(t.optimizer)
        for params in (list(t.net.parameters()), list(t.criterion.parameters())):
            if params:  # proxy-free losses have none
                torch.nn.utils.clip_grad_value_(params, t.cfg.grad_clip)
    t.scaler.step(t.optimizer)
    t.scaler.update()
    return loss.detach()


def train_one_epoch(
    t: Trainer, loader: torch.utils.data.DataLoader, epoch: int, reporter: Reporter
) -> float:
    """One pass over the training split; returns the mean loss."""
    t.model.train()
    set_warmup(t.net, epoch, t.cfg)
    judged = t.doubt.start_epoch(epoch) if t.doubt is not None else None
    if judged is not None and t.world.is_main:
        reporter.log(judged.words(epoch))
    if t.cfg.freeze_bn:
        freeze_batchnorm(t.net.backbone)
    losses = []
    failed: list[tuple[int, str]] = []
    with reporter.bar(f"epoch {epoch + 1}/{t.cfg.epochs}", total=len(loader)) as advance:
        for batch in loader:
            failed.extend(batch.failed)
            # (Nearly) every image failed to decode: the step is skipped, on every rank at once.
            if min(share_sizes(len(batch.indices), t.world, t.device)) < 2:
                advance()
                continue
            images = batch.images.to(t.device, non_blocking=True)
            labels = batch.labels.to(t.device, non_blocking=True)
            value = float(train_step(t, images, labels, batch.indices))
            if not math.isfinite(value):
                raise PactlError(
                    f"the loss became {value} at epoch {epoch + 1}; lower --lr or use --amp none"
                )
            losses.append(value)
            advance()
    t.scheduler.step()
    if failed:
        reporter.log(f"epoch {epoch + 1}: skipped {len(failed)} unreadable images ({failed[0][1]})")
    return float(np.mean(losses)) if losses else float("nan")


def evaluate_epoch(t: Trainer, splits: Splits, reporter: Reporter, nmi: bool) -> Evaluated:
    """Test metrics, and validation ones prefixed with val_ (a --bits network's: its codes'
    by Hamming distance), with the vectors of the split that calibrates best.pt (validation,
    else test)."""
    kept: list[Vectors] = []
    val = len(splits.val) > 0
    codes = t.model_cfg.bits > 0
    scores = score_network(
        t.net, splits.test, t.model_cfg, t.cfg, t.device, reporter, nmi, False,
        keep=None if val else kept, codes=codes,
    )  # fmt: skip
    if val:
        found = score_network(
            t.net, splits.val, t.model_cfg, t.cfg, t.device, reporter, False, False, keep=kept,
            codes=codes,
        )  # fmt: skip
        scores.update({f"val_{k}": v for k, v in found.items() if k != "mean_cos"})
    return Evaluated(scores, kept[0] if kept else None)
