"""What each epoch leaves behind: its metrics.csv row, best.pt when it is the best so far,
checkpoint.pt (the full training state, for --resume), config.json and provenance.json,
TensorBoard scalars, and the warnings a row calls for.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import torch

from pactl import checkpoint as ckpt
from pactl.config import to_dict
from pactl.console import Reporter
from pactl.datasets import Manifest
from pactl.errors import PactlError
from pactl.runs import append_metrics, run_config, selection_score, writing_in
from pactl.store.generations import atomic_write_text
from pactl.training.noise import noise_record
from pactl.training.trainer import Best, RunFolder, Trainer


def write_provenance(
    t: Trainer, run_dir: Path, info: dict[str, Any], manifest: Manifest, resume: bool
) -> None:
    """provenance.json (pactl.training.provenance): written when the run starts; a resume keeps it
    and adds its own command line, versions and devices under `resumes`."""
    from pactl.training import provenance

    path = run_dir / "provenance.json"
    here = provenance.collect(
        configs={k: info[k] for k in ("dataset", "manifest", "model_config", "train_config")},
        seed=t.cfg.seed,
        device=t.device,
        start_weights=ckpt.fingerprint(ckpt.clean_state_dict(t.net)),
        weights=t.model_cfg.weights,
        manifest=manifest,
        world_size=t.world.size,
    )
    noise = noise_record(run_dir)
    if noise is not None:  # the labels trained on are not the data's: say which changed
        here["label_noise"] = {"setting": t.cfg.label_noise, **noise}
    if resume and path.is_file():
        try:
            first = json.loads(path.read_bytes())
        except ValueError:
            first = None
        if isinstance(first, dict) and first.get("format") == provenance.FORMAT:
            keys = ("command", "packages", "cuda", "driver", "devices", "config")
            first.setdefault("resumes", []).append({k: here[k] for k in keys})
            here = first
    atomic_write_text(path, json.dumps(here, indent=2) + "\n")


def save_state(t: Trainer, run: RunFolder, epoch: int) -> None:
    """checkpoint.pt: the full training state after `epoch` finished epochs."""
    weights = ckpt.clean_state_dict(t.model)
    payload = ckpt.export_payload(weights, t.model_cfg, run.classes, epoch, t.state.last)
    payload.update(
        kind="full",
        proxies={k: v.detach().cpu() for k, v in t.criterion.state_dict().items()},
        train_config=to_dict(t.cfg),
        optimizer=t.optimizer.state_dict(),
        scheduler=t.scheduler.state_dict(),
        scaler=t.scaler.state_dict(),
        rng={"torch": torch.get_rng_state()},
        best=dataclasses.asdict(t.state.best),
        start=t.state.start,
    )
    ckpt.save(run.path / "checkpoint.pt", payload)


def restore_state(t: Trainer, run_dir: Path) -> int:
    """The training state of run_dir/checkpoint.pt, loaded into `t` (t.state included); returns
    the epochs it finished. A part that does not fit this run's network, loss or optimiser is
    one line naming the file and the part."""
    path = run_dir / "checkpoint.pt"
    payload = ckpt.load(path)
    if payload["kind"] != "full":
        raise PactlError(f"{path} is an export, not a training state")
    parts: dict[str, Any] = {
        "model": t.net,
        "proxies": t.criterion,
        "optimizer": t.optimizer,
        "scheduler": t.scheduler,
        "scaler": t.scaler,
    }
    for key, owner in parts.items():
        try:
            owner.load_state_dict(payload[key])
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
            reason = " ".join(str(e).split())[:120]
            raise PactlError(f"{path}: {key} does not fit this run ({reason})") from None
    check_optimizer_state(t.optimizer, path)
    try:
        torch.set_rng_state(payload["rng"]["torch"])
    except RuntimeError:
        raise PactlError(f"{path}: rng is not a state of torch's generator") from None
    t.state.best = Best.from_dict(payload["best"])
    t.state.last, t.state.start = dict(payload["metrics"]), dict(payload.get("start", {}))
    return int(payload["epoch"])


def check_optimizer_state(optimizer: torch.optim.Optimizer, path: Path) -> None:
    """What load_state_dict takes on trust: per-parameter moments of the parameter's shape, and
    finite settings (a NaN learning rate would read as a diverging loss)."""
    for group in optimizer.param_groups:
        for key, value in group.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise PactlError(f"{path}: optimizer {key} is {value}")
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != param.shape:
                raise PactlError(
                    f"{path}: optimizer {key} has shape {tuple(value.shape)} for a parameter "
                    f"of shape {tuple(param.shape)}"
                )


def write_run_files(t: Trainer, run: RunFolder) -> None:
    """config.json (what the run is doing now: --epochs on resume, a time budget's plan) and
    provenance.json; by the first process only."""
    if not t.world.is_main:
        return
    info = run_config(run.source, run.manifest, t.model_cfg, t.cfg, run.classes)
    with writing_in(run.path):
        atomic_write_text(run.path / "config.json", json.dumps(info, indent=2) + "\n")
        write_provenance(t, run.path, info, run.manifest, run.resume)


def record_epoch(t: Trainer, run: RunFolder, row: dict[str, Any], reporter: Reporter) -> bool:
    """metrics.csv row, best.pt when the selection metric improved, then checkpoint.pt (last:
    it commits; not for epoch 0, which resumes by starting again); the row's numbers become
    t.state's last (and epoch 0's its start). Returns whether this epoch is best.pt's now."""
    epoch = row["epoch"]
    t.state.last = {k: v for k, v in row.items() if isinstance(v, float)}
    if epoch == 0:
        t.state.start = t.state.last
    with writing_in(run.path):
        append_metrics(run.path / "metrics.csv", run.columns, row)
    shown = ", ".join(
        f"{k} {row[k]:.3g}" if k == "lr" else f"{k} {row[k]:.4f}"  # lr 0.00015, not 0.0001
        for k in run.columns[1:]
        if isinstance(row.get(k), float)
    )
    reporter.log(f"epoch {epoch}/{t.cfg.epochs}: {shown}")
    if t.writer is not None:
        log_scalars(t.writer, row)
    for warning in health_warnings(row, t.state.start):
        reporter.warn(f"epoch {epoch}: {warning}")
    score = selection_score(row, t.cfg.selection)
    best = t.state.best
    better = False
    with writing_in(run.path):
        # A tie goes to the later epoch: no worse by validation, and trained longer.
        if score is not None and score >= (best.score, best.then):
            better = True
            t.state.best = Best(epoch, t.state.last, *score)
            weights = ckpt.clean_state_dict(t.model)
            ckpt.save(
                run.path / "best.pt",
                ckpt.export_payload(weights, t.model_cfg, run.classes, epoch, t.state.last),
            )
        if epoch > 0:
            save_state(t, run, epoch)
    return better


