"""Epoch 0: the network evaluated before its first step (the start every later epoch is
compared with), the BatchNorm statistics of random weights calibrated first, both shared by
sweep points that start alike (pactl.training.start_cache).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pactl import checkpoint as ckpt
from pactl.console import QUIET, Reporter, duration_words
from pactl.datasets import Manifest
from pactl.loaders import loader_for
from pactl.training.distributed import barrier
from pactl.training.epoch_records import record_epoch
from pactl.training.splits import Splits
from pactl.training.timing import estimate_epoch
from pactl.training.trainer import RunFolder, Trainer, Vectors, evaluate_epoch, on_device


@dataclass(frozen=True)
class EpochZero:
    """Epoch 0 as the run goes on from it: its seconds, an epoch's estimated duration (None
    where no step could be timed), and its calibration vectors where it is best.pt's (None
    otherwise, and where its row was a shared start's)."""

    seconds: float
    estimate: float | None
    kept: Vectors | None = None


def evaluate_start(
    t: Trainer, splits: Splits, run: RunFolder, reporter: Reporter, shared: Path | None = None
) -> EpochZero:
    """Epoch 0: the network before its first step, the start every later epoch is compared
    with (read from `shared` where a run that started alike stored it); then an estimate of an
    epoch's duration."""
    if t.model_cfg.weights == "none" and not t.cfg.freeze_bn:
        calibrate_batchnorm(t, splits.train, shared=shared, reporter=reporter)
    row: dict[str, Any] = {"epoch": 0, "seconds": 0.0}
    vectors = None
    if t.world.is_main:
        metrics, vectors = start_metrics(t, splits, run.path, reporter, shared)
        row.update(metrics)
    estimate = estimate_epoch(t, splits.train, len(run.classes), row["seconds"])
    best = False
    if t.world.is_main:
        best = record_epoch(t, run, row, reporter)
        about = "?" if estimate is None else duration_words(estimate)
        reporter.log(f"about {about} per epoch (a timed step with its decoding, and evaluation)")
        if row.get("val_recall@1") == 1.0 and row.get("val_map@r") == 1.0:
            reporter.warn(
                "the validation classes are all retrieved before training (Recall@1 and MAP@R "
                "1.0): they cannot tell epochs apart, so best.pt follows the last epoch; hold "
                "out more classes with --val-classes"
            )
    barrier(t.world)
    return EpochZero(row["seconds"], estimate, vectors if best else None)


def start_metrics(
    t: Trainer, splits: Splits, run_dir: Path, reporter: Reporter, shared: Path | None
) -> tuple[dict[str, float], Vectors | None]:
    """Epoch 0's metrics and the seconds they took, with the calibration vectors: evaluated,
    or (with `shared`) the row a run whose network started alike stored there (no vectors
    then), and stored there when evaluated."""
    from pactl.training import start_cache
    from pactl.training.provenance import data_fingerprint

    if shared is None:
        return timed_evaluation(t, splits, reporter)
    shared = shared / start_cache.EPOCH0
    state = ckpt.fingerprint(ckpt.clean_state_dict(t.net))  # after the BatchNorm calibration
    parts = {"train": splits.train, "val": splits.val, "test": splits.test}
    data = {name: data_fingerprint(part) for name, part in parts.items()}
    key = start_cache.start_key(state, data, t.model_cfg, t.cfg, device_words(t.device))
    found = start_cache.read_row(shared, key)
    if found is not None:
        reporter.log(f"epoch 0: the network starts as {found.run}'s did; its row is reused")
        return found.row, None
    row, vectors = timed_evaluation(t, splits, reporter)
    why = start_cache.write_row(shared, key, start_cache.SharedRow(row, run_dir.name))
    if why is not None:
        reporter.log(f"epoch 0 not shared: {why}")
    return row, vectors


def timed_evaluation(
    t: Trainer, splits: Splits, reporter: Reporter
) -> tuple[dict[str, float], Vectors | None]:
    began = time.perf_counter()
    evaluated = evaluate_epoch(t, splits, reporter, nmi=True)
    return {**evaluated.metrics, "seconds": time.perf_counter() - began}, evaluated.vectors


def device_words(device: torch.device) -> str:
    """The device's kind, and a GPU's name: what evaluation numbers may differ by."""
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    return device.type


def calibrate_batchnorm(
    t: Trainer,
    train: Manifest,
    batches: int = 8,
    shared: Path | None = None,
    reporter: Reporter = QUIET,
) -> None:
    """Random weights come with BatchNorm statistics (mean 0, variance 1) that describe no
    data: evaluated with them, a random network is another network than the one training
    sees. Their running statistics are set to the average over a few training batches (test
    transform, no gradient), so epoch 0 measures the network training starts from. With
    `shared` (a sweep's cache folder), a network that starts from the same state on the same
    batches loads the statistics stored there."""
    from pactl.training import start_cache
    from pactl.training.provenance import data_fingerprint

    norms = [m for m in t.net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    size = min(t.cfg.batch_size // t.world.size, len(train))
    key = folder = None
    if shared is not None:
        folder = shared / start_cache.BATCHNORM
        state = ckpt.fingerprint(ckpt.clean_state_dict(t.net))
        key = start_cache.batchnorm_key(
            state, data_fingerprint(train), t.model_cfg, size, batches, device_words(t.device)
        )
        found = start_cache.read_buffers(folder, key)
        if found is not None and set(found) == set(batchnorm_buffers(t.net)):
            with torch.no_grad():
                for name, value in batchnorm_buffers(t.net).items():
                    value.copy_(found[name])
            reporter.log("BatchNorm statistics: calibrated before for this start, reused")
            return
    run_batchnorm_calibration(t, norms, train.files()[: size * batches], size)
    if folder is not None and key is not None and t.world.is_main:
        why = start_cache.write_buffers(folder, key, batchnorm_buffers(t.net))
        if why is not None:
            reporter.log(f"BatchNorm calibration not shared: {why}")


def batchnorm_buffers(net: nn.Module) -> dict[str, torch.Tensor]:
    """Every BatchNorm layer's buffers (running mean and variance, batches counted), by name."""
    return {
        f"{name}.{buffer}": value
        for name, module in net.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm)
        for buffer, value in module.named_buffers(recurse=False)
    }


def run_batchnorm_calibration(
    t: Trainer, norms: list[nn.modules.batchnorm._BatchNorm], files: list[Path], size: int
) -> None:
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches below
    t.net.train()
    with torch.no_grad():
        for batch in loader_for(files, None, t.model_cfg, size, 0, t.device, draft=False):
            if len(batch.indices) > 1:
                t.net(on_device(t, batch.images))
    for m, momentum in zip(norms, momenta, strict=True):
        m.momentum = momentum
