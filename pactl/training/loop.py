"""fit(): epochs of Proxy-Anchor training with warm-up, AMP, DDP, evaluation and checkpoints."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pactl.config import ModelConfig, TrainConfig
from pactl.console import Reporter
from pactl.datasets import Manifest
from pactl.errors import PactlError
from pactl.loaders import loader_for
from pactl.recipe import describe_recipe, resolve_train_config
from pactl.runs import metric_columns, truncate_metrics, writing_in
from pactl.training.distributed import barrier, init_world
from pactl.training.epoch_records import record_epoch, restore_state, write_run_files
from pactl.training.evaluation import calibrate_checkpoint
from pactl.training.noise import with_label_noise
from pactl.training.samplers import SAMPLERS, RankSlice
from pactl.training.splits import (
    Splits,
    check_splits,
    class_names,
    disagreement,
    readable_rows,
    write_split,
)
from pactl.training.start import evaluate_start
from pactl.training.timing import Budget, after_epoch, fit_to_budget
from pactl.training.trainer import (
    RunFolder,
    Trainer,
    Vectors,
    build_trainer,
    evaluate_epoch,
    train_one_epoch,
)


@dataclass
class TrainResult:
    run_dir: Path
    best_epoch: int
    best_metrics: dict[str, float]
    last_metrics: dict[str, float]
    selection: str  # val | test | last: what chose best_epoch


def train_loader(
    manifest: Manifest, labels: np.ndarray, t: Trainer, epoch: int
) -> torch.utils.data.DataLoader:
    """The epoch's loader; its order and augmentation depend only on (seed, epoch)."""
    cfg = t.cfg
    generator = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
    base = SAMPLERS[cfg.sampler](labels, cfg, generator)
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
        crop_scale=cfg.crop_scale,
        sampler=RankSlice(base, cfg.batch_size, t.world),
        generator=worker_gen,
    )


def calibrate_run(
    t: Trainer, splits: Splits, run_dir: Path, reporter: Reporter, kept: Vectors | None
) -> None:
    """best.pt's same-item threshold on the validation classes, else the test classes (from
    `kept`, the vectors of best.pt's epoch, where there are any); a set that cannot be
    calibrated (one image per class) is a warning, not a failed run."""
    part, split = (splits.val, "val") if len(splits.val) else (splits.test, "test")
    try:
        with writing_in(run_dir):
            calibrate_checkpoint(run_dir / "best.pt", part, split, t.cfg, t.device, reporter, kept)
    except PactlError as e:
        reporter.warn(f"best.pt has no same-item calibration: {e}")


def fit(
    source: str,
    manifest: Manifest,
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    run_dir: Path,
    reporter: Reporter,
    resume: bool = False,
    shared_start: Path | None = None,
) -> TrainResult:
    """Train on the train split; evaluate before the first step (epoch 0) and after each epoch
    on the validation classes (which choose best.pt) and the test classes. With a time budget
    (not on resume: the plans made before stand), epochs are fitted to it after epoch 0 and
    again after the first epoch that trains everything.
    `shared_start`: a folder where runs that start alike share their epoch-0 row, BatchNorm
    calibration and header check (pactl.training.start_cache)."""
    began = time.perf_counter()
    world = init_world(cfg.device)
    if cfg.batch_size % world.size:
        raise PactlError(
            f"--batch-size {cfg.batch_size} is not divisible by {world.size} processes"
        )
    cfg = resolve_train_config(model_cfg, cfg, world.enabled)
    readable = readable_rows(manifest, run_dir, reporter, world.is_main, shared_start)
    splits = check_splits(readable, cfg, len(manifest) - len(readable))
    if world.is_main:
        write_split(splits, run_dir)
    cfg = selection_of(cfg, splits, reporter)
    reporter.log(f"training on {readable.source} -> {run_dir}")
    reporter.log(describe_recipe(model_cfg, cfg, splits.train, splits.val, splits.test))
    classes_present = np.unique(splits.train.labels)
    labels = np.searchsorted(classes_present, splits.train.labels)  # 0..C-1 for the proxies
    columns = metric_columns(cfg, with_val=len(splits.val) > 0)
    classes = class_names(splits.train, classes_present)
    labels = with_label_noise(
        labels, splits.train.paths, classes, cfg.label_noise, cfg.seed, run_dir, reporter,
        world.is_main,
    )  # fmt: skip
    run = RunFolder(run_dir, source, readable, columns, classes, resume)
    t = build_trainer(model_cfg, cfg, len(classes_present), world, labels, run_dir)
    start = restore_state(t, run_dir) if resume else 0
    if resume:
        truncate_metrics(run_dir / "metrics.csv", start)
        reporter.log(f"resuming {run_dir} after epoch {start}")
    write_run_files(t, run)
    budget = Budget(began, t.cfg) if cfg.time_budget and not resume else None
    kept = None  # the calibration vectors of the epoch best.pt holds (a resume has none)
    if not resume:
        first = evaluate_start(t, splits, run, reporter, shared_start)
        kept = first.kept
        if budget is not None:
            budget.reserve = first.seconds
            fit_to_budget(t, time.perf_counter() - began, first.seconds, first.estimate, reporter)
            write_run_files(t, run)
    kept = train_epochs(t, splits, labels, start, run, budget, reporter, kept)
    if world.is_main:
        finish_run(t, splits, run_dir, reporter, kept)
    best = t.state.best
    return TrainResult(run_dir, best.epoch, dict(best.metrics), dict(t.state.last), t.cfg.selection)


