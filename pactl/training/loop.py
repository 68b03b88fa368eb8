"""fit(): epochs of Proxy-Anchor training with warm-up, AMP, DDP, evaluation and checkpoints."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from pactl import __version__
from pactl import checkpoint as ckpt
from pactl.config import ModelConfig, TrainConfig, read_config, to_dict, weights_words
from pactl.console import QUIET, Reporter, counted
from pactl.datasets import Manifest
from pactl.distributed import World, agree, barrier, gather_batch, init_world, share_sizes
from pactl.embed import embed_files
from pactl.errors import PactlError
from pactl.fsutil import atomic_write_text, make_folder
from pactl.loaders import loader_for
from pactl.model import EmbeddingNet, build_model, freeze_batchnorm
from pactl.output import csv_text
from pactl.report import selection_score
from pactl.runtime import autocast, resolve_device

if TYPE_CHECKING:
    from pactl.calibrate import Calibration

RUN_FORMAT = "pactl.run"
RUN_VERSION = 1


@dataclass
class TrainResult:
    run_dir: Path
    best_epoch: int
    best_metrics: dict[str, float]
    last_metrics: dict[str, float]
    selection: str  # val | test | last: what chose best_epoch


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
    writer: Any = None  # a TensorBoard SummaryWriter with --tensorboard (first process only)
    # The calibration split's (vectors, labels) from the latest evaluation, and from best.pt's:
    # its same-item calibration reads them instead of embedding the split once more.
    evaluated: tuple[np.ndarray, np.ndarray] | None = None
    best_vectors: tuple[np.ndarray, np.ndarray] | None = None


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
    the folder; a full disk already is one (pactl.fsutil), and the previous file is kept."""
    try:
        yield
    except OSError as e:
        raise PactlError(f"cannot write in the run folder {run_dir} ({e.strerror or e})") from None


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
    scheduler = make_scheduler(optimizer, cfg)
    model: nn.Module = net
    if world.enabled and cfg.sync_bn:
        # Each GPU sees its share of the batch: BatchNorm that trains should see all of it.
        net.backbone = nn.SyncBatchNorm.convert_sync_batchnorm(net.backbone)
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


def make_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig
) -> torch.optim.lr_scheduler.LRScheduler:
    """Step decay, stepped once an epoch (describe_schedule says it in words)."""
    return torch.optim.lr_scheduler.StepLR(
        optimizer, step_size=max(cfg.lr_decay_step, 1), gamma=cfg.lr_decay_gamma
    )


def on_device(t: Trainer, images: torch.Tensor) -> torch.Tensor:
    """A batch of images on the training device, in the memory layout the network runs in."""
    images = images.to(t.device, non_blocking=True)
    if t.cfg.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images


def train_step(t: Trainer, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One optimiser step on a batch already on the device; returns the (detached) loss."""
    images = on_device(t, images)
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
        crop_scale=cfg.crop_scale,
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
    keep: list[tuple[np.ndarray, np.ndarray]] | None = None,
) -> dict[str, float]:
    """Recall@K, MAP@R, R-precision (and NMI) on the test split, or query vs gallery.

    `prepare` as in embed_files; training passes False: a network that changes every epoch
    would be traced and frozen anew each time, which small networks do not pay back. `keep`
    (a list) receives the (vectors, labels) scored, where there is no gallery.
    """
    from pactl import metrics

    def vectors(split: str) -> tuple[np.ndarray, np.ndarray]:
        part = manifest.select(split)
        return split_vectors(net, part, split, model_cfg, cfg, device, reporter, prepare)

    if manifest.eval_splits() == ("query", "gallery"):
        q, ql = vectors("query")
        g, gl = vectors("gallery")
        scores = metrics.evaluate(q, ql, cfg.eval_ks, g, gl, with_nmi=with_nmi, seed=cfg.seed)
        return {**scores, "mean_cos": mean_pairwise_cosine(g)}
    split = "val" if manifest.has_split("val") else "test"
    v, vl = vectors(split)
    if keep is not None:
        keep.append((v, vl))
    scores = metrics.evaluate(v, vl, cfg.eval_ks, with_nmi=with_nmi, seed=cfg.seed)
    return {**scores, "mean_cos": mean_pairwise_cosine(v)}


def split_vectors(
    net: nn.Module,
    part: Manifest,
    split: str,
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    device: torch.device,
    reporter: Reporter,
    prepare: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The vectors of a split's readable images and their labels."""
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
        draft=False,
    )
    if done.failed:
        reporter.log(f"evaluation skipped {len(done.failed)} unreadable {split} images")
    return done.vectors, part.labels[done.rows]