def log_scalars(writer: Any, row: dict[str, Any]) -> None:
    """One epoch's numbers at step = epoch: train/loss, train/lr, test/<metric>, val/<metric>
    (the epoch's seconds as time/seconds)."""
    for key, value in row.items():
        if key == "epoch" or not isinstance(value, float) or not math.isfinite(value):
            continue
        group = (
            "train" if key in ("loss", "lr", "noise_rate") else "time" if key == "seconds" else
            "val" if key.startswith("val_") else "test"
        )  # fmt: skip
        writer.add_scalar(f"{group}/{key.removeprefix('val_')}", value, int(row["epoch"]))
    writer.flush()


# A Recall@1 below this share of the epoch-0 value, or a mean pairwise cosine above this, is
# reported: training has made the embedding worse than its start, or mapped all images together.
RECALL_DROP = 0.5


COLLAPSED_COSINE = 0.9


def health_warnings(row: dict[str, Any], start: dict[str, Any]) -> list[str]:
    """What went wrong by this epoch, against epoch 0: Recall@1 far below the start, or
    embeddings that all point the same way (and no less so than at the start: a random network
    starts near 1, and only training that does not spread them out, nor improve MAP@R, is a
    collapse)."""
    if row["epoch"] == 0:
        return []
    warnings = []
    for key in ("val_recall@1", "recall@1"):
        now, then = row.get(key), start.get(key)
        if now is not None and then and now < RECALL_DROP * then:
            warnings.append(
                f"{key} fell to {now:.4f} from {then:.4f} before training: lower --lr, or "
                "check --freeze-bn and --weights"
            )
            break
    cosine, before = row.get("mean_cos"), start.get("mean_cos")
    # Retrieval getting better is no collapse, however close together the vectors lie.
    better = any(
        row.get(k) is not None and start.get(k) is not None and row[k] > start[k]
        for k in ("val_map@r", "map@r")
    )
    if (
        cosine is not None
        and cosine > COLLAPSED_COSINE
        and cosine >= (before or 0.0)
        and not better
    ):
        warnings.append(
            f"the embeddings have collapsed (mean pairwise cosine {cosine:.3f}): "
            "every image maps to nearly the same point"
        )
    return warnings
