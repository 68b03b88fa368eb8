"""Images -> L2-normalised float32 vectors, and the vectors folder that `pactl index` reads."""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import shutil
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pactl import __version__, records
from pactl.checkpoint import Network
from pactl.config import COMMIT_EVERY, ModelConfig, read_config, to_dict
from pactl.console import Advance, Reporter
from pactl.errors import PactlError, UsageError
from pactl.fsutil import (
    KeepCurrent,
    allocate,
    atomic_path,
    check_files,
    new_generation,
    read_current,
    record_files,
)
from pactl.paths import NAME_ENCODING, NAME_ERRORS

VECTORS_FORMAT = "pactl.vectors"
VECTORS_VERSION = 1
VECTORS_FILES = ("vectors.npy", "items.csv", "skipped.csv", "meta.json")
# Preparing a frozen CPU network costs a few seconds (resnet50: trace, freeze, first calls) and
# saves about 15 ms per image: worth it from a few hundred images on.
PREPARE_MIN_IMAGES = 256


@dataclass
class Embedded:
    vectors: np.ndarray  # (N_ok, D) float32, unit rows, in input order
    rows: np.ndarray  # (N_ok,) int64 positions in the input list of the embedded images
    failed: list[tuple[int, str]] = field(default_factory=list)  # (position, reason)


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(name: str) -> torch.device:
    """`auto`: CUDA (under torchrun, this process's GPU), else Apple's MPS, else the CPU. A device
    asked for by name that this machine lacks is one line."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("mps") if mps_available() else torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise PactlError(f"device {name!r} asked for, but no CUDA device is available")
    if name == "mps" and not mps_available():
        raise PactlError("device 'mps' asked for, but this machine has no Apple MPS device")
    return torch.device(name)


def autocast(device: torch.device, amp: str) -> Any:
    """bf16/fp16 autocast on the model's forward pass, or nothing for amp='none'."""
    if amp == "none":
        return nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    return torch.autocast(device_type=device.type, dtype=dtype)


def loader_for(
    files: Sequence[Path],
    labels: np.ndarray | None,
    model_config: ModelConfig,
    batch_size: int,
    workers: int,
    device: torch.device,
    train: bool = False,
    augment: str = "none",
    sampler: torch.utils.data.Sampler[int] | None = None,
    generator: torch.Generator | None = None,
    draft: bool = True,
    raw_jpeg: bool = False,
) -> torch.utils.data.DataLoader:
    """`raw_jpeg`: JPEGs come as their bytes in each Batch's `raw`, for a GpuJpegDecoder."""
    from pactl.images import ImageDataset, build_transform, collate

    assert model_config.mean is not None and model_config.std is not None
    resize = model_config.resize_size or model_config.image_size
    transform = build_transform(
        model_config.image_size,
        resize,
        model_config.mean,
        model_config.std,
        train=train,
        augment=augment,
        interpolation=model_config.interpolation or "bilinear",
    )
    # Training and evaluation decode in full (as the official loader does): JPEG draft mode
    # scales in the DCT, which changes pixels; embedding large collections may take the speed.
    target = max(resize, model_config.image_size) if draft and not train else None
    dataset = ImageDataset(files, labels, transform, target_size=target, raw_jpeg=raw_jpeg)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        shuffle=False,
        drop_last=train,
        num_workers=min(workers, os.cpu_count() or 1),
        pin_memory=device.type == "cuda",
        persistent_workers=False,
        collate_fn=collate,
        generator=generator,
    )


def gpu_decoding(device: torch.device, asked: bool) -> bool:
    """JPEGs decode on the GPU (nvJPEG) only when asked for (`--gpu-decode`) on a CUDA device."""
    return asked and device.type == "cuda"