def calibrate_checkpoint(
    path: Path,
    part: Manifest,
    split: str,
    cfg: TrainConfig,
    device: torch.device,
    reporter: Reporter,
    embedded: tuple[np.ndarray, np.ndarray] | None = None,
) -> Calibration:
    """The same-item threshold of the checkpoint's network at cfg.precision, measured on the
    pairs of `part` (held-out classes), stored in the checkpoint, its precision-recall curve
    drawn beside it (calibration.png). `embedded`: the (vectors, labels) of `part` by that
    network, where they are at hand (training's evaluation of the best epoch)."""
    from pactl.calibrate import CalibrationConfig, calibrate, describe
    from pactl.report import plot_calibration

    if embedded is None:
        model, model_cfg, _ = ckpt.load_model(path)
        model.to(device)
        embedded = split_vectors(model, part, split, model_cfg, cfg, device, reporter)
    vectors, labels = embedded
    config = CalibrationConfig(precision=cfg.precision, seed=cfg.seed)
    calibration = calibrate(vectors, labels, config, split)
    ckpt.store_calibration(path, calibration.to_dict())
    plot_calibration(calibration, path.parent / "calibration.png")
    reporter.log(f"{path.name}: {describe(calibration)}")
    return calibration


def calibrate_run(t: Trainer, splits: Splits, run_dir: Path, reporter: Reporter) -> None:
    """best.pt's same-item threshold on the validation classes, else the test classes; a set
    that cannot be calibrated (one image per class) is a warning, not a failed run."""
    part, split = (splits.val, "val") if len(splits.val) else (splits.test, "test")
    try:
        with writing_in(run_dir):
            calibrate_checkpoint(
                run_dir / "best.pt", part, split, t.cfg, t.device, reporter, t.best_vectors
            )
    except PactlError as e:
        reporter.warn(f"best.pt has no same-item calibration: {e}")


def mean_pairwise_cosine(vectors: np.ndarray) -> float:
    """Mean cosine over all pairs i != j of unit rows, in O(N D): (|sum v|^2 - N) / (N (N - 1)).
    Near 1 means every image maps to about the same point (a collapsed embedding)."""
    n = len(vectors)
    if n < 2:
        return float("nan")
    total = np.asarray(vectors, dtype=np.float64).sum(axis=0)
    return float((total @ total - n) / (n * (n - 1)))


@dataclass
class Splits:
    train: Manifest
    val: Manifest  # validation classes (may be empty): they choose best.pt
    test: Manifest  # test, or query + gallery


SKIPPED_FILE = "skipped.csv"  # the images of a run's manifest whose headers cannot be read


def readable_rows(
    manifest: Manifest, run_dir: Path, reporter: Reporter, main: bool, shared: Path | None = None
) -> Manifest:
    """The manifest less the images whose header cannot be read (checked all at once before
    training, not met one by one when drawn), which are reported once: one warning, and
    run_dir/skipped.csv (path, reason) written by the main process. With `shared` (a sweep's
    cache folder), a check of the same files, unchanged since, is read from there."""
    from pactl.output import write_rows

    bad = unreadable_files(manifest.files(), reporter if main else QUIET, shared)
    if not bad:
        return manifest
    if main:
        with writing_in(run_dir):
            write_rows(run_dir / SKIPPED_FILE, ("path", "reason"), bad)
        path, reason = bad[0]
        reporter.warn(
            f"{counted(len(bad), 'unreadable image')} left out of training and evaluation "
            f"({path}: {reason}); all listed in {run_dir / SKIPPED_FILE}"
        )
    gone = {path for path, _ in bad}
    keep = [i for i, f in enumerate(manifest.files()) if str(f) not in gone]
    return dataclasses.replace(manifest.subset(keep), duplicates=manifest.duplicates)