def selection_of(cfg: TrainConfig, splits: Splits, reporter: Reporter) -> TrainConfig:
    """What chooses best.pt: the validation classes, unless there are none (then the last
    epoch, said once)."""
    if cfg.selection != "val" or len(splits.val):
        return cfg
    why = "--val-classes 0" if not cfg.val_classes else "too few train classes to hold out"
    reporter.log(f"no validation classes ({why}): best.pt is the last epoch")
    return dataclasses.replace(cfg, selection="last")


@dataclass(frozen=True)
class Recorded:
    """An epoch as the loop goes on from it: its seconds, and whether it is best.pt's now with
    its calibration vectors (None where it was not evaluated)."""

    seconds: float
    best: bool = False
    vectors: Vectors | None = None


def train_epochs(
    t: Trainer,
    splits: Splits,
    labels: np.ndarray,
    start: int,
    run: RunFolder,
    budget: Budget | None,
    reporter: Reporter,
    kept: Vectors | None = None,
) -> Vectors | None:
    """The epochs from `start` on; with a `budget`, planned again after the first epoch that
    trains everything, and stopped early when one more would end past it. Returns the
    calibration vectors of the epoch best.pt holds (`kept`: those it held before)."""
    epoch = start
    while epoch < t.cfg.epochs:  # a budget's second plan may change t.cfg.epochs
        recorded = train_epoch(t, splits, labels, epoch, run, reporter)
        if recorded.best:
            kept = recorded.vectors
        if budget is not None and after_epoch(t, budget, epoch, recorded.seconds, run, reporter):
            break
        epoch += 1
    return kept


def train_epoch(
    t: Trainer,
    splits: Splits,
    labels: np.ndarray,
    epoch: int,
    run: RunFolder,
    reporter: Reporter,
) -> Recorded:
    """One epoch: its steps, its evaluation (on schedule), its row, best.pt and checkpoint.pt."""
    cfg = t.cfg
    began = time.perf_counter()
    lr = t.optimizer.param_groups[0]["lr"]
    loss = train_one_epoch(t, train_loader(splits.train, labels, t, epoch), epoch, reporter)
    row: dict[str, Any] = {"epoch": epoch + 1, "loss": loss, "lr": lr}
    if t.doubt is not None and t.doubt.judged is not None:  # --drop-noisy auto's choice
        row.update(noise_rate=t.doubt.judged.estimate.overall, dropped=t.doubt.judged.dropped)
    last = epoch + 1 == cfg.epochs
    vectors = None  # an epoch left unevaluated (--eval-every) has no vectors of its own
    if t.world.is_main and ((epoch + 1) % cfg.eval_every == 0 or last):
        nmi = last or len(np.unique(splits.test.labels)) <= 1000
        evaluated = evaluate_epoch(t, splits, reporter, nmi)
        row.update(evaluated.metrics)
        vectors = evaluated.vectors
    row["seconds"] = time.perf_counter() - began
    best = t.world.is_main and record_epoch(t, run, row, reporter)
    barrier(t.world)
    return Recorded(float(row["seconds"]), best, vectors)


def finish_run(
    t: Trainer, splits: Splits, run_dir: Path, reporter: Reporter, kept: Vectors | None = None
) -> None:
    """After the last epoch: curves.png, the TensorBoard file closed, best.pt calibrated (from
    `kept`, the vectors of best.pt's epoch, where there are any)."""
    from pactl.report import plot_curves

    with writing_in(run_dir):
        plot_curves(run_dir / "metrics.csv", run_dir / "curves.png")
    if t.writer is not None:
        t.writer.close()
    calibrate_run(t, splits, run_dir, reporter, kept)
    unlike = disagreement(t.state.best.metrics, splits)
    if unlike is not None:
        reporter.warn(unlike)