class GpuJpegDecoder:
    """A batch's JPEG bytes -> normalised (k, 3, S, S) float tensors on `device`, decoded in one
    nvJPEG call and resized there, with the test transform's steps (pactl.images._test_steps).
    A file the batched call cannot decode is tried alone, and then by PIL on the CPU
    (`dataset.decoded`), so a failure's reason is PIL's, as without GPU decoding."""

    def __init__(self, dataset: Any, model_config: ModelConfig, device: torch.device) -> None:
        from torchvision.transforms import InterpolationMode

        assert model_config.mean is not None and model_config.std is not None
        self.dataset = dataset
        self.device = device
        self.size = model_config.image_size
        self.resize = model_config.resize_size or model_config.image_size
        self.mode = InterpolationMode(model_config.interpolation or "bilinear")
        self.mean = torch.tensor(model_config.mean, device=device).view(3, 1, 1)
        self.std = torch.tensor(model_config.std, device=device).view(3, 1, 1)

    def __call__(
        self, raw: Sequence[tuple[int, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, str]]]:
        """(images on the device, their dataset indices, (index, reason) of those that failed)."""
        decoded = self._decode([data for _, data in raw])
        images, indices, failed = [], [], []
        for (i, _), image in zip(raw, decoded, strict=True):
            if image is not None:
                images.append(self._transform(image))
            else:  # the PIL path, on the CPU
                sample = self.dataset.decoded(i)
                if sample[0] is None:
                    failed.append((i, sample[3]))
                    continue
                images.append(sample[0].to(self.device))
            indices.append(i)
        size = (0, 3, self.size, self.size)
        stacked = torch.stack(images) if images else torch.empty(size, device=self.device)
        return stacked, torch.tensor(indices, dtype=torch.int64), failed

    def _decode(self, datas: list[torch.Tensor]) -> list[torch.Tensor | None]:
        from torchvision.io import ImageReadMode, decode_jpeg

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torchvision.io's note
            try:
                return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=self.device))
            except Exception:  # one bad file fails the batch: each alone, then PIL for those
                pass
            out: list[torch.Tensor | None] = []
            for data in datas:
                try:
                    out.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device))
                except Exception:
                    out.append(None)
            return out

    def _transform(self, image: torch.Tensor) -> torch.Tensor:
        """(3, H, W) uint8 -> (3, S, S) normalised float, as pactl.images' test transform."""
        from torchvision.transforms import functional as TF

        if self.resize == self.size:
            image = TF.resize(image, [self.size, self.size], self.mode, antialias=True)
        else:
            image = TF.resize(image, [self.resize], self.mode, antialias=True)
            image = TF.center_crop(image, [self.size, self.size])
        return (image.float() / 255.0 - self.mean) / self.std


PREPARED = "_pactl_prepared"  # set on a network inference_model() made: prepared once


def torchscript_available() -> bool:
    """TorchScript's trace, freeze and optimize_for_inference are all there: deprecated since
    torch 2.10 and due to go, so their absence is a case, not an error."""
    jit = getattr(torch, "jit", None)
    names = ("trace", "freeze", "optimize_for_inference")
    return all(callable(getattr(jit, name, None)) for name in names)


def is_prepared(model: nn.Module) -> bool:
    script = getattr(getattr(torch, "jit", None), "ScriptModule", None)
    return bool(getattr(model, PREPARED, False)) or (
        isinstance(script, type) and isinstance(model, script)
    )


def freeze_torchscript(model: nn.Module, example: torch.Tensor) -> nn.Module:
    """A traced, frozen copy: BatchNorm folded into the convolutions, weights pre-packed for
    oneDNN, the graph fused. Raises where TorchScript is gone or cannot follow the network."""
    if not torchscript_available():
        raise RuntimeError("this torch has no TorchScript freezing")
    traced = torch.jit.trace(model, example, check_trace=False)
    return torch.jit.optimize_for_inference(torch.jit.freeze(traced))


def fuse_batchnorm(model: nn.Module, example: torch.Tensor | None = None) -> nn.Module:
    """A copy of an eval-mode network whose Conv -> BatchNorm pairs are one convolution each,
    found in a torch.fx trace; everything else runs eagerly. Raises when fx cannot trace it."""
    from torch.fx.experimental.optimization import fuse

    return fuse(model, inplace=False)


