"""A time budget's plans in a running fit(): the first after epoch 0 (fit_to_budget), the
second after the first epoch that trains everything (refit_to_budget), the early stop
(over_budget, after_epoch), and the epoch's estimated duration they start from (pactl.budget
does the arithmetic). This is the one module that writes a run's schedule (Trainer.schedule:
its settings as planned so far, and the scheduler that follows them).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from pactl.config import TrainConfig
from pactl.console import Reporter, counted, duration_words
from pactl.datasets import Manifest
from pactl.loaders import loader_for
from pactl.model import freeze_batchnorm
from pactl.recipe import describe_schedule
from pactl.runtime import autocast
from pactl.training.distributed import agree
from pactl.training.epoch_records import write_run_files
from pactl.training.trainer import RunFolder, Trainer, make_scheduler, on_device


@dataclass
class Budget:
    """A time budget's clock in a run: when it began, the recipe its plans scale (its first
    plan's epochs and decay), and the seconds kept for the end of the run."""

    began: float
    recipe: TrainConfig
    reserve: float = 0.0


def fit_to_budget(
    t: Trainer, elapsed: float, eval_seconds: float, estimate: float | None, reporter: Reporter
) -> None:
    """The epochs, decay step and warm-up of pactl.budget's plan, in t.cfg and its scheduler
    (every process takes the first one's measurements, so all plan alike)."""
    from pactl import budget

    cfg = t.cfg
    per_epoch = eval_seconds if estimate is None else estimate
    elapsed, per_epoch, eval_seconds = agree(t.world, [elapsed, per_epoch, eval_seconds])
    chosen = budget.plan(
        cfg.time_budget, elapsed, per_epoch, eval_seconds,
        cfg.epochs, cfg.lr_decay_step, cfg.warmup_epochs,
    )  # fmt: skip
    t.schedule.cfg = dataclasses.replace(
        cfg,
        epochs=chosen.epochs,
        lr_decay_step=chosen.lr_decay_step,
        warmup_epochs=chosen.warmup_epochs,
    )
    t.schedule.scheduler = make_scheduler(t.optimizer, t.cfg)
    reporter.log(
        f"time budget {duration_words(cfg.time_budget)}: {duration_words(elapsed)} spent, about "
        f"{duration_words(per_epoch)} per epoch: {counted(chosen.epochs, 'epoch')}, "
        + describe_schedule(t.cfg).removeprefix("schedule: ")
    )
    if not chosen.fits:
        reporter.warn(
            f"the time budget ({duration_words(cfg.time_budget)}) leaves less than one epoch "
            f"(about {duration_words(per_epoch)}) after epoch 0: training one epoch anyway"
        )


def refit_to_budget(
    t: Trainer,
    recipe: TrainConfig,
    elapsed: float,
    done: int,
    seconds: float,
    reserve: float,
    reporter: Reporter,
) -> None:
    """pactl.budget's second plan, after the first epoch that trained everything (`done`
    epochs so far, the last of them `seconds` long): t.cfg's epochs and decay step, and the
    scheduler moved onto the new step as if it had been the schedule from the start."""
    from pactl import budget

    elapsed, seconds, reserve = agree(t.world, [elapsed, seconds, reserve])
    chosen = budget.replan(
        t.cfg.time_budget, elapsed, done, seconds, reserve,
        recipe.epochs, recipe.lr_decay_step, t.cfg.warmup_epochs,
    )  # fmt: skip
    before = t.cfg
    if chosen.epochs == done:  # no room left: the run ends with the schedule it ran
        if done < before.epochs:
            t.schedule.cfg = dataclasses.replace(before, epochs=done)
            took, budget_words = duration_words(seconds), duration_words(before.time_budget)
            reporter.warn(
                f"stopping after epoch {done} of {before.epochs}: it took {took}, "
                f"and the {budget_words} budget has no room for another"
            )
        return
    if (chosen.epochs, chosen.lr_decay_step) == (before.epochs, before.lr_decay_step):
        return
    t.schedule.cfg = dataclasses.replace(
        before, epochs=chosen.epochs, lr_decay_step=chosen.lr_decay_step
    )
    t.schedule.scheduler = make_scheduler(t.optimizer, t.cfg, done)
    took, spent = duration_words(seconds), duration_words(elapsed)
    reporter.log(
        f"time budget {duration_words(before.time_budget)}: epoch {done} took {took}, "
        f"{spent} spent: {counted(chosen.epochs, 'epoch')} instead of "
        f"{before.epochs}, " + describe_schedule(t.cfg).removeprefix("schedule: ")
    )


