"""fit(): epochs of Proxy-Anchor training with warm-up, AMP, DDP, evaluation and checkpoints."""

from __future__ import annotations

import csv
import json
import math
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pactl import __version__
from pactl import checkpoint as ckpt
from pactl.config import ModelConfig, TrainConfig, to_dict
from pactl.console import Reporter
from pactl.datasets import Manifest
from pactl.distributed import World, barrier, gather_batch, init_world, share_sizes
from pactl.embed import autocast, embed_files, loader_for, resolve_device
from pactl.errors import PactlError
from pactl.fsutil import atomic_write_text
from pactl.model import EmbeddingNet, build_model, freeze_batchnorm

RUN_FORMAT = "pactl.run"


@dataclass
class TrainResult:
    run_dir: Path
    best_epoch: int
    best_metrics: dict[str, float]
    last_metrics: dict[str, float]


@dataclass
class Trainer:
    """Everything one epoch needs; built once by fit()."""

    model: nn.Module  # EmbeddingNet, possibly wrapped by DDP / torch.compile
    net: EmbeddingNet  # the bare network (for state_dicts and warm-up)
    criterion: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    device: torch.device
    world: World
    cfg: TrainConfig
    model_cfg: ModelConfig


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """One run = one folder: a used folder is refused unless resuming or overwriting."""
    if run_dir.exists() and any(run_dir.iterdir()):
        if resume:
            return
        if not overwrite:
            raise PactlError(
                f"run folder {run_dir} is not empty; pass --resume {run_dir} to continue it "
                "or --overwrite to start again"
            )
        shutil.rmtree(run_dir)
    elif resume:
        raise PactlError(f"nothing to resume in {run_dir}")
    run_dir.mkdir(parents=True, exist_ok=True)


def param_groups(net: EmbeddingNet, criterion: nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """Backbone and head at lr; the loss's proxies at lr x proxy_lr_mult (100 in the paper)."""
    head = {id(p) for p in net.head_parameters()}
    groups = [
        {"params": [p for p in net.parameters() if id(p) not in head], "lr": cfg.lr},
        {"params": net.head_parameters(), "lr": cfg.lr},
    ]
    proxies = list(criterion.parameters())
    if proxies:
        groups.append({"params": proxies, "lr": cfg.lr * cfg.proxy_lr_mult})
    return groups


def set_warmup(net: EmbeddingNet, epoch: int, cfg: TrainConfig) -> None:
    """During warm-up epochs only the head and the proxies learn; the backbone is frozen."""
    warming = epoch < cfg.warmup_epochs
    for p in net.backbone.parameters():
        p.requires_grad_(not warming)


def build_trainer(
    model_cfg: ModelConfig, cfg: TrainConfig, num_classes: int, world: World
) -> Trainer:
    from pactl.losses import build_loss

    device = resolve_device(cfg.device)
    if device.type == "cuda" and world.enabled:
        device = torch.device("cuda", world.local_rank)
    net, model_cfg = build_model(model_cfg, seed=cfg.seed)
    net.to(device)
    if cfg.channels_last:
        net.to(memory_format=torch.channels_last)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 1)
        criterion = build_loss(
            cfg.loss, num_classes, model_cfg.embedding_dim, cfg.alpha, cfg.delta
        ).to(device)
    optimizer = torch.optim.AdamW(
        param_groups(net, criterion, cfg), lr=cfg.lr, weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, step_size=max(cfg.lr_decay_step, 1), gamma=cfg.lr_decay_gamma
    )
    model: nn.Module = net
    if world.enabled:
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(
            net, device_ids=ids, find_unused_parameters=cfg.warmup_epochs > 0
        )
    if cfg.compile:
        model = torch.compile(model)  # type: ignore[assignment]
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    return Trainer(
        model, net, criterion, optimizer, scheduler, scaler, device, world, cfg, model_cfg
    )


def train_step(t: Trainer, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One optimiser step on a batch already on the device; returns the (detached) loss."""
    if t.cfg.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    with autocast(t.device, t.cfg.amp):
        embeddings = t.model(images)  # (B, D) float32, unit rows
    embeddings, labels = gather_batch(embeddings, labels, t.world)
    loss = t.criterion(embeddings, labels)  # float32 inside, whatever the autocast
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
            value = float(train_step(t, images, labels))
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


def train_loader(
    manifest: Manifest, labels: np.ndarray, t: Trainer, epoch: int
) -> torch.utils.data.DataLoader:
    """The epoch's loader; its order and augmentation depend only on (seed, epoch)."""
    from pactl.images import MPerClassSampler

    cfg = t.cfg
    generator = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
    base: torch.utils.data.Sampler[int]
    if cfg.sampler == "m_per_class":
        base = MPerClassSampler(labels, cfg.m_per_class, cfg.batch_size, generator)
    else:
        base = torch.utils.data.RandomSampler(range(len(labels)), generator=generator)
    torch.manual_seed(cfg.seed * 100_003 + epoch + t.world.rank)  # augmentation in-process
    worker_gen = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch * 101 + t.world.rank)
    return loader_for(
        manifest.files(),
        labels,
        t.model_cfg,
        cfg.batch_size // t.world.size,
        cfg.workers,
        t.device,
        train=True,
        augment=cfg.augment,
        sampler=RankSlice(base, cfg.batch_size, t.world),
        generator=worker_gen,
    )