COMPILE_MIN_IMAGES = 5_000  # torch.compile's one-off cost (tens of seconds) pays from here on
COMPILE_CHUNK = 32  # images per compiled call: one shape, so one compilation


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would call ($CXX, g++, c++ or clang++), or None: the Docker
    images and many laptops have none, and compiling without one fails after minutes."""
    names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    return next((found for found in map(shutil.which, filter(None, names)) if found), None)


class Compiled(nn.Module):
    """torch.compile (inductor, with freezing: BatchNorm folded, weights pre-packed, constants
    folded) run on chunks of exactly COMPILE_CHUNK images, the last one padded, so it compiles
    once: a new batch size would cost a second compilation. Eval mode makes every image's
    output its own, so the padding changes nothing."""

    def __init__(self, model: nn.Module, chunk: int = COMPILE_CHUNK) -> None:
        super().__init__()
        self.net = model
        self.compiled = torch.compile(model, dynamic=False)
        self.chunk = chunk

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        from torch._inductor import config as inductor

        outputs = []
        # One mode, layout and kind of input tensor for every call (a loader's batch may be an
        # inference tensor), so the compiled graph's guards always hold: nothing recompiles.
        with torch.inference_mode(False), torch.no_grad(), inductor.patch(freezing=True):
            for start in range(0, len(images), self.chunk):
                part = images[start : start + self.chunk]
                short = self.chunk - len(part)
                padding = [part[:1].expand(short, *part.shape[1:])] if short else []
                part = torch.cat([part, *padding]).contiguous(memory_format=torch.channels_last)
                outputs.append(self.compiled(part)[: self.chunk - short])
        return torch.cat(outputs)


def compile_frozen(model: nn.Module, example: torch.Tensor) -> nn.Module:
    """A Compiled copy, compiled here on `example`. Raises without a C++ compiler or
    torch.compile, or when inductor fails."""
    if cpp_compiler() is None or not callable(getattr(torch, "compile", None)):
        raise RuntimeError("torch.compile needs a C++ compiler on the CPU")
    # Inductor looks for CUDA and says so in a raw log line even on the CPU path: not for users.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    compiled = Compiled(model)
    compiled(example)
    return compiled


# The CPU fast paths, fastest first (bench/bench_embed.py --fastpath; docs/benchmarks.md):
# torch.compile with freezing for large embeds (its compilation costs tens of seconds), then
# TorchScript freezing while torch has it, else BatchNorm folding through torch.fx.
FAST_PATHS = (freeze_torchscript, fuse_batchnorm)


def inference_model(
    model: nn.Module,
    model_config: ModelConfig,
    device: torch.device,
    amp: str = "none",
    channels_last: bool = True,
    freeze: bool = True,
    compile: bool = False,
) -> nn.Module:
    """The network as embedding runs it: eval mode, NHWC convolutions, and (with `freeze`) on
    the CPU in float32 the first of the fast paths that prepares a copy whose outputs agree
    with the network's. With `compile` (an embed of COMPILE_MIN_IMAGES images or more) and a
    C++ compiler, torch.compile with freezing (resnet50 at 224 on 2 x86 cores: 0.6x the CPU
    time per image of TorchScript; see docs/benchmarks.md); then FAST_PATHS: a TorchScript-frozen
    copy (BatchNorm folded, weights pre-packed for oneDNN), or, where TorchScript is gone, a
    copy with BatchNorm folded by torch.fx. A network none can follow runs as it is; so does an
    already prepared one, so callers that embed in chunks prepare once."""
    if is_prepared(model):
        return model
    model.eval()
    if channels_last:  # NHWC convolutions: several times faster, on CPUs as on GPUs
        model.to(memory_format=torch.channels_last)
    if not freeze or device.type != "cpu" or amp != "none":
        return model
    size = model_config.image_size
    generator = torch.Generator().manual_seed(0)
    # Prepared at one batch size, checked at another: a network whose forward depends on the
    # batch (or on the values) in ways a trace cannot record runs eagerly instead.
    example, check = (torch.randn(n, 3, size, size, generator=generator) for n in (2, 3))
    if channels_last:
        example, check = (t.contiguous(memory_format=torch.channels_last) for t in (example, check))
    paths = (compile_frozen, *FAST_PATHS) if compile else FAST_PATHS
    for prepare in paths:
        fast = _checked(prepare, model, example, check)
        if fast is not None:
            setattr(fast, PREPARED, True)
            return fast
    return model


def _checked(
    prepare: Any, model: nn.Module, example: torch.Tensor, check: torch.Tensor
) -> nn.Module | None:
    """prepare(model, example) if it works and agrees with `model` on `check`, else None."""
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's deprecation and trace-shape notes
            fast = prepare(model, example)
            agrees = torch.allclose(fast(check), model(check), atol=1e-4, rtol=1e-3)
    except Exception:  # any failure to prepare: the next path, or the eager network
        return None
    return fast if agrees else None


@torch.inference_mode()
def embed_files(
    model: nn.Module,
    files: Sequence[Path],
    model_config: ModelConfig,
    device: torch.device,
    reporter: Reporter,
    batch_size: int = 128,
    workers: int = 0,
    amp: str = "none",
    channels_last: bool = True,
    out: np.ndarray | None = None,
    prepare: bool | None = None,
    draft: bool = True,
    advance: Advance | None = None,
    gpu_decode: bool = False,
) -> Embedded:
    """Embed `files` in order; unreadable ones are skipped and listed, never fatal.

    `model` may be one inference_model() prepared; `prepare` (default: from PREPARE_MIN_IMAGES
    images on) prepares it here. `out` may be a (len(files), D) float32 array (a memory map, say)
    that receives the vectors of the images that decoded, packed from the top; otherwise one is
    allocated. `draft`: large JPEGs may decode at a reduced scale (not for evaluation).
    `advance`: a caller's progress bar to move instead of one of this call's own.
    `gpu_decode`: on a CUDA device, JPEGs decode on the GPU (GpuJpegDecoder); elsewhere ignored.
    """
    raw = gpu_decoding(device, gpu_decode)
    loader = loader_for(
        files, None, model_config, batch_size, workers, device, draft=draft, raw_jpeg=raw
    )
    decoder = GpuJpegDecoder(loader.dataset, model_config, device) if raw else None
    dim = model_config.dimension or model_config.embedding_dim
    vectors = out if out is not None else np.empty((len(files), dim), dtype=np.float32)
    rows = np.empty(len(files), dtype=np.int64)
    failed: list[tuple[int, str]] = []
    filled = 0
    prepared = is_prepared(model)  # a prepared copy: the caller's network is not touched
    was_training = not prepared and model.training
    freeze = prepare or (prepare is None and len(files) >= PREPARE_MIN_IMAGES)
    many = prepare is None and len(files) >= COMPILE_MIN_IMAGES
    with torch.inference_mode(False):  # tracing needs ordinary tensors
        forward = inference_model(model, model_config, device, amp, channels_last, freeze, many)
    bar = reporter.bar("embedding", total=len(files)) if advance is None else nullcontext(advance)
    with bar as step:
        for batch in loader:
            images, indices, lost = _on_device(batch, device, decoder)
            failed.extend(lost)
            if len(indices):
                n = len(indices)
                vectors[filled : filled + n] = _forward(forward, images, device, amp, channels_last)
                rows[filled : filled + n] = indices.numpy()
                filled += n
            step(len(indices) + len(lost))
    if not prepared:
        model.train(was_training)
    return Embedded(vectors[:filled], rows[:filled], failed)


def decode_files(files: Sequence[Path], model_config: ModelConfig) -> Any:
    """`files` decoded and transformed as embed_files does, on this thread, as one Batch (its
    failures listed with their reasons): a service decodes a request's images on the request's
    own thread and leaves only the forward pass to the network's (embed_decoded)."""
    from pactl.images import collate

    if not files:
        return collate([])
    loader = loader_for(files, None, model_config, len(files), 0, torch.device("cpu"))
    return next(iter(loader))


