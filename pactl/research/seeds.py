"""`pactl train ... --seeds 0,1,2`: one recipe trained once per seed into sibling run folders
(`<name>-s0`, `<name>-s1`, ...), then the mean and standard deviation of each metric.

One run is one lucky or unlucky draw of initialisation, sampling and augmentation; the spread
over seeds says how far apart two recipes must be before the difference means anything.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pactl.config import ModelConfig, TrainConfig
from pactl.console import Reporter
from pactl.datasets import Manifest
from pactl.errors import PactlError, UsageError
from pactl.rules import MAX_SEED
from pactl.store.generations import atomic_write_text

MAX_SEEDS = 100


@dataclass(frozen=True)
class SeedStats:
    metric: str
    mean: float
    std: float  # sample standard deviation (n - 1); NaN for one seed
    values: tuple[float, ...]  # one per seed, in the seeds' order


@dataclass(frozen=True)
class SeedsResult:
    runs: tuple[Path, ...]
    seeds: tuple[int, ...]
    best: tuple[SeedStats, ...]  # of the epoch best.pt holds, per run
    last: tuple[SeedStats, ...]  # of the last epoch
    summary: Path  # the CSV with both


def parse_seeds(text: str) -> tuple[int, ...]:
    """`0,1,2` or `0-4` (both ends included) as distinct seeds, in the order given."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise UsageError(f"--seeds {text!r}: give seeds as 0,1,2 or 0-4")
        seeds.extend(range(int(low), int(high or low) + 1))
    if len(set(seeds)) != len(seeds) or not seeds or len(seeds) > MAX_SEEDS:
        raise UsageError(f"--seeds {text!r}: give 1 to {MAX_SEEDS} distinct seeds")
    if max(seeds) > MAX_SEED:
        raise UsageError(f"--seeds: a seed is at most {MAX_SEED}")
    return tuple(seeds)


def seed_run_name(name: str, seed: int) -> str:
    return f"{name}-s{seed}"


def stats(per_run: list[dict[str, float]]) -> tuple[SeedStats, ...]:
    """Mean and sample std of each metric every run has, in the first run's order."""
    keys = [k for k in per_run[0] if all(k in r for r in per_run) and k != "epoch"]
    found = []
    for key in keys:
        values = np.array([r[key] for r in per_run], dtype=np.float64)
        std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        found.append(SeedStats(key, float(values.mean()), std, tuple(values.tolist())))
    return tuple(found)


def summary_csv(
    seeds: tuple[int, ...], best: tuple[SeedStats, ...], last: tuple[SeedStats, ...]
) -> str:
    """`of,metric,mean,std,s<seed>...`: one row per metric of the best and of the last epoch."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["of", "metric", "mean", "std", *(f"s{s}" for s in seeds)])
    for of, found in (("best", best), ("last", last)):
        for s in found:
            writer.writerow(
                [of, s.metric, f"{s.mean:.6g}", f"{s.std:.6g}", *(f"{v:.6g}" for v in s.values)]
            )
    return buffer.getvalue()


def train_seeds(
    source: str,
    manifest: Manifest,
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    runs: Path,
    name: str,
    seeds: tuple[int, ...],
    reporter: Reporter,
    overwrite: bool = False,
) -> SeedsResult:
    """fit() once per seed into runs/<name>-s<seed>; the summary in runs/<name>-seeds.csv."""
    from pactl.runs import prepare_run_dir
    from pactl.training.loop import fit

    folders = [runs / seed_run_name(name, s) for s in seeds]
    for folder in folders:  # every folder is checked before the first run starts
        if folder.exists() and any(folder.iterdir()) and not overwrite:
            raise PactlError(
                f"run folder {folder} is not empty; pass --overwrite to start the seeds again"
            )
    best, last = [], []
    for i, (seed, folder) in enumerate(zip(seeds, folders, strict=True)):
        reporter.log(f"seed {seed} ({i + 1} of {len(seeds)}) -> {folder}")
        prepare_run_dir(folder, resume=False, overwrite=overwrite)
        result = fit(
            source, manifest, model_cfg, dataclasses.replace(cfg, seed=seed), folder, reporter
        )
        best.append({"best_epoch": float(result.best_epoch), **result.best_metrics})
        last.append(result.last_metrics)
    best_stats, last_stats = stats(best), stats(last)
    path = runs / f"{name}-seeds.csv"
    atomic_write_text(path, summary_csv(seeds, best_stats, last_stats))
    return SeedsResult(tuple(folders), seeds, best_stats, last_stats, path)


def shown(found: tuple[SeedStats, ...], keys: tuple[str, ...] = ("recall@", "map@r")) -> list[str]:
    """`recall@1 0.6123 ± 0.0100` lines for the retrieval metrics."""
    lines = []
    for s in found:
        if s.metric.startswith(keys) or s.metric.startswith(tuple(f"val_{k}" for k in keys)):
            spread = "" if math.isnan(s.std) else f" ± {s.std:.4f}"
            lines.append(f"{s.metric:16s} {s.mean:.4f}{spread}")
    return lines