def evaluate(
    net: nn.Module,
    manifest: Manifest,
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    device: torch.device,
    reporter: Reporter,
    with_nmi: bool = True,
    prepare: bool | None = None,
) -> dict[str, float]:
    """Recall@K, MAP@R, R-precision (and NMI) on the test split, or query vs gallery.

    `prepare` as in embed_files; training passes False: a network that changes every epoch
    would be traced and frozen anew each time, which small networks do not pay back.
    """
    from pactl import metrics

    def vectors(split: str) -> tuple[np.ndarray, np.ndarray]:
        part = manifest.select(split)
        done = embed_files(
            net,
            part.files(),
            model_cfg,
            device,
            reporter,
            workers=cfg.workers,
            amp=cfg.amp,
            channels_last=cfg.channels_last,
            prepare=prepare,
        )
        if done.failed:
            reporter.log(f"evaluation skipped {len(done.failed)} unreadable {split} images")
        return done.vectors, part.labels[done.rows]

    if manifest.eval_splits() == ("query", "gallery"):
        q, ql = vectors("query")
        g, gl = vectors("gallery")
        return metrics.evaluate(q, ql, cfg.eval_ks, g, gl, with_nmi=with_nmi, seed=cfg.seed)
    v, vl = vectors("test")
    return metrics.evaluate(v, vl, cfg.eval_ks, with_nmi=with_nmi, seed=cfg.seed)


def check_splits(manifest: Manifest, cfg: TrainConfig) -> tuple[Manifest, Manifest]:
    train = manifest.select("train")
    evaluation = manifest.select(*manifest.eval_splits())
    if len(np.unique(train.labels)) < 2:
        raise PactlError(f"{manifest.source}: the train split needs at least 2 classes")
    if len(evaluation) == 0:
        raise PactlError(f"{manifest.source}: the test split is empty")
    if cfg.batch_size > len(train):
        raise PactlError(
            f"--batch-size {cfg.batch_size} is larger than the train split ({len(train)} images)"
        )
    return train, evaluation


def metric_columns(cfg: TrainConfig) -> list[str]:
    recalls = [f"recall@{k}" for k in cfg.eval_ks]
    return ["epoch", "loss", "lr", *recalls, "map@r", "r_precision", "nmi", "seconds"]


def append_metrics(path: Path, columns: list[str], row: dict[str, Any]) -> None:
    """One CSV row per epoch, header written once, flushed per row."""
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        if new:
            writer.writeheader()
        writer.writerow({c: _fmt(row.get(c, "")) for c in columns})
        f.flush()


