"""Epoch 0 shared between runs whose networks start alike (the points of a sweep).

The epoch-0 row measures the network before its first step. It depends on that network's state
(the weights, the seed, and for random weights the BatchNorm statistics calibrated on training
batches), on the images it reads (the train split for that calibration, the validation and test
splits it is measured on), on how they are read (the model config's image settings, the device,
--amp, --channels-last) and on the evaluation's own settings (eval_ks, the seed of NMI's
clustering). It does not depend on what only training reads: the loss and its settings, the
optimiser, the schedule, augmentation, sampling.

A run given a cache folder (`pactl sweep` gives its own cache/epoch0) looks its row up under a
key of all that, and stores the row it computed. The key is a sha256 of a description holding
the state's fingerprint, the splits' fingerprints, the versions, the device, the whole model
config and every train setting except the TRAINING_ONLY names: a setting added to TrainConfig is
in the key until someone shows that epoch 0 does not read it.

Files are written atomically (temp + rename) and read leniently: a missing, half-written or
foreign file is a miss, and the row is computed again. Processes that compute the same key at
once write the same row, and the last rename wins; a row that cannot be written is only a saving
lost.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pactl import __version__
from pactl.config import ModelConfig, TrainConfig, to_dict
from pactl.errors import PactlError
from pactl.fsutil import atomic_write_text
from pactl.records import read_json_object

FORMAT = "pactl.epoch0"
VERSION = 1

# Settings epoch 0 does not read. batch_size and freeze_bn act through the BatchNorm calibration
# only, and so through the state's fingerprint; compile wraps the network that trains, while
# epoch 0 evaluates the bare one; workers change how fast images decode, not what they decode to.
TRAINING_ONLY = frozenset(
    {
        "epochs", "batch_size", "lr", "weight_decay", "proxy_lr_mult", "alpha", "delta", "loss",
        "warmup_epochs", "lr_decay_step", "lr_decay_gamma", "freeze_bn", "grad_clip", "augment",
        "sampler", "m_per_class", "eval_every", "selection", "precision", "workers", "compile",
        "tensorboard", "time_budget",
    }
)  # fmt: skip


@dataclass(frozen=True)
class StartKey:
    digest: str  # sha256 of `described`: the file's name
    described: dict[str, Any]  # everything the row depends on, also stored in the file


@dataclass(frozen=True)
class SharedRow:
    row: dict[str, float]  # the metrics and the seconds epoch 0 took where it was computed
    run: str  # the run folder's name that computed it


def start_key(
    state: str, splits: dict[str, str], model_cfg: ModelConfig, cfg: TrainConfig, device: str
) -> StartKey:
    """The key of a run's epoch 0: `state`, the fingerprint of the network as it is measured;
    `splits`, each split's data fingerprint; `device`, the device's kind and name."""
    described = {
        "pactl": __version__,
        "torch": _torch_version(),
        "device": device,
        "state": state,
        "splits": splits,
        "model_config": to_dict(model_cfg),
        "train_config": {k: v for k, v in to_dict(cfg).items() if k not in TRAINING_ONLY},
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return StartKey(hashlib.sha256(text.encode()).hexdigest(), json.loads(text))


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def read_row(folder: Path, key: StartKey) -> SharedRow | None:
    """The row stored under `key`, or None: no file, a half-written or foreign one, or one whose
    description is not the key's (a file is trusted only for what it says it measured)."""
    path = folder / f"{key.digest}.json"
    if not path.is_file():
        return None
    try:
        record = read_json_object(path, path, "a pactl epoch-0 row")
    except PactlError:
        return None
    row, run = record.get("row"), record.get("run")
    if (
        record.get("format") != FORMAT
        or record.get("version") != VERSION
        or record.get("described") != key.described
        or not isinstance(run, str)
        or not isinstance(row, dict)
        or not all(isinstance(v, float) for v in row.values())
        or not math.isfinite(row.get("seconds", math.nan))
    ):
        return None
    return SharedRow(row, run)


def write_row(folder: Path, key: StartKey, shared: SharedRow) -> str | None:
    """Store a computed row under `key`; returns why it could not be (None when stored)."""
    record = {
        "format": FORMAT,
        "version": VERSION,
        "described": key.described,
        "run": shared.run,
        "row": shared.row,
    }
    try:
        atomic_write_text(folder / f"{key.digest}.json", json.dumps(record, indent=1) + "\n")
    except (OSError, PactlError) as e:
        return str(e)
    return None
