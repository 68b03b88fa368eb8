"""The run folder as a file contract: its marker (config.json, format pactl.run), metrics.csv
written one row an epoch and read back, the epoch best.pt holds, the latest run, and the
settings a run is resumed with.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from pactl.config import ModelConfig, TrainConfig, read_config, to_dict
from pactl.datasets import Manifest
from pactl.errors import PactlError
from pactl.rules import AUTO
from pactl.store.csv_cells import csv_text
from pactl.store.generations import atomic_write_text, make_folder
from pactl.version import __version__

SELECTION_KEYS = {"val": "val_recall@1", "test": "recall@1"}  # the metric that chooses best.pt


TIE_KEYS = {"val": "val_map@r", "test": "map@r"}  # what decides between epochs it ties


SELECTION_NAMES = {
    "val": "by validation Recall@1, then MAP@R",
    "test": "by test Recall@1, then MAP@R",
    "last": "the last",
}


def selection_score(row: dict[str, Any], selection: str) -> tuple[float, float] | None:
    """What best.pt is chosen by (train.record_epoch, and best_epoch reading metrics.csv): the
    selection split's Recall@1, then its MAP@R, which tells apart epochs that tie on a Recall@1
    a few validation classes saturate (all at 1.0, the untrained start among them); the epoch
    itself for `last`. None when the row has no score."""
    key = SELECTION_KEYS.get(selection)
    if key is None:
        return float(row["epoch"]), 0.0
    first = row.get(key)
    if first is None:
        return None
    then = row.get(TIE_KEYS[selection])
    return float(first), float(then) if then is not None else -1.0


def read_metrics(metrics_csv: Path) -> list[dict[str, float]]:
    """metrics.csv as numbers, one dict per row. Empty cells (an epoch not evaluated, epoch 0's
    loss) and cells that are not finite numbers are left out: one odd cell hides one point."""
    with open(metrics_csv, newline="", encoding="utf-8", errors="replace") as f:
        table = list(csv.DictReader(f))
    rows = []
    for row in table:
        numbers = {k: _number(v) for k, v in row.items() if isinstance(k, str)}
        kept = {k: v for k, v in numbers.items() if v is not None}
        if "epoch" in kept:
            rows.append(kept)
    return rows


def _number(cell: Any) -> float | None:
    try:
        value = float(cell)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def run_selection(run_dir: Path, columns: set[str]) -> str:
    """How best.pt was chosen: as the run's config.json records it (train_config.selection);
    without one, by validation Recall@1 when there are validation columns, else by test."""
    try:
        chosen = json.loads((run_dir / "config.json").read_bytes())["train_config"]["selection"]
    except (OSError, ValueError, KeyError, TypeError):
        chosen = None
    if chosen in SELECTION_NAMES:
        return str(chosen)
    return "val" if SELECTION_KEYS["val"] in columns else "test"


def best_epoch(rows: Sequence[dict[str, float]], selection: str) -> int | None:
    """The epoch best.pt holds, chosen as training chose it: the last epoch with the highest
    selection_score (the last epoch for `last`). None when nothing scored."""
    if selection not in SELECTION_NAMES:
        raise ValueError(f"selection must be one of {', '.join(SELECTION_NAMES)}: {selection!r}")
    scored = [(score, r) for r in rows if (score := selection_score(r, selection)) is not None]
    if not scored:
        return None
    return int(max(scored, key=lambda sr: (sr[0], sr[1]["epoch"]))[1]["epoch"])


RUN_FORMAT = "pactl.run"


RUN_VERSION = 1


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """One run = one folder: a used folder is refused unless resuming or overwriting.

    The run marker is config.json with `"format": "pactl.run"`: it is the first file a run
    writes (fit(), before any other), so a folder pactl train made holds it or nothing at all.
    --overwrite removes only a folder with the marker; anything else is someone's own folder.
    Under torchrun every process checks, and only the first removes (the others write nothing
    in the folder, and none writes before all have met in init_world).
    """
    if run_dir.is_symlink():
        raise PactlError(
            f"run folder {run_dir} is a symbolic link: pactl neither writes through nor removes "
            "it; give another --name"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise PactlError(f"run folder {run_dir} exists and is not a folder")
    if run_dir.exists() and any(run_dir.iterdir()):
        if resume:
            if not (run_dir / "checkpoint.pt").is_file():
                raise PactlError(
                    f"nothing to resume in {run_dir}: no epoch finished there; start it again "
                    "with the same command and --overwrite"
                )
            return
        if not overwrite:
            raise PactlError(
                f"run folder {run_dir} is not empty; pass --resume {run_dir} to continue it "
                "or --overwrite to start again"
            )
        if not is_run_dir(run_dir):
            raise PactlError(f"{run_dir} was not made by pactl train: not removing it")
        if os.environ.get("RANK", "0") == "0":
            try:
                shutil.rmtree(run_dir)
            except OSError as e:
                raise PactlError(f"cannot remove the run folder {run_dir}: {e.strerror}") from None
    elif resume:
        raise PactlError(f"nothing to resume in {run_dir}")
    make_folder(run_dir)


def is_run_dir(run_dir: Path) -> bool:
    """Whether `run_dir` carries the run marker (prepare_run_dir): a config.json of format
    pactl.run."""
    try:
        info = json.loads((run_dir / "config.json").read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("format") == RUN_FORMAT


@contextmanager
def writing_in(run_dir: Path) -> Iterator[None]:
    """A run file that cannot be written (a read-only folder, an I/O error) is one line naming
    the folder; a full disk already is one (pactl.store.generations), and the previous file is
    kept."""
    try:
        yield
    except OSError as e:
        raise PactlError(f"cannot write in the run folder {run_dir} ({e.strerror or e})") from None


def metric_columns(cfg: TrainConfig, with_val: bool) -> list[str]:
    """Test metrics under their own names, validation ones prefixed with val_; with
    --drop-noisy auto, each epoch's estimated noise rate and the images it left out."""
    recalls = [f"recall@{k}" for k in cfg.eval_ks]
    val = [f"val_{c}" for c in (*recalls, "map@r")] if with_val else []
    auto = ["noise_rate", "dropped"] if cfg.drop_noisy == AUTO else []
    return [
        "epoch",
        "loss",
        "lr",
        *recalls,
        "map@r",
        "r_precision",
        "nmi",
        *val,
        "mean_cos",
        *auto,
        "seconds",
    ]