def embed_decoded(
    model: nn.Module, images: torch.Tensor, model_config: ModelConfig, device: torch.device
) -> np.ndarray:
    """The vectors of images from decode_files, in one forward pass: those embed_files gives
    for the same images in one batch without preparing the network (as `pactl query` embeds a
    few images)."""
    with torch.inference_mode(False):
        forward = inference_model(model, model_config, device, freeze=False)
    with torch.inference_mode():
        return _forward(forward, images.to(device), device, "none", channels_last=True)


def _forward(
    forward: nn.Module, images: torch.Tensor, device: torch.device, amp: str, channels_last: bool
) -> np.ndarray:
    """One batch through the network as embedding runs it: NHWC when asked, under autocast,
    float32 vectors on the CPU."""
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    with autocast(device, amp):
        return np.asarray(forward(images).float().cpu().numpy(), dtype=np.float32)


def _on_device(
    batch: Any, device: torch.device, decoder: GpuJpegDecoder | None
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, str]]]:
    """A batch's images on the device in input order, their indices, and the failures, with
    its JPEG bytes (if any) decoded by `decoder`."""
    images = batch.images.to(device, non_blocking=True)
    if decoder is None or not batch.raw:
        return images, batch.indices, batch.failed
    more, more_indices, lost = decoder(batch.raw)
    if len(batch.indices):
        images = torch.cat([images, more])
        more_indices = torch.cat([batch.indices, more_indices])
    else:
        images = more
    order = torch.argsort(more_indices)
    return images[order.to(device)], more_indices[order], sorted(batch.failed + lost)