def after_epoch(
    t: Trainer, budget: Budget, epoch: int, seconds: float, run: RunFolder, reporter: Reporter
) -> bool:
    """The budget's check after `epoch` (0-based), which took `seconds`: planned again after the
    first epoch that trains everything, and the schedule ended here when one more epoch would
    end past the budget; config.json says the schedule after each. Returns whether the run
    stops here."""
    elapsed = time.perf_counter() - budget.began
    if epoch == t.cfg.warmup_epochs:
        refit_to_budget(t, budget.recipe, elapsed, epoch + 1, seconds, budget.reserve, reporter)
        write_run_files(t, run)
    if not over_budget(t, elapsed, seconds, budget.reserve, epoch, reporter):
        return False
    t.schedule.cfg = dataclasses.replace(t.cfg, epochs=epoch + 1)
    write_run_files(t, run)
    return True


def over_budget(
    t: Trainer, elapsed: float, last: float, reserve: float, epoch: int, reporter: Reporter
) -> bool:
    """Whether a time-budgeted run stops after `epoch` (0-based) because one more epoch as long
    as this one would end past its budget; the first process decides for all."""
    from pactl import budget

    if not t.cfg.time_budget or epoch + 1 >= t.cfg.epochs:
        return False
    late = budget.stop_early(t.cfg.time_budget, elapsed, last, reserve)
    if not agree(t.world, [float(late)])[0]:
        return False
    reporter.warn(
        f"stopping after epoch {epoch + 1} of {t.cfg.epochs}: one more epoch (about "
        f"{duration_words(last)}) would end past the {duration_words(t.cfg.time_budget)} budget"
    )
    return True


def estimate_epoch(
    t: Trainer, train: Manifest, num_classes: int, eval_seconds: float
) -> float | None:
    """Seconds of a training epoch from a timed step (decoding and augmenting a batch of
    training images, as the workers share it, then forward and backward, the faster of two;
    BatchNorm statistics restored, no optimiser step) plus evaluation."""
    files = train.files()[: t.cfg.batch_size // t.world.size]
    began = time.perf_counter()
    loader = loader_for(
        files, None, t.model_cfg, len(files), 0, t.device, train=True, augment=t.cfg.augment,
        crop_scale=t.cfg.crop_scale,
    )  # fmt: skip
    batch = next(iter(loader))
    decoding = time.perf_counter() - began
    if len(batch.indices) < 2:
        return None
    buffers = {k: v.clone() for k, v in t.net.named_buffers()}
    images = on_device(t, batch.images)
    labels = torch.arange(len(images), device=t.device) % num_classes
    t.net.train()  # the bare network: no DDP collective on a step only this process takes
    if t.cfg.freeze_bn:
        freeze_batchnorm(t.net.backbone)
    timed = []
    for _ in range(2):  # the second step, warm (the first pays for allocations and kernels)
        began = time.perf_counter()
        with autocast(t.device, t.cfg.amp):
            embeddings = t.net(images)
        t.criterion(embeddings, labels).backward()
        timed.append(time.perf_counter() - began)
    step = min(timed)
    # Workers decode the next batches while the network steps; without them, one after the other.
    workers = t.cfg.workers
    step = max(step, decoding / workers) if workers else step + decoding
    t.optimizer.zero_grad(set_to_none=True)
    t.criterion.zero_grad(set_to_none=True)
    with torch.no_grad():
        for name, value in t.net.named_buffers():
            value.copy_(buffers[name])
    steps = len(train) // t.cfg.batch_size
    return steps * step + eval_seconds