def append_metrics(path: Path, columns: list[str], row: dict[str, Any]) -> None:
    """One CSV row per epoch, header written once; the file is replaced atomically with the new
    row added, so a kill or a full disk leaves every earlier row as it was."""
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    text = csv_text(None if before else columns, [[_fmt(row.get(c, "")) for c in columns]])
    atomic_write_text(path, before + text)


def _fmt(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value


def truncate_metrics(path: Path, epochs_done: int) -> None:
    """On resume, drop rows of epochs the checkpoint does not cover (a kill between the two)."""
    if not path.exists():
        return
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    width = len(rows[0])  # a row cut by a kill has fewer fields: dropped with the rest
    kept = [rows[0]] + [
        r for r in rows[1:] if len(r) == width and r[0].isdigit() and int(r[0]) <= epochs_done
    ]
    atomic_write_text(path, "".join(",".join(r) + "\n" for r in kept))


def run_config(
    source: str, manifest: Manifest, model_cfg: ModelConfig, cfg: TrainConfig, classes: list[str]
) -> dict[str, Any]:
    return {
        "format": RUN_FORMAT,  # also the run marker (prepare_run_dir)
        "version": RUN_VERSION,
        "pactl_version": __version__,
        "torch_version": str(torch.__version__),
        "dataset": source,
        "manifest": manifest.source,
        "model_config": to_dict(model_cfg),
        "train_config": to_dict(cfg),
        "classes": classes,
    }


def latest_run(runs: Path) -> Path:
    """The most recently started run under `runs` that has finished an epoch (checkpoint.pt):
    a run stopped in its first epoch has nothing to resume, evaluate or index."""
    started = [p.parent for p in runs.glob("*/config.json")]
    if not started:
        raise PactlError(f"no runs under {runs}/: train one first with `pactl train NAME`")
    finished = [p for p in started if (p / "checkpoint.pt").is_file()]
    if not finished:
        raise PactlError(
            f"no run under {runs}/ has finished an epoch yet ({len(started)} started): "
            "let one train for an epoch"
        )
    return max(finished, key=lambda p: (p / "config.json").stat().st_mtime)


def resumed_configs(run_dir: Path) -> tuple[str, ModelConfig, TrainConfig]:
    """The source, model and train configs a run was started with (from its config.json),
    each entry checked before it is used: one line naming the file and the entry."""
    from pactl.losses import LOSSES
    from pactl.model import check_model_config

    path = run_dir / "config.json"
    try:
        info = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise PactlError(f"cannot read {path} ({e})") from None
    if not isinstance(info, dict) or info.get("format") != RUN_FORMAT:
        raise PactlError(f"{path} is not a pactl run's config (no 'format: {RUN_FORMAT}' entry)")
    version, dataset = info.get("version"), info.get("dataset")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise PactlError(f"{path}: version must be a positive integer (got {version!r:.40})")
    if version > RUN_VERSION:
        raise PactlError(f"{path} was written by a newer pactl (version {version}); upgrade")
    if not isinstance(dataset, str) or not dataset or "\0" in dataset:
        raise PactlError(f"{path}: dataset must be a dataset name, folder or CSV")
    model_cfg = read_config(ModelConfig, info.get("model_config"), f"{path}: model_config")
    check_model_config(model_cfg, name=lambda field: f"{path}: model_config.{field}")
    cfg = read_config(TrainConfig, info.get("train_config"), f"{path}: train_config")
    if cfg.loss not in LOSSES:
        raise PactlError(
            f"{path}: train_config.loss must be one of {', '.join(sorted(LOSSES))} "
            f"(got {cfg.loss!r:.40})"
        )
    return dataset, model_cfg, cfg