ITEMS_COLUMNS = ("id", "path", "label", "size", "mtime_ns")
PROGRESS_PREFIX = ".pactl-progress-"
MAX_SHARDS = 99_999  # shard names have five digits


@dataclass(frozen=True)
class Shard:
    """Slice `index` of `count` equal slices of the input list (`--shard i/n`)."""

    index: int = 0
    count: int = 1

    def bounds(self, n: int) -> tuple[int, int]:
        return n * self.index // self.count, n * (self.index + 1) // self.count

    @property
    def name(self) -> str:  # zero-padded: merge order never depends on how names sort
        return f"{self.index:05d}-of-{self.count:05d}"


def parse_shard(text: str) -> Shard:
    """`i/n` (0-based), or `auto` for this process's rank under torchrun."""
    if text == "auto":
        text = f"{os.environ.get('RANK', '0')}/{os.environ.get('WORLD_SIZE', '1')}"
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard takes i/n or auto, e.g. 0/4 (got {text!r})") from None
    if not 0 <= index < count or count > MAX_SHARDS:
        raise UsageError(f"--shard {text}: need 0 <= i < n <= {MAX_SHARDS:,}")
    return Shard(index, count)


@dataclass
class Previous:
    """What an earlier embed into the same folder, with the same model, already has."""

    vectors: np.ndarray  # memory-mapped
    rows: dict[str, tuple[int, int, int, int]]  # path -> (row, id, size, mtime_ns)

    @property
    def next_id(self) -> int:
        return 1 + max((r[1] for r in self.rows.values()), default=-1)


def read_previous(out_dir: Path, fingerprint: str) -> Previous | None:
    """The folder's earlier vectors when they came from the same model, else None."""

    def read(folder: Path) -> Previous | None:
        vectors, meta = read_vectors_in(folder, out_dir)
        if meta.get("fingerprint") != fingerprint:
            return None
        from pactl.index import ItemTable

        items = ItemTable.read(folder / "items.csv")
        columns = (items.paths, items.ids.tolist(), items.sizes.tolist(), items.mtimes.tolist())
        rows = {path: (row, *rest) for row, (path, *rest) in enumerate(zip(*columns, strict=True))}
        return Previous(vectors, rows)

    try:
        return read_current(out_dir, read)
    except (PactlError, OSError, ValueError, KeyError, TypeError):
        return None  # nothing usable: everything is embedded again


def other_network(out_dir: Path, fingerprint: str) -> str | None:
    """The fingerprint of the network the folder's vectors came from, when another one."""

    def read(folder: Path) -> str | None:
        found = json.loads((folder / "meta.json").read_text(encoding="utf-8")).get("fingerprint")
        return str(found) if found and found != fingerprint else None

    try:
        return read_current(out_dir, read)
    except (PactlError, OSError, ValueError, AttributeError):
        return None


def file_stats(files: Sequence[Path]) -> list[tuple[int, int]]:
    stats = []
    for f in files:
        try:
            st = os.stat(f)
            stats.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append((-1, -1))  # the loader reports why it cannot be read
    return stats


def csv_writer(f: Any) -> Any:
    """Strings quoted, numbers not: a CR or LF inside a name stays inside its field (unquoted,
    a lone CR would end the row for every CSV reader)."""
    return csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)


