"""`pactl eval`: a checkpoint's or a backbone's metrics on a dataset's test split, and its
same-item calibration on held-out classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pactl.config import (
    ModelConfig,
)
from pactl.console import Reporter
from pactl.errors import PactlError

if TYPE_CHECKING:
    from pactl.checkpoint import ModelSource


def default_ks(source: str) -> tuple[int, ...]:
    """The K of Recall@K a dataset is reported with: its preset's (the paper's), else 1, 2, 4, 8."""
    from pactl.recipe import PRESETS

    return PRESETS[source].train.eval_ks if source in PRESETS else (1, 2, 4, 8)


def run_source(checkpoint: Path) -> tuple[str, bool] | None:
    """The source a checkpoint's run trained on and whether it followed links, when the
    checkpoint lies in a run folder (beside its config.json); else None."""
    from pactl.runs import resumed_configs

    if not (checkpoint.parent / "config.json").is_file():
        return None
    source, _, cfg = resumed_configs(checkpoint.parent)
    return source, cfg.follow_links


def eval_checkpoint(
    source: str,
    model_from: ModelSource,
    ks: tuple[int, ...],
    device_name: str,
    workers: int,
    reporter: Reporter,
    follow_links: bool = False,
) -> tuple[dict[str, float], ModelConfig]:
    """Recall@K, MAP@R, R-precision and NMI of a checkpoint's or a backbone's network on a
    dataset's test split, and the network's model config."""
    from pactl.checkpoint import open_network
    from pactl.config import TrainConfig
    from pactl.datasets import load_source
    from pactl.evaluation import evaluate
    from pactl.runtime import resolve_device

    manifest = load_source(source, reporter, follow_links=follow_links)
    evaluation = manifest.select(*manifest.eval_splits())
    if not len(evaluation):
        raise PactlError(f"{source} has no test split to evaluate on")
    model, network = open_network(model_from)
    device = resolve_device(device_name)
    model.to(device)
    cfg = TrainConfig(eval_ks=ks, workers=workers)
    scores = evaluate(model, evaluation, network.config, cfg, device, reporter, with_nmi=True)
    return scores, network.config


def calibrate_source(
    source: str,
    model_from: ModelSource,
    precision: float,
    device_name: str,
    workers: int,
    reporter: Reporter,
    follow_links: bool = False,
) -> Any:
    """The same-item calibration of a checkpoint's or a backbone's network on a dataset's
    held-out classes (its val split if it has one, else its test split); a checkpoint gets it
    stored, with calibration.png beside it. Returns the pactl.calibrate.Calibration."""
    from pactl.calibrate import CalibrationConfig, calibrate, describe
    from pactl.checkpoint import open_network
    from pactl.config import TrainConfig
    from pactl.datasets import load_source
    from pactl.evaluation import calibrate_checkpoint, split_vectors
    from pactl.runtime import resolve_device

    manifest = load_source(source, reporter, follow_links=follow_links)
    split = "val" if manifest.has_split("val") else "test"
    part = manifest.select("val") if split == "val" else manifest.select(*manifest.eval_splits())
    if not len(part):
        raise PactlError(f"{source} has no test split to calibrate on")
    device = resolve_device(device_name)
    cfg = TrainConfig(workers=workers, precision=precision)
    if isinstance(model_from, Path):
        return calibrate_checkpoint(model_from, part, split, cfg, device, reporter)
    model, network = open_network(model_from)
    model.to(device)
    vectors, labels = split_vectors(model, part, split, network.config, cfg, device, reporter)
    calibration = calibrate(vectors, labels, CalibrationConfig(precision=precision), split)
    reporter.log(f"{describe(calibration)} (not stored: no checkpoint)")
    return calibration