def unreadable_files(
    files: list[Path], reporter: Reporter, shared: Path | None
) -> list[tuple[str, str]]:
    """images.unreadable_images, or its result for the same files stored under `shared`."""
    from pactl import start_cache
    from pactl.images import unreadable_images

    if shared is None:
        return unreadable_images(files, reporter)
    folder, key = shared / start_cache.HEADERS, start_cache.headers_key(files)
    found = start_cache.read_unreadable(folder, key)
    if found is not None:
        reporter.log(f"image headers: checked before for these {len(files):,} files")
        return found
    bad = unreadable_images(files, reporter)
    why = start_cache.write_unreadable(folder, key, bad)
    if why is not None:
        reporter.log(f"header check not shared: {why}")
    return bad


def check_splits(manifest: Manifest, cfg: TrainConfig, unreadable: int = 0) -> Splits:
    """Train, validation and test parts; without a `val` split in the manifest, a share
    (cfg.val_classes) of the train classes is held out as validation classes. `unreadable`:
    images already left out, named when too few are left for a batch."""
    train = manifest.select("train")
    val = manifest.select("val")
    if not len(val) and cfg.val_classes > 0:
        train, val = hold_out_classes(train, cfg.val_classes, cfg.seed)
    evaluation = manifest.select(*manifest.eval_splits())
    if len(np.unique(train.labels)) < 2:
        raise PactlError(f"{manifest.source}: the train split needs at least 2 classes")
    if len(evaluation) == 0:
        raise PactlError(f"{manifest.source}: the test split is empty")
    if cfg.batch_size > len(train):
        left = f", {unreadable:,} unreadable images left out" if unreadable else ""
        raise PactlError(
            f"--batch-size {cfg.batch_size} is larger than the train split "
            f"({counted(len(train), 'readable image' if unreadable else 'image')}{left}): "
            "give a smaller --batch-size"
        )
    return Splits(train, val, evaluation)


def class_names(part: Manifest, codes: np.ndarray) -> list[str]:
    """The names of the classes `codes` as the data gives them (a folder's name, the CSV's
    class_name or label), in the proxies' order: config.json and best.pt record these, never
    pactl's own 0..C-1 numbering, which a reader would take for the CSV's labels."""
    name = dict(zip(part.labels.tolist(), part.class_names, strict=True))
    return [name[c] for c in codes.tolist()]


def hold_out_classes(train: Manifest, share: float, seed: int) -> tuple[Manifest, Manifest]:
    """(train, val): round(share x classes) train classes, drawn with `seed`, become val.

    At least 2 classes on each side, or nothing is held out (val empty): Recall on one class
    is always 1, and the loss needs 2 classes to learn from.
    """
    classes = np.unique(train.labels)
    count = max(2, round(share * len(classes)))
    if len(classes) - count < 2:
        return train, train.subset([])
    rng = np.random.default_rng(seed)
    held = set(rng.choice(classes, size=count, replace=False).tolist())
    is_val = np.array([int(label) in held for label in train.labels])
    val = train.subset(np.flatnonzero(is_val).tolist())
    val = dataclasses.replace(val, splits=("val",) * len(val))
    return train.subset(np.flatnonzero(~is_val).tolist()), val


def metric_columns(cfg: TrainConfig, with_val: bool) -> list[str]:
    """Test metrics under their own names, validation ones prefixed with val_."""
    recalls = [f"recall@{k}" for k in cfg.eval_ks]
    val = [f"val_{c}" for c in (*recalls, "map@r")] if with_val else []
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


def write_provenance(
    t: Trainer, run_dir: Path, info: dict[str, Any], manifest: Manifest, resume: bool
) -> None:
    """provenance.json (pactl.provenance): written when the run starts; a resume keeps it and
    adds its own command line, versions and devices under `resumes`."""
    from pactl import provenance

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
        start=state["start"],
    )
    ckpt.save(run_dir / "checkpoint.pt", payload)