def write_rows(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    with open(path, "w", newline="", encoding=NAME_ENCODING, errors=NAME_ERRORS) as f:
        writer = csv_writer(f)
        writer.writerow(header)
        writer.writerows(rows)


@dataclass
class Plan:
    """Per input file: its id, and the earlier vector's row to reuse (-1: embed it)."""

    ids: np.ndarray  # (N,) int64
    reuse: np.ndarray  # (N,) int64


def plan(
    files: Sequence[Path], ids: np.ndarray, stats: list[tuple[int, int]], previous: Previous | None
) -> Plan:
    """Unchanged files (same path, size and modification time) keep their vector and id;
    changed ones keep their id and are embedded again; new ones get ids after the largest."""
    ids = ids.copy()
    reuse = np.full(len(files), -1, dtype=np.int64)
    if previous is None:
        return Plan(ids, reuse)
    next_id = previous.next_id
    for i, (f, st) in enumerate(zip(files, stats, strict=True)):
        known = previous.rows.get(os.path.abspath(f))
        if known is None:
            ids[i], next_id = next_id, next_id + 1
            continue
        row, ids[i], size, mtime = known
        if (size, mtime) == st and st != (-1, -1):
            reuse[i] = row
    return Plan(ids, reuse)


def embed_to_folder(
    model: nn.Module,
    network: Network,
    files: Sequence[Path],
    labels: Sequence[str],
    ids: np.ndarray,
    out_dir: Path,
    device: torch.device,
    reporter: Reporter,
    batch_size: int = 128,
    workers: int = 0,
    amp: str = "none",
    scratch: bool = False,
    commit_every: int = COMMIT_EVERY,
    gpu_decode: bool = False,
) -> dict[str, Any]:
    """Write vectors.npy (memory-mapped while filled), items.csv, skipped.csv and meta.json as
    one new generation of `out_dir` (pactl.fsutil): a kill leaves the old output or the new.
    `scratch`: a private folder, without the visible links.

    Run again into the same folder with the same model, only new or changed files are embedded.
    Progress is committed every `commit_every` images (Progress): after a kill, the same command
    goes on from the last commit.
    """
    model_config = network.config
    stats = file_stats(files)
    meta: dict[str, Any] | None = None
    with new_generation(out_dir, VECTORS_FILES, links=not scratch) as gen:
        previous = read_previous(out_dir, network.fingerprint)
        other = other_network(out_dir, network.fingerprint) if previous is None else None
        if other:
            reporter.log(
                f"the vectors in {out_dir} come from another network (fingerprint {other[:12]}):"
                " embedding every image again"
            )
        job = plan(files, ids, stats, previous)
        todo = np.flatnonzero(job.reuse < 0)
        if previous is not None and not len(todo) and len(previous.rows) == len(files):
            raise KeepCurrent
        dim = model_config.dimension or model_config.embedding_dim
        fresh_path = gen / ".fresh.npy"  # the new vectors, removed once assembled
        fresh = _open_npy(fresh_path, (len(todo), dim))
        todo_files = [files[i] for i in todo.tolist()]
        progress = Progress.open(
            out_dir, network.fingerprint, todo_files, stats_of(stats, todo), commit_every
        )
        result = progress.embed(
            model, model_config, device, reporter, batch_size, workers, amp, fresh, commit_every,
            gpu_decode,
        )  # fmt: skip
        embedded = np.full(len(files), -1, dtype=np.int64)
        embedded[todo[result.rows]] = np.arange(len(result.rows))
        keep = np.flatnonzero((job.reuse >= 0) | (embedded >= 0))  # input order
        final = _open_npy(gen / "vectors.npy", (len(keep), dim))
        _assemble(final, keep, job.reuse, embedded, previous, fresh)
        final.flush()
        del final, fresh, previous
        fresh_path.unlink()
        # Absolute paths: results and --exclude-self mean the same from any working directory.
        rows = [
            (int(job.ids[i]), os.path.abspath(files[i]), labels[i], *stats[i])
            for i in keep.tolist()
        ]
        write_rows(gen / "items.csv", ITEMS_COLUMNS, rows)
        skipped = [(str(todo_files[i]), reason) for i, reason in result.failed]
        write_rows(gen / "skipped.csv", ("path", "reason"), skipped)
        meta = {
            "format": VECTORS_FORMAT,
            "version": VECTORS_VERSION,
            "pactl_version": __version__,
            "dimension": dim,
            "count": len(keep),
            "embedded": len(result.rows) - progress.carried,  # by this run
            "reused": int((job.reuse >= 0).sum()),
            "resumed": progress.carried,  # from an earlier run's committed progress
            "skipped": len(skipped),
            "metric": "ip",
            "checkpoint": network.checkpoint,  # None: the backbone of model_config
            "fingerprint": network.fingerprint,
            "model_config": to_dict(model_config),
        }
        meta = record_files(gen, meta)
        (gen / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    Progress.clear(out_dir)  # the output holds it all now (or was up to date)
    if meta is None:
        reporter.log(f"{out_dir} is up to date: nothing new or changed")
        meta = read_current(out_dir, lambda folder: read_vectors_in(folder, out_dir)[1])
        return {**meta, "embedded": 0, "reused": meta["count"], "skipped": 0}
    return meta


def stats_of(stats: list[tuple[int, int]], rows: np.ndarray) -> list[tuple[int, int]]:
    return [stats[i] for i in rows.tolist()]


@dataclass
class Progress:
    """Committed progress of one embed job: a hidden folder `.pactl-progress-<key>/` of the
    output folder, one file per `commit_every` images (their vectors, which decoded, which
    failed and why), each written atomically. The key hashes the model's fingerprint, the chunk
    size and the job's files with their sizes and modification times, so progress is only ever
    reused for the same job cut the same way; any other job's progress is removed when this one
    starts."""

    folder: Path
    files: Sequence[Path]
    carried: int = 0  # images of the job taken from committed chunks (embed sets it)

    @classmethod
    def open(
        cls,
        out_dir: Path,
        fingerprint: str,
        files: Sequence[Path],
        stats: list[tuple[int, int]],
        commit_every: int = COMMIT_EVERY,
    ) -> Progress:
        digest = hashlib.sha256(f"{fingerprint}\0{commit_every}\0".encode())
        for f, (size, mtime) in zip(files, stats, strict=True):
            digest.update(os.fsencode(os.path.abspath(f)) + f"\0{size}\0{mtime}\0".encode())
        folder = out_dir / f"{PROGRESS_PREFIX}{digest.hexdigest()[:16]}"
        for other in out_dir.glob(f"{PROGRESS_PREFIX}*"):
            if other != folder:
                shutil.rmtree(other, ignore_errors=True)
        return cls(folder, files)

    @staticmethod
    def clear(out_dir: Path) -> None:
        for folder in out_dir.glob(f"{PROGRESS_PREFIX}*"):
            shutil.rmtree(folder, ignore_errors=True)

    def embed(
        self,
        model: nn.Module,
        model_config: ModelConfig,
        device: torch.device,
        reporter: Reporter,
        batch_size: int,
        workers: int,
        amp: str,
        out: np.ndarray,
        commit_every: int,
        gpu_decode: bool = False,
    ) -> Embedded:
        """Embed the job's files into `out` (packed from the top, as embed_files does), taking
        committed chunks from disk and committing each new one."""
        n = len(self.files)
        starts = list(range(0, n, commit_every))
        done = self._committed(len(starts))
        if done:
            reporter.log(f"going on from {done * commit_every:,} images embedded before")
        todo = n - done * commit_every
        if todo >= PREPARE_MIN_IMAGES:  # prepared once for every chunk
            many = todo >= COMPILE_MIN_IMAGES
            with torch.inference_mode(False):
                model = inference_model(model, model_config, device, amp, compile=many)
        rows: list[np.ndarray] = []
        failed: list[tuple[int, str]] = []
        filled = 0
        with reporter.bar("embedding", total=n) as advance:
            for k, start in enumerate(starts):
                chunk = list(self.files[start : start + commit_every])
                if k < done:
                    vectors, got, lost = self._read(k)
                    self.carried += len(got)
                    advance(len(chunk))
                else:
                    result = embed_files(
                        model, chunk, model_config, device, reporter, batch_size, workers, amp,
                        prepare=False, advance=advance, gpu_decode=gpu_decode,
                    )  # fmt: skip
                    vectors, got, lost = result.vectors, result.rows, result.failed
                    self._write(k, vectors, got, lost)
                out[filled : filled + len(got)] = vectors
                filled += len(got)
                rows.append(got + start)
                failed += [(int(i) + start, reason) for i, reason in lost]
        return Embedded(out[:filled], np.concatenate(rows or [np.empty(0, np.int64)]), failed)

    def _committed(self, chunks: int) -> int:
        """How many chunks, from the first, are committed."""
        done = 0
        while done < chunks and (self.folder / f"{done:06d}.npz").is_file():
            done += 1
        return done

    def _read(self, k: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]:
        with np.load(self.folder / f"{k:06d}.npz", allow_pickle=False) as z:
            lost = [(int(i), str(r)) for i, r in zip(z["failed"], z["reasons"], strict=True)]
            return z["vectors"], z["rows"], lost

    def _write(
        self, k: int, vectors: np.ndarray, rows: np.ndarray, failed: list[tuple[int, str]]
    ) -> None:
        self.folder.mkdir(exist_ok=True)
        with atomic_path(self.folder / f"{k:06d}.npz") as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                vectors=np.asarray(vectors, dtype=np.float32),
                rows=np.asarray(rows, dtype=np.int64),
                failed=np.array([i for i, _ in failed], dtype=np.int64),
                reasons=np.array([r for _, r in failed], dtype=str),
            )


def _open_npy(path: Path, shape: tuple[int, int]) -> np.memmap:
    """A writable memory-mapped .npy whose blocks are reserved on disk up front."""
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    allocate(path, os.path.getsize(path))
    return array


def _assemble(
    final: np.ndarray,
    keep: np.ndarray,
    reuse: np.ndarray,
    embedded: np.ndarray,
    previous: Previous | None,
    fresh: np.ndarray,
    chunk: int = 65536,
) -> None:
    """Fill `final` in input order from the earlier and the fresh vectors, a chunk at a time."""
    for start in range(0, len(keep), chunk):
        rows = keep[start : start + chunk]
        old, new = reuse[rows], embedded[rows]
        block = np.empty((len(rows), final.shape[1]), dtype=np.float32)
        if previous is not None and (old >= 0).any():
            block[old >= 0] = previous.vectors[old[old >= 0]]
        if (new >= 0).any():
            block[new >= 0] = fresh[new[new >= 0]]
        final[start : start + len(rows)] = block


MAX_DIMENSION = 65_536
MAX_COUNT = 2**40


def read_vectors(folder: Path) -> tuple[np.ndarray, dict[str, Any]]:
    """The vectors (memory-mapped) and meta of an embed output folder's current generation."""
    return read_current(folder, lambda gen: read_vectors_in(gen, folder))


def read_embedded(folder: Path) -> tuple[np.ndarray, Any, dict[str, Any]]:
    """Vectors (memory-mapped), ItemTable and meta of an embed output folder, all three from
    one generation."""
    from pactl.index import ItemTable

    def read(gen: Path) -> tuple[np.ndarray, Any, dict[str, Any]]:
        vectors, meta = read_vectors_in(gen, folder)
        items = ItemTable.read(gen / "items.csv")
        if len(items) != len(vectors):
            raise PactlError(
                f"{folder}: items.csv has {len(items):,} rows for {len(vectors):,} vectors: "
                "run `pactl embed` again"
            )
        return vectors, items, meta

    return read_current(folder, read)


def read_vectors_in(gen: Path, folder: Path) -> tuple[np.ndarray, dict[str, Any]]:
    """read_vectors on one generation `gen` of `folder` (named in messages)."""
    fix = "run `pactl embed` again"
    for name in ("vectors.npy", "items.csv", "meta.json"):
        if not (gen / name).is_file():
            raise PactlError(f"{folder} lacks {name}: is it the output of `pactl embed`?")
    meta_path = folder / "meta.json"
    meta = records.read_json_object(gen / "meta.json", meta_path, "a pactl vectors meta.json")
    if meta.get("format") != VECTORS_FORMAT:
        raise PactlError(f"{meta_path} is not a pactl vectors file")
    version = records.field(meta, "version", int, meta_path)
    if version > VECTORS_VERSION:
        raise PactlError(f"{meta_path} was written by a newer pactl (version {version})")
    dim = records.field(meta, "dimension", int, meta_path, 1, MAX_DIMENSION)
    count = records.field(meta, "count", int, meta_path, 0, MAX_COUNT)
    records.field(meta, "fingerprint", str, meta_path)
    read_config(
        ModelConfig,
        records.field(meta, "model_config", dict, meta_path),
        f"{meta_path}: model_config",
    )
    records.field(meta, "checkpoint", str, meta_path, optional=True)
    check_files(gen, meta, folder, fix)
    try:
        vectors = np.load(gen / "vectors.npy", mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise PactlError(f"{folder}/vectors.npy is not a float32 .npy array ({e}): {fix}") from None
    if vectors.ndim != 2 or vectors.shape != (count, dim) or vectors.dtype != np.float32:
        raise PactlError(
            f"{folder}/vectors.npy ({vectors.dtype} {vectors.shape}) does not match its "
            f"meta.json ({count:,} x {dim} float32): {fix}"
        )
    return vectors, meta