def _fmt(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value


def truncate_metrics(path: Path, epochs_done: int) -> None:
    """On resume, drop rows of epochs the checkpoint does not cover (a kill between the two)."""
    if not path.exists():
        return
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    width = len(rows[0])  # a row cut by a kill has fewer fields: dropped with the rest
    kept = [rows[0]] + [r for r in rows[1:] if len(r) == width and int(r[0]) <= epochs_done]
    atomic_write_text(path, "".join(",".join(r) + "\n" for r in kept))


def run_config(
    source: str, manifest: Manifest, model_cfg: ModelConfig, cfg: TrainConfig, classes: list[str]
) -> dict[str, Any]:
    return {
        "format": RUN_FORMAT,
        "version": 1,
        "pactl_version": __version__,
        "torch_version": str(torch.__version__),
        "dataset": source,
        "manifest": manifest.source,
        "model_config": to_dict(model_cfg),
        "train_config": to_dict(cfg),
        "classes": classes,
    }


def save_state(
    t: Trainer, run_dir: Path, epoch: int, classes: list[str], state: dict[str, Any]
) -> None:
    """checkpoint.pt: the full training state after `epoch` finished epochs."""
    weights = ckpt.clean_state_dict(t.model)
    payload = ckpt.export_payload(weights, t.model_cfg, classes, epoch, state["last"])
    payload.update(
        kind="full",
        proxies={k: v.detach().cpu() for k, v in t.criterion.state_dict().items()},
        train_config=to_dict(t.cfg),
        optimizer=t.optimizer.state_dict(),
        scheduler=t.scheduler.state_dict(),
        scaler=t.scaler.state_dict(),
        rng={"torch": torch.get_rng_state()},
        best=state["best"],
    )
    ckpt.save(run_dir / "checkpoint.pt", payload)


def restore_state(t: Trainer, run_dir: Path) -> tuple[int, dict[str, Any]]:
    payload = ckpt.load(run_dir / "checkpoint.pt")
    if payload.get("kind") != "full":
        raise PactlError(f"{run_dir}/checkpoint.pt is an export, not a training state")
    t.net.load_state_dict(payload["model"])
    t.criterion.load_state_dict(payload["proxies"])
    t.optimizer.load_state_dict(payload["optimizer"])
    t.scheduler.load_state_dict(payload["scheduler"])
    t.scaler.load_state_dict(payload["scaler"])
    torch.set_rng_state(payload["rng"]["torch"])
    return int(payload["epoch"]), {"best": payload["best"], "last": payload["metrics"]}


def fit(
    source: str,
    manifest: Manifest,
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    run_dir: Path,
    reporter: Reporter,
    resume: bool = False,
) -> TrainResult:
    """Train on the train split, evaluate on the test split each epoch, keep the best export."""
    world = init_world(cfg.device)
    if cfg.batch_size % world.size:
        raise PactlError(
            f"--batch-size {cfg.batch_size} is not divisible by {world.size} processes"
        )
    train, evaluation = check_splits(manifest, cfg)
    reporter.log(f"training on {manifest.source} -> {run_dir}")
    classes_present = np.unique(train.labels)
    labels = np.searchsorted(classes_present, train.labels)  # 0..C-1 for the proxies
    classes = [str(c) for c in classes_present.tolist()]
    t = build_trainer(model_cfg, cfg, len(classes_present), world)
    state: dict[str, Any] = {"best": {"epoch": 0, "metrics": {}}, "last": {}}
    start = 0
    if resume:
        start, state = restore_state(t, run_dir)
        truncate_metrics(run_dir / "metrics.csv", start)
        reporter.log(f"resuming {run_dir} after epoch {start}")
    elif world.is_main:
        info = run_config(source, manifest, t.model_cfg, cfg, classes)
        atomic_write_text(run_dir / "config.json", json.dumps(info, indent=2) + "\n")
    columns = metric_columns(cfg)
    for epoch in range(start, cfg.epochs):
        began = time.perf_counter()
        lr = t.optimizer.param_groups[0]["lr"]
        loss = train_one_epoch(t, train_loader(train, labels, t, epoch), epoch, reporter)
        row: dict[str, Any] = {"epoch": epoch + 1, "loss": loss, "lr": lr}
        last = epoch + 1 == cfg.epochs
        if world.is_main and ((epoch + 1) % cfg.eval_every == 0 or last):
            nmi = last or len(np.unique(evaluation.labels)) <= 1000
            scores = evaluate(t.net, evaluation, t.model_cfg, cfg, t.device, reporter, nmi, False)
            row.update(scores)
        row["seconds"] = time.perf_counter() - began
        if world.is_main:
            state["last"] = {k: v for k, v in row.items() if isinstance(v, float)}
            record_epoch(t, run_dir, row, columns, classes, state, reporter)
        barrier(world)
    if world.is_main:
        from pactl.report import plot_curves

        plot_curves(run_dir / "metrics.csv", run_dir / "curves.png")
    best = state["best"]
    return TrainResult(run_dir, int(best["epoch"]), dict(best["metrics"]), dict(state["last"]))


def record_epoch(
    t: Trainer,
    run_dir: Path,
    row: dict[str, Any],
    columns: list[str],
    classes: list[str],
    state: dict[str, Any],
    reporter: Reporter,
) -> None:
    """metrics.csv row, best.pt when Recall@1 improved, then checkpoint.pt (last: it commits)."""
    epoch = row["epoch"]
    append_metrics(run_dir / "metrics.csv", columns, row)
    recall = row.get("recall@1")
    shown = ", ".join(f"{k} {row[k]:.4f}" for k in columns[1:] if isinstance(row.get(k), float))
    reporter.log(f"epoch {epoch}/{t.cfg.epochs}: {shown}")
    best_recall = state["best"]["metrics"].get("recall@1", -1.0)
    if recall is not None and recall > best_recall:
        state["best"] = {"epoch": epoch, "metrics": state["last"]}
        weights = ckpt.clean_state_dict(t.model)
        ckpt.save(
            run_dir / "best.pt",
            ckpt.export_payload(weights, t.model_cfg, classes, epoch, state["last"]),
        )
    save_state(t, run_dir, epoch, classes, state)


def latest_run(runs: Path) -> Path:
    """The most recently started run folder under `runs` (by its config.json)."""
    candidates = [p.parent for p in runs.glob("*/config.json")]
    if not candidates:
        raise PactlError(f"no runs under {runs}/: train one first with `pactl train NAME`")
    return max(candidates, key=lambda p: (p / "config.json").stat().st_mtime)


def resumed_configs(run_dir: Path) -> tuple[str, ModelConfig, TrainConfig]:
    """The source, model and train configs a run was started with (from its config.json)."""
    from pactl.config import from_dict

    try:
        info = json.loads((run_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PactlError(f"cannot read {run_dir}/config.json ({e})") from None
    return (
        info["dataset"],
        from_dict(ModelConfig, info["model_config"]),
        from_dict(TrainConfig, info["train_config"]),
    )