def restore_state(t: Trainer, run_dir: Path) -> tuple[int, dict[str, Any]]:
    """The training state of run_dir/checkpoint.pt, loaded into `t`; a part that does not fit
    this run's network, loss or optimiser is one line naming the file and the part."""
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
    state = {"best": payload["best"], "last": payload["metrics"], "start": payload.get("start", {})}
    return int(payload["epoch"]), state


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
    calibration and header check (pactl.start_cache)."""
    began = time.perf_counter()
    world = init_world(cfg.device)
    if cfg.batch_size % world.size:
        raise PactlError(
            f"--batch-size {cfg.batch_size} is not divisible by {world.size} processes"
        )
    cfg = resolve_train_config(model_cfg, cfg, world)
    readable = readable_rows(manifest, run_dir, reporter, world.is_main, shared_start)
    splits = check_splits(readable, cfg, len(manifest) - len(readable))
    manifest = readable
    if cfg.selection == "val" and not len(splits.val):
        why = "--val-classes 0" if not cfg.val_classes else "too few train classes to hold out"
        reporter.log(f"no validation classes ({why}): best.pt is the last epoch")
        cfg = dataclasses.replace(cfg, selection="last")
    reporter.log(f"training on {manifest.source} -> {run_dir}")
    reporter.log(describe_recipe(model_cfg, cfg, splits))
    classes_present = np.unique(splits.train.labels)
    labels = np.searchsorted(classes_present, splits.train.labels)  # 0..C-1 for the proxies
    classes = class_names(splits.train, classes_present)
    t = build_trainer(model_cfg, cfg, len(classes_present), world)
    if cfg.tensorboard and world.is_main:
        t.writer = tensorboard_writer(run_dir)
    state: dict[str, Any] = {"best": {"epoch": -1, "metrics": {}}, "last": {}, "start": {}}
    start, reserve = 0, 0.0
    columns = metric_columns(cfg, with_val=len(splits.val) > 0)
    if resume:
        start, state = restore_state(t, run_dir)
        truncate_metrics(run_dir / "metrics.csv", start)
        reporter.log(f"resuming {run_dir} after epoch {start}")
    write_run_files(t, run_dir, source, manifest, classes, resume)
    recipe = t.cfg  # a time budget's plans scale its schedule
    if not resume:
        reserve, estimate = evaluate_start(
            t, splits, run_dir, columns, classes, state, reporter, shared_start
        )
        if cfg.time_budget:
            fit_to_budget(t, time.perf_counter() - began, reserve, estimate, reporter)
            write_run_files(t, run_dir, source, manifest, classes, resume)
    epoch = start
    while epoch < t.cfg.epochs:  # a budget's second plan may change t.cfg.epochs
        seconds = train_epoch(t, splits, labels, epoch, run_dir, columns, classes, state, reporter)
        elapsed = time.perf_counter() - began
        if not resume and t.cfg.time_budget and epoch == t.cfg.warmup_epochs:
            refit_to_budget(t, recipe, elapsed, epoch + 1, seconds, reserve, reporter)
            write_run_files(t, run_dir, source, manifest, classes, resume)
        if not resume and over_budget(t, elapsed, seconds, reserve, epoch, reporter):
            t.cfg = dataclasses.replace(t.cfg, epochs=epoch + 1)
            write_run_files(t, run_dir, source, manifest, classes, resume)
            break
        epoch += 1
    if world.is_main:
        finish_run(t, splits, run_dir, reporter)
    best = state["best"]
    return TrainResult(
        run_dir, int(best["epoch"]), dict(best["metrics"]), dict(state["last"]), t.cfg.selection
    )


def train_epoch(
    t: Trainer,
    splits: Splits,
    labels: np.ndarray,
    epoch: int,
    run_dir: Path,
    columns: list[str],
    classes: list[str],
    state: dict[str, Any],
    reporter: Reporter,
) -> float:
    """One epoch: its steps, its evaluation (on schedule), its row, best.pt and checkpoint.pt.
    Returns its seconds."""
    cfg = t.cfg
    began = time.perf_counter()
    lr = t.optimizer.param_groups[0]["lr"]
    loss = train_one_epoch(t, train_loader(splits.train, labels, t, epoch), epoch, reporter)
    row: dict[str, Any] = {"epoch": epoch + 1, "loss": loss, "lr": lr}
    last = epoch + 1 == cfg.epochs
    t.evaluated = None  # an epoch left unevaluated (--eval-every) has no vectors of its own
    if t.world.is_main and ((epoch + 1) % cfg.eval_every == 0 or last):
        nmi = last or len(np.unique(splits.test.labels)) <= 1000
        row.update(evaluate_epoch(t, splits, reporter, nmi))
    row["seconds"] = time.perf_counter() - began
    if t.world.is_main:
        state["last"] = {k: v for k, v in row.items() if isinstance(v, float)}
        record_epoch(t, run_dir, row, columns, classes, state, reporter)
    barrier(t.world)
    return float(row["seconds"])


def write_run_files(
    t: Trainer, run_dir: Path, source: str, manifest: Manifest, classes: list[str], resume: bool
) -> None:
    """config.json (what the run is doing now: --epochs on resume, a time budget's plan) and
    provenance.json; by the first process only."""
    if not t.world.is_main:
        return
    info = run_config(source, manifest, t.model_cfg, t.cfg, classes)
    with writing_in(run_dir):
        atomic_write_text(run_dir / "config.json", json.dumps(info, indent=2) + "\n")
        write_provenance(t, run_dir, info, manifest, resume)


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
    t.cfg = dataclasses.replace(
        cfg,
        epochs=chosen.epochs,
        lr_decay_step=chosen.lr_decay_step,
        warmup_epochs=chosen.warmup_epochs,
    )
    t.scheduler = make_scheduler(t.optimizer, t.cfg)
    reporter.log(
        f"time budget {_duration(cfg.time_budget)}: {_duration(elapsed)} spent, about "
        f"{_duration(per_epoch)} per epoch: {counted(chosen.epochs, 'epoch')}, "
        + describe_schedule(t.cfg).removeprefix("schedule: ")
    )
    if not chosen.fits:
        reporter.warn(
            f"the time budget ({_duration(cfg.time_budget)}) leaves less than one epoch "
            f"(about {_duration(per_epoch)}) after epoch 0: training one epoch anyway"
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
            t.cfg = dataclasses.replace(before, epochs=done)
            reporter.warn(
                f"stopping after epoch {done} of {before.epochs}: it took {_duration(seconds)}, "
                f"and the {_duration(before.time_budget)} budget has no room for another"
            )
        return
    if (chosen.epochs, chosen.lr_decay_step) == (before.epochs, before.lr_decay_step):
        return
    t.cfg = dataclasses.replace(before, epochs=chosen.epochs, lr_decay_step=chosen.lr_decay_step)
    scheduler = cast(torch.optim.lr_scheduler.StepLR, t.scheduler)
    scheduler.step_size = max(chosen.lr_decay_step, 1)
    factor = t.cfg.lr_decay_gamma ** (done // scheduler.step_size)
    for group, base in zip(t.optimizer.param_groups, scheduler.base_lrs, strict=True):
        group["lr"] = base * factor
    scheduler._last_lr = [group["lr"] for group in t.optimizer.param_groups]
    reporter.log(
        f"time budget {_duration(before.time_budget)}: epoch {done} took {_duration(seconds)}, "
        f"{_duration(elapsed)} spent: {counted(chosen.epochs, 'epoch')} instead of "
        f"{before.epochs}, " + describe_schedule(t.cfg).removeprefix("schedule: ")
    )


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
        f"{_duration(last)}) would end past the {_duration(t.cfg.time_budget)} budget"
    )
    return True


def finish_run(t: Trainer, splits: Splits, run_dir: Path, reporter: Reporter) -> None:
    """After the last epoch: curves.png, the TensorBoard file closed, best.pt calibrated."""
    from pactl.report import plot_curves

    with writing_in(run_dir):
        plot_curves(run_dir / "metrics.csv", run_dir / "curves.png")
    if t.writer is not None:
        t.writer.close()
    calibrate_run(t, splits, run_dir, reporter)


def evaluate_start(
    t: Trainer,
    splits: Splits,
    run_dir: Path,
    columns: list[str],
    classes: list[str],
    state: dict[str, Any],
    reporter: Reporter,
    shared: Path | None = None,
) -> tuple[float, float | None]:
    """Epoch 0: the network before its first step, the start every later epoch is compared
    with (read from `shared` where a run that started alike stored it); then an estimate of an
    epoch's duration. Returns (epoch 0's seconds, the estimate)."""
    if t.model_cfg.weights == "none" and not t.cfg.freeze_bn:
        calibrate_batchnorm(t, splits.train, shared=shared, reporter=reporter)
    row: dict[str, Any] = {"epoch": 0, "seconds": 0.0}
    if t.world.is_main:
        row.update(start_metrics(t, splits, run_dir, reporter, shared))
    estimate = estimate_epoch(t, splits.train, len(classes), row["seconds"])
    if t.world.is_main:
        state["start"] = state["last"] = {k: v for k, v in row.items() if isinstance(v, float)}
        record_epoch(t, run_dir, row, columns, classes, state, reporter)
        about = "?" if estimate is None else _duration(estimate)
        reporter.log(f"about {about} per epoch (a timed step with its decoding, and evaluation)")
        if row.get("val_recall@1") == 1.0 and row.get("val_map@r") == 1.0:
            reporter.warn(
                "the validation classes are all retrieved before training (Recall@1 and MAP@R "
                "1.0): they cannot tell epochs apart, so best.pt follows the last epoch; hold "
                "out more classes with --val-classes"
            )
    barrier(t.world)
    return row["seconds"], estimate


def start_metrics(
    t: Trainer, splits: Splits, run_dir: Path, reporter: Reporter, shared: Path | None
) -> dict[str, float]:
    """Epoch 0's metrics and the seconds they took: evaluated, or (with `shared`) the row a run
    whose network started alike stored there, and stored there when evaluated."""
    from pactl import start_cache
    from pactl.provenance import data_fingerprint

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
        return found.row
    row = timed_evaluation(t, splits, reporter)
    why = start_cache.write_row(shared, key, start_cache.SharedRow(row, run_dir.name))
    if why is not None:
        reporter.log(f"epoch 0 not shared: {why}")
    return row


def timed_evaluation(t: Trainer, splits: Splits, reporter: Reporter) -> dict[str, float]:
    began = time.perf_counter()
    row = evaluate_epoch(t, splits, reporter, nmi=True)
    return {**row, "seconds": time.perf_counter() - began}


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
    from pactl import start_cache
    from pactl.provenance import data_fingerprint

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


def resolve_train_config(model_cfg: ModelConfig, cfg: TrainConfig, world: World) -> TrainConfig:
    """Settings left to pactl (None) made concrete: BatchNorm frozen only for pretrained weights
    (random statistics never become right if they cannot move); SyncBatchNorm across GPUs when
    BatchNorm trains under torchrun."""
    freeze = cfg.freeze_bn if cfg.freeze_bn is not None else model_cfg.weights != "none"
    sync = cfg.sync_bn
    if sync is None:
        sync = world.enabled and not freeze and resolve_device(cfg.device).type == "cuda"
    return dataclasses.replace(cfg, freeze_bn=freeze, sync_bn=sync)


def explain(model_cfg: ModelConfig, cfg: TrainConfig) -> list[str]:
    """Why the resolved settings are what they are (for --print-config)."""
    pretrained = model_cfg.weights != "none"
    return [
        f"BatchNorm {'frozen' if cfg.freeze_bn else 'trains'}: "
        + (
            "pretrained weights keep their statistics (--no-freeze-bn to train them)"
            if cfg.freeze_bn and pretrained
            else "random weights need statistics that move"
            if not cfg.freeze_bn and not pretrained
            else "as asked (--freeze-bn/--no-freeze-bn)"
        ),
        f"best.pt chosen by {_SELECTION[cfg.selection]}"
        + (
            f"; {cfg.val_classes:.0%} of the train classes held out (the data is not read here:"
            " a manifest's own val split is used instead, and with too few train classes to hold"
            " out, best.pt is the last epoch; the run's first lines say which)"
            if cfg.val_classes
            else ""
        ),
        describe_test_resize(model_cfg),
        describe_augment(model_cfg, cfg),
        describe_optimiser(cfg),
        describe_schedule(cfg),
        *describe_budget(cfg),
    ]


def describe_test_resize(model_cfg: ModelConfig) -> str:
    """How test images are sized, and why."""
    if model_cfg.resize_size == model_cfg.image_size:
        scratch = model_cfg.weights == "none"
        why = ": random weights come with no crop of their own" if scratch else ""
        whole = f"test images resized whole to {model_cfg.image_size} px"
        return f"{whole}, {model_cfg.interpolation}{why}"
    return (
        f"test resize {model_cfg.resize_size} px, {model_cfg.interpolation}, centre crop "
        f"{model_cfg.image_size}: what the backbone's weights were evaluated with"
    )


def describe_augment(model_cfg: ModelConfig, cfg: TrainConfig) -> str:
    """What training does to each image (pactl.images.AUGMENTS), in words."""
    side = model_cfg.image_size
    crops = (
        "whole images (cut to an aspect ratio of 3:4 to 4:3)"
        if cfg.crop_scale == 1
        else f"random crops of {cfg.crop_scale:.0%} to all of each image's area"
    )
    words = {
        "rrc_flip": f"{crops} resized to {side} px, mirrored half the time"
        + (" (the paper's)" if cfg.crop_scale == 0.08 else ""),
        "flip": "each image as the test transform gives it, mirrored half the time",
        "light": f"whole images resized to {side} px, shifted, turned and scaled a little "
        "(no mirror)",
        "none": "each image as the test transform gives it, with no random change",
    }
    return f"augmentation {cfg.augment}: {words.get(cfg.augment, cfg.augment)}"


def describe_budget(cfg: TrainConfig) -> list[str]:
    if not cfg.time_budget:
        return []
    return [
        f"time budget {_duration(cfg.time_budget)}: after epoch 0, the epochs are fitted to it "
        "from the measured step and evaluation times, the decay step and warm-up scaled from the "
        "schedule above (its shape, not its length); fitted again after the first epoch that "
        "trains everything, from its measured time; the run stops early if an epoch would "
        "end past it"
    ]


def describe_optimiser(cfg: TrainConfig) -> str:
    """The optimiser as build_trainer makes it (param_groups); a loss without proxies (triplet,
    contrastive, multi-similarity) has no group of its own."""
    from pactl.losses import build_loss

    proxies = any(True for _ in build_loss(cfg.loss, 2, 2, cfg.alpha, cfg.delta).parameters())
    return (
        f"optimiser AdamW: lr {cfg.lr:g} for the backbone and the head"
        + (
            f", {cfg.lr * cfg.proxy_lr_mult:g} for the proxies (x{cfg.proxy_lr_mult:g})"
            if proxies
            else f" ({cfg.loss} has no proxies)"
        )
        + f", weight decay {cfg.weight_decay:g}"
        + (f", gradients clipped at {cfg.grad_clip:g}" if cfg.grad_clip > 0 else "")
    )


def describe_schedule(cfg: TrainConfig, shown: int = 4) -> str:
    """The learning-rate schedule as build_trainer makes it (StepLR, stepped once an epoch),
    with the epochs after which the rate falls within this run."""
    steps = list(range(cfg.lr_decay_step, cfg.epochs, cfg.lr_decay_step))
    warm = (
        f"; the first {counted(cfg.warmup_epochs, 'epoch')} train only the head and the proxies"
        if cfg.warmup_epochs
        else ""
    )
    if not steps:
        return (
            f"schedule: constant lr {cfg.lr:g} for {counted(cfg.epochs, 'epoch')} (step decay "
            f"every {cfg.lr_decay_step} epochs never falls within the run){warm}"
        )
    listed = ", ".join(str(s) for s in steps[:shown]) + (", ..." if len(steps) > shown else "")
    final = cfg.lr * cfg.lr_decay_gamma ** len(steps)
    return (
        f"schedule: step decay, lr x{cfg.lr_decay_gamma:g} every {cfg.lr_decay_step} epochs "
        f"(after epochs {listed}; {cfg.lr:g} -> {final:.3g} by epoch {cfg.epochs}){warm}"
    )


def describe_recipe(model_cfg: ModelConfig, cfg: TrainConfig, splits: Splits) -> str:
    """The resolved recipe in one line."""
    bn = "frozen" if cfg.freeze_bn else "synced" if cfg.sync_bn else "training"
    amp = "" if cfg.amp == "none" else f", amp {cfg.amp}"
    size = f"{model_cfg.image_size} px"
    parts = [
        f"recipe: {model_cfg.backbone} ({weights_words(model_cfg.weights)}) at {size}",
        f"dim {model_cfg.embedding_dim}, {counted(cfg.epochs, 'epoch')} of batch {cfg.batch_size}",
        f"lr {cfg.lr:g} (x{cfg.proxy_lr_mult:g} proxies), BatchNorm {bn}{amp}",
        f"{_count(splits.train)} train, {_count(splits.val)} val, {_count(splits.test)} test",
        f"best.pt chosen by {_SELECTION[cfg.selection]}",
    ]
    return "; ".join(parts)


_SELECTION = {
    "val": "validation Recall@1 (then MAP@R)",
    "test": "test Recall@1 (then MAP@R; the paper's protocol)",
    "last": "the last epoch",
}


def _count(part: Manifest) -> str:
    return f"{len(part)} images / {len(np.unique(part.labels))} classes"


def evaluate_epoch(t: Trainer, splits: Splits, reporter: Reporter, nmi: bool) -> dict[str, float]:
    """Test metrics, and validation ones prefixed with val_; the vectors of the split that
    calibrates best.pt (validation, else test) kept in t.evaluated."""
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    val = len(splits.val) > 0
    scores = evaluate(
        t.net, splits.test, t.model_cfg, t.cfg, t.device, reporter, nmi, False,
        keep=None if val else kept,
    )  # fmt: skip
    if val:
        found = evaluate(
            t.net, splits.val, t.model_cfg, t.cfg, t.device, reporter, False, False, keep=kept
        )
        scores.update({f"val_{k}": v for k, v in found.items() if k != "mean_cos"})
    t.evaluated = kept[0] if kept else None
    return scores


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


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:  # 90 s reads 1.5 min, not 2
        return f"{seconds / 60:.1f}".removesuffix(".0") + " min"
    return f"{seconds / 3600:.1f} h"


def record_epoch(
    t: Trainer,
    run_dir: Path,
    row: dict[str, Any],
    columns: list[str],
    classes: list[str],
    state: dict[str, Any],
    reporter: Reporter,
) -> None:
    """metrics.csv row, best.pt when the selection metric improved, then checkpoint.pt (last:
    it commits; not for epoch 0, which resumes by starting again)."""
    epoch = row["epoch"]
    with writing_in(run_dir):
        append_metrics(run_dir / "metrics.csv", columns, row)
    shown = ", ".join(
        f"{k} {row[k]:.3g}" if k == "lr" else f"{k} {row[k]:.4f}"  # lr 0.00015, not 0.0001
        for k in columns[1:]
        if isinstance(row.get(k), float)
    )
    reporter.log(f"epoch {epoch}/{t.cfg.epochs}: {shown}")
    if t.writer is not None:
        log_scalars(t.writer, row)
    for warning in health_warnings(row, state["start"]):
        reporter.warn(f"epoch {epoch}: {warning}")
    score = selection_score(row, t.cfg.selection)
    best = state["best"]
    with writing_in(run_dir):
        # A tie goes to the later epoch: no worse by validation, and trained longer.
        if score is not None and score >= (best.get("score", -1.0), best.get("then", -1.0)):
            state["best"] = {
                "epoch": epoch,
                "metrics": state["last"],
                "score": score[0],
                "then": score[1],
            }
            t.best_vectors, t.evaluated = t.evaluated, None
            weights = ckpt.clean_state_dict(t.model)
            ckpt.save(
                run_dir / "best.pt",
                ckpt.export_payload(weights, t.model_cfg, classes, epoch, state["last"]),
            )
        if epoch > 0:
            save_state(t, run_dir, epoch, classes, state)


def tensorboard_writer(run_dir: Path) -> Any:
    """A SummaryWriter into run_dir/tensorboard (`tensorboard --logdir runs/`)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise PactlError(
            "--tensorboard needs tensorboard: pip install 'pactl[tensorboard]'"
        ) from None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def log_scalars(writer: Any, row: dict[str, Any]) -> None:
    """One epoch's numbers at step = epoch: train/loss, train/lr, test/<metric>, val/<metric>
    (the epoch's seconds as time/seconds)."""
    for key, value in row.items():
        if key == "epoch" or not isinstance(value, float) or not math.isfinite(value):
            continue
        group = (
            "train" if key in ("loss", "lr") else "time" if key == "seconds" else
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
