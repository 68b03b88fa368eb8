"""What runs that start alike share (the points of a sweep): epoch 0, the BatchNorm calibration
of a random network, and the header check of the images.

A run given a cache folder (`pactl sweep` gives its own cache/) keeps each in a subfolder:
epoch0/ (the rows), batchnorm/ (the calibrated BatchNorm buffers) and headers/ (the images whose
header cannot be read). Each is looked up under a key of everything it depends on.

Epoch 0.

The epoch-0 row measures the network before its first step. It depends on that network's state
(the weights, the seed, and for random weights the BatchNorm statistics calibrated on training
batches), on the images it reads (the train split for that calibration, the validation and test
splits it is measured on), on how they are read (the model config's image settings, the device,
--amp, --channels-last) and on the evaluation's own settings (eval_ks, the seed of NMI's
clustering). It does not depend on what only training reads: the loss and its settings, the
optimiser, the schedule, augmentation, sampling.

A run looks its row up under a key of all that, and stores the row it computed. The key is a
sha256 of a description holding the state's fingerprint, the splits' fingerprints, the
versions, the device, the whole model config and every train setting except the TRAINING_ONLY
names: a setting added to TrainConfig is in the key until someone shows that epoch 0 does not
read it.

The BatchNorm calibration (pactl.training.start.calibrate_batchnorm) reads the random
network's state before it, the first training batches (the train split's fingerprint, the
per-process batch size and the number of batches), the image settings and the device; its
result is the buffers of every BatchNorm layer, which a run that starts from the same state
with the same batches loads instead of calibrating.

The header check reads each file: its key holds each file's absolute path, size in bytes and
modification time (nanoseconds), so an image replaced since is checked again.

Files are written atomically (temp + rename) and read leniently: a missing, half-written or
foreign file is a miss, and the row is computed again. Processes that compute the same key at
once write the same row, and the last rename wins; a row that cannot be written is only a saving
lost.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pactl.config import ModelConfig, TrainConfig, to_dict
from pactl.errors import PactlError
from pactl.store.generations import atomic_write, atomic_write_text
from pactl.store.json_fields import read_json_object
from pactl.version import __version__

if TYPE_CHECKING:
    import torch

FORMAT = "pactl.epoch0"
VERSION = 1
BATCHNORM_FORMAT = "pactl.batchnorm"
HEADERS_FORMAT = "pactl.headers"
EPOCH0, BATCHNORM, HEADERS = "epoch0", "batchnorm", "headers"  # the cache folder's subfolders

# Settings epoch 0 does not read. batch_size and freeze_bn act through the BatchNorm calibration
# only, and so through the state's fingerprint; compile wraps the network that trains, while
# epoch 0 evaluates the bare one; workers change how fast images decode, not what they decode to.
TRAINING_ONLY = frozenset(
    {
        "epochs", "batch_size", "lr", "weight_decay", "proxy_lr_mult", "alpha", "delta", "loss",
        "warmup_epochs", "lr_decay_step", "lr_decay_gamma", "freeze_bn", "grad_clip", "augment",
        "crop_scale", "sampler", "m_per_class", "eval_every", "selection", "precision", "workers",
        "compile", "tensorboard", "time_budget", "label_noise", "drop_noisy",
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
    return _key(described)


def _key(described: dict[str, Any]) -> StartKey:
    text = json.dumps(described, sort_keys=True, default=str)
    return StartKey(hashlib.sha256(text.encode()).hexdigest(), json.loads(text))


def batchnorm_key(
    state: str, train: str, model_cfg: ModelConfig, batch: int, batches: int, device: str
) -> StartKey:
    """The key of a BatchNorm calibration: `state`, the fingerprint of the network before it;
    `train`, the train split's fingerprint; `batch` images per process in each of `batches`."""
    described = {
        "pactl": __version__,
        "torch": _torch_version(),
        "device": device,
        "state": state,
        "train": train,
        "batch": batch,
        "batches": batches,
        "model_config": to_dict(model_cfg),
    }
    return _key(described)


def headers_key(files: Sequence[Path]) -> StartKey:
    """The key of a header check of `files` (in order): each one's absolute path, size and
    modification time; a file that cannot be stat'ed is in the key as such."""
    digest = hashlib.sha256()
    for path in files:
        try:
            st = os.stat(path)
            seen = f"{st.st_size}\0{st.st_mtime_ns}"
        except OSError:
            seen = "missing"
        digest.update(f"{os.path.abspath(path)}\0{seen}\n".encode("utf-8", "surrogateescape"))
    return _key({"pactl": __version__, "files": len(files), "stat": digest.hexdigest()})


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


def read_buffers(folder: Path, key: StartKey) -> dict[str, torch.Tensor] | None:
    """The BatchNorm buffers stored under `key`, or None (no file, or one not of this key)."""
    import torch

    path = folder / f"{key.digest}.pt"
    if not path.is_file():
        return None
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a half-written or foreign file is a miss
        return None
    if not isinstance(record, dict):
        return None
    buffers = record.get("buffers")
    if (
        record.get("format") != BATCHNORM_FORMAT
        or record.get("version") != VERSION
        or record.get("described") != key.described
        or not isinstance(buffers, dict)
        or not all(isinstance(v, torch.Tensor) for v in buffers.values())
    ):
        return None
    return buffers


def write_buffers(folder: Path, key: StartKey, buffers: dict[str, torch.Tensor]) -> str | None:
    """Store calibrated BatchNorm buffers under `key`; returns why not (None when stored)."""
    import torch

    record = {
        "format": BATCHNORM_FORMAT,
        "version": VERSION,
        "described": key.described,
        "buffers": {k: v.detach().cpu().clone() for k, v in buffers.items()},
    }
    try:
        atomic_write(folder / f"{key.digest}.pt", lambda f: torch.save(record, f))
    except (OSError, PactlError) as e:
        return str(e)
    return None


def read_unreadable(folder: Path, key: StartKey) -> list[tuple[str, str]] | None:
    """The (path, reason) list a header check stored under `key`, or None."""
    path = folder / f"{key.digest}.json"
    if not path.is_file():
        return None
    try:
        record = read_json_object(path, path, "a pactl header check")
    except PactlError:
        return None
    bad = record.get("unreadable")
    if (
        record.get("format") != HEADERS_FORMAT
        or record.get("version") != VERSION
        or record.get("described") != key.described
        or not isinstance(bad, list)
        or not all(
            isinstance(b, list) and len(b) == 2 and all(isinstance(x, str) for x in b) for b in bad
        )
    ):
        return None
    return [(b[0], b[1]) for b in bad]


def write_unreadable(folder: Path, key: StartKey, bad: list[tuple[str, str]]) -> str | None:
    """Store a header check's result under `key`; returns why not (None when stored)."""
    record = {
        "format": HEADERS_FORMAT,
        "version": VERSION,
        "described": key.described,
        "unreadable": [list(b) for b in bad],
    }
    try:
        atomic_write_text(folder / f"{key.digest}.json", json.dumps(record) + "\n")
    except (OSError, PactlError) as e:
        return str(e)
    return None
