"""Embedding photo-sized JPEGs: `pactl embed` against a plain torchvision ImageFolder loop.

Target: 1,000 JPEGs of about 1024x768 embedded with resnet50 at 224 at least 1.5x faster than
torchvision.datasets.ImageFolder (Resize(256), CenterCrop(224), ToTensor, Normalize) and a
DataLoader (batch 64) with the same number of workers, the model in eval mode under
torch.no_grad, float32.

The images are synthetic but photo-like (smooth colour fields, shapes, texture and sensor
noise; quality 90, about 200 KB each) in five class folders, generated once per seed into the
work folder and reused. Both sides load the same resnet50 (random weights, so nothing
downloads): pactl from a checkpoint written by pactl.checkpoint, the baseline from the same
file's weights mapped onto torchvision's resnet50. Each side is a fresh subprocess timed from
the outside, so interpreter start, imports, model build and checkpoint load count for both;
pactl runs as its CLI, `python -m pactl embed DIR --checkpoint X --workers W`. Sides run in a
shuffled order each round; the figures are medians of wall seconds, with the CPU seconds of
each side's process tree beside them (steadier than wall time on a shared machine). The two
decode paths differ (pactl decodes JPEGs in draft mode at the resize size), so the vectors are
compared by cosine, raw and centred on the baseline's mean vector: random weights map every
picture near one direction, and the centred figure is the one that tells files apart.

    python -m bench embed                    # 1,000 images, 2 workers, one round
    python -m bench embed --images 200 --rounds 3 --extra bf16 --extra nchw --breakdown
    python -m bench embed --quick            # 48 images, resnet18

--extra adds pactl variants (repeatable): bf16 (the CLI with --amp bf16); eager
(pactl.embed.embed_files, fp32, channels_last, prepare=False: the network as it is, not traced
and frozen, which shows what freezing is worth); nchw (the same with channels_last=False too:
pactl's loader and loop with neither network change). --breakdown times the loaders alone and
the model alone, in this process, to show where the time goes.

Results (the markdown tables) go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

TARGET = 1.5  # baseline / pactl at least
WIDTH, HEIGHT, QUALITY, CLASSES = 1024, 768, 90, 5
BASELINE_BATCH = 64
EXTRAS = ("bf16", "eager", "nchw")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- inputs


def synthetic_photo(rng: np.random.Generator) -> Any:
    """A 1024x768 RGB picture with photo-like statistics (not content)."""
    from PIL import Image, ImageDraw

    sw, sh = WIDTH // 4, HEIGHT // 4  # drawn small, upscaled: soft edges like a lens's
    base = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    img = Image.fromarray(base).resize((sw, sh), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(15, 40))):
        x0, y0 = rng.uniform(-0.2, 1.0) * sw, rng.uniform(-0.2, 1.0) * sh
        x1, y1 = x0 + rng.uniform(0.05, 0.5) * sw, y0 + rng.uniform(0.05, 0.5) * sh
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape([x0, y0, x1, y1], fill=fill)
    texture = rng.integers(-24, 25, (sh, sw, 3), dtype=np.int16)
    small = np.clip(np.asarray(img, np.int16) + texture, 0, 255).astype(np.uint8)
    big = Image.fromarray(small).resize((WIDTH, HEIGHT), Image.Resampling.BICUBIC)
    noise = rng.integers(-6, 7, (HEIGHT, WIDTH, 3), dtype=np.int16)  # sensor noise
    return Image.fromarray(np.clip(np.asarray(big, np.int16) + noise, 0, 255).astype(np.uint8))


def image_path(folder: Path, i: int) -> Path:
    return folder / f"class_{i % CLASSES}" / f"img_{i:05d}.jpg"


def ensure_images(work: Path, count: int, seed: int) -> Path:
    """The first `count` images of the seed's cache, made where missing; image i from (seed, i)."""
    from pactl.store.generations import atomic_path

    cache = work / f"jpegs-{WIDTH}x{HEIGHT}-q{QUALITY}-seed{seed}"
    missing = [i for i in range(count) if not image_path(cache, i).is_file()]
    if missing:
        log(f"generating {len(missing)} JPEGs into {cache} ...")
    for done, i in enumerate(missing, 1):
        path = image_path(cache, i)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            synthetic_photo(np.random.default_rng([seed, i])).save(tmp, "JPEG", quality=QUALITY)
        if done % 100 == 0:
            log(f"  {done}/{len(missing)}")
    return cache


def subset_folder(work: Path, cache: Path, count: int) -> Path:
    """A folder of exactly the first `count` images (hard links into the cache)."""
    folder = work / f"{cache.name}-first{count}"
    wanted = {image_path(folder, i): image_path(cache, i) for i in range(count)}
    have = {p for p in folder.rglob("*.jpg")} if folder.is_dir() else set()
    for stale in have - set(wanted):
        stale.unlink()
    for link, source in wanted.items():
        if not link.is_file():
            link.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, link)
            except OSError:  # another file system: copy instead
                link.write_bytes(source.read_bytes())
    return folder


def ensure_checkpoint(work: Path, backbone: str, image_size: int, resize: int, seed: int) -> Path:
    """A pactl export of `backbone` with random weights (weights none: nothing downloads)."""
    from pactl import checkpoint as ckpt
    from pactl.config import ModelConfig
    from pactl.model import build_model

    path = work / f"checkpoint-{backbone}-{image_size}-{resize}-seed{seed}.pt"
    if not path.is_file():
        config = ModelConfig(
            backbone=backbone, weights="none", image_size=image_size, resize_size=resize
        )
        net, resolved = build_model(config, seed=seed)
        weights = ckpt.clean_state_dict(net)
        ckpt.save(path, ckpt.export_payload(weights, resolved, [], 0, {}))
    return path


# --------------------------------------------------------------------------- the sides (children)


def baseline_model(checkpoint: Path, backbone: str) -> tuple[Any, dict[str, Any]]:
    """torchvision's network with GAP + GMP, Linear and L2 norm, given the checkpoint's weights."""
    import torch
    import torch.nn.functional as F
    import torchvision
    from torch import nn

    payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
    body = getattr(torchvision.models, backbone)(weights=None)
    names = [name for name, _ in body.named_children()]
    state, head = {}, {}
    for key, value in payload["model"].items():
        part, rest = key.split(".", 1)
        if part == "backbone":  # "backbone.4.0.conv1.weight" -> "layer1.0.conv1.weight"
            index, tail = rest.split(".", 1)
            state[f"{names[int(index)]}.{tail}"] = value
        else:
            head[rest] = value
    body.fc = nn.Identity()
    body.load_state_dict(state, strict=False)
    embedding = nn.Linear(head["weight"].shape[1], head["weight"].shape[0])
    embedding.load_state_dict(head)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.embedding = body, embedding

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b = self.body
            x = b.maxpool(b.relu(b.bn1(b.conv1(x))))
            x = b.layer4(b.layer3(b.layer2(b.layer1(x))))
            pooled = F.adaptive_avg_pool2d(x, 1) + F.adaptive_max_pool2d(x, 1)
            return F.normalize(self.embedding(pooled.flatten(1)), dim=1)

    return Net().eval(), payload["model_config"]


def baseline_loader(folder: Path, config: dict[str, Any], workers: int) -> Any:
    import torch
    import torchvision
    from torchvision import transforms as T

    transform = T.Compose(
        [
            T.Resize(config["resize_size"]),
            T.CenterCrop(config["image_size"]),
            T.ToTensor(),
            T.Normalize(config["mean"], config["std"]),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(str(folder), transform=transform)
    return torch.utils.data.DataLoader(
        dataset, batch_size=BASELINE_BATCH, shuffle=False, num_workers=workers
    )


def run_baseline(args: argparse.Namespace) -> dict[str, Any]:
    """ImageFolder + DataLoader + model under no_grad, float32: the plain torchvision loop."""
    import torch

    began = time.perf_counter()
    model, config = baseline_model(args.checkpoint, args.backbone)
    loader = baseline_loader(args.folder, config, args.workers)
    ready = time.perf_counter()
    chunks = []
    with torch.no_grad():
        for images, _ in loader:
            chunks.append(model(images).numpy())
    looped = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / "vectors.npy", np.concatenate(chunks))
    paths = [p for p, _ in loader.dataset.samples]
    (args.out / "paths.txt").write_text("".join(p + "\n" for p in paths))
    return {"setup_s": ready - began, "loop_s": looped - ready}


def run_pactl_library(args: argparse.Namespace) -> dict[str, Any]:
    """pactl.embed.embed_files in fp32, the network not frozen; NCHW for the nchw side."""
    import torch

    from pactl.checkpoint import load_model
    from pactl.console import QUIET
    from pactl.embed import embed_files
    from pactl.verbs.sources import source_items

    began = time.perf_counter()
    files, _ = source_items(str(args.folder), None, QUIET)
    model, config, _ = load_model(args.checkpoint)
    ready = time.perf_counter()
    device = torch.device("cpu")
    done = embed_files(
        model,
        files,
        config,
        device,
        QUIET,
        workers=args.workers,
        channels_last=args.side == "pactl-eager",
        prepare=False,
    )
    looped = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / "vectors.npy", done.vectors)
    (args.out / "paths.txt").write_text("".join(str(files[i]) + "\n" for i in done.rows))
    return {"setup_s": ready - began, "loop_s": looped - ready}


def side_command(side: str, folder: Path, checkpoint: Path, out: Path, args: Any) -> list[str]:
    if side in ("pactl", "pactl-bf16"):
        command = [sys.executable, "-m", "pactl", "embed", str(folder)]
        command += ["--checkpoint", str(checkpoint), "--out", str(out)]
        command += ["--workers", str(args.workers), "--device", "cpu", "--quiet"]
        return command + (["--amp", "bf16"] if side == "pactl-bf16" else [])
    command = [sys.executable, "-m", "bench.bench_embed", "--side", side]
    command += ["--folder", str(folder), "--checkpoint", str(checkpoint), "--out", str(out)]
    return command + ["--workers", str(args.workers), "--backbone", args.backbone]


def spawn(command: list[str], threads: int) -> tuple[float, dict[str, Any]]:
    """Wall seconds of one child with the given thread count, and what it reported.

    The report gains cpu_s: user + system seconds of the child and of its DataLoader workers
    (waited-for descendants count towards RUSAGE_CHILDREN), the work done whatever the load.
    """
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return seconds, {**(json.loads(lines[-1]) if lines else {}), "cpu_s": cpu}


def read_side(out: Path) -> dict[str, np.ndarray]:
    """Resolved path -> vector, from pactl's items.csv or a child's paths.txt."""
    vectors = np.load(out / "vectors.npy")
    if (out / "items.csv").is_file():
        with open(out / "items.csv", newline="") as f:
            paths = [row["path"] for row in csv.DictReader(f)]
    else:
        paths = (out / "paths.txt").read_text().splitlines()
    return {str(Path(p).resolve()): v for p, v in zip(paths, vectors, strict=True)}


Agreement = tuple[float, float, float, int]  # mean cos, min cos, mean centred cos, files


def agreement(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> Agreement:
    """Cosines of the same files' vectors, raw and centred on b's mean vector.

    A network with random weights maps every picture near one direction, so raw cosines are
    close to 1 even between different files; centred ones show whether the rest agrees too.
    """
    common = sorted(set(a) & set(b))
    if not common:
        raise SystemExit("the two sides embedded no file in common")
    x = np.stack([a[k] for k in common]).astype(np.float64)
    y = np.stack([b[k] for k in common]).astype(np.float64)
    cos = (x * y).sum(axis=1)  # both sides give unit rows
    xc, yc = x - y.mean(axis=0), y - y.mean(axis=0)
    centred = (xc * yc).sum(axis=1) / (np.linalg.norm(xc, axis=1) * np.linalg.norm(yc, axis=1))
    return float(cos.mean()), float(cos.min()), float(centred.mean()), len(common)


def between_files(b: dict[str, np.ndarray]) -> tuple[float, float]:
    """Mean raw and centred cosine between neighbouring different files: the scale of 'unlike'."""
    y = np.stack([b[k] for k in sorted(b)]).astype(np.float64)
    yc = y - y.mean(axis=0)
    raw = (y[1:] * y[:-1]).sum(axis=1)
    norms = np.linalg.norm(yc, axis=1)
    centred = (yc[1:] * yc[:-1]).sum(axis=1) / (norms[1:] * norms[:-1])
    return float(raw.mean()), float(centred.mean())


# --------------------------------------------------------------------------- timing


def time_sides(
    sides: list[str], folder: Path, checkpoint: Path, scratch: Path, args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, list[dict[str, Any]]], dict[str, Path]]:
    """Wall seconds of each side per round, in a shuffled order each round."""
    import shutil

    order = random.Random(args.seed)
    walls: dict[str, list[float]] = {side: [] for side in sides}
    reports: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    outs = {side: scratch / side for side in sides}
    for round_index in range(args.rounds):
        names = list(sides)
        order.shuffle(names)
        for side in names:
            shutil.rmtree(outs[side], ignore_errors=True)
            log(f"round {round_index + 1}/{args.rounds}: {side} on {args.images} images ...")
            command = side_command(side, folder, checkpoint, outs[side], args)
            seconds, report = spawn(command, args.threads)
            walls[side].append(seconds)
            reports[side].append(report)
            log(f"  {seconds:.1f} s ({seconds / args.images * 1e3:.0f} ms per image)")
    return walls, reports, outs


LABELS = {
    "baseline": "torchvision ImageFolder + DataLoader, fp32",
    "pactl": "`pactl embed` (CLI), fp32, channels_last",
    "pactl-bf16": "`pactl embed --amp bf16` (CLI), channels_last",
    "pactl-eager": "pactl embed_files, fp32, channels_last, not frozen",
    "pactl-nchw": "pactl embed_files, fp32, NCHW, not frozen",
}


def results_table(
    walls: dict[str, list[float]],
    reports: dict[str, list[dict[str, Any]]],
    cosines: dict[str, Agreement],
    n: int,
) -> list[str]:
    base = statistics.median(walls["baseline"])
    lines = [
        "| side | median s | ms per image | CPU s | setup s | loop s | baseline / side | "
        "cos vs baseline: mean | min | centred |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for side, values in walls.items():
        wall = statistics.median(values)
        setup = _median_of(reports[side], "setup_s")
        loop = _median_of(reports[side], "loop_s")
        cpu = _median_of(reports[side], "cpu_s")
        mean_cos, min_cos, centred, _ = cosines.get(side, (1.0, 1.0, 1.0, n))
        lines.append(
            f"| {LABELS[side]} | {wall:.1f} | {wall / n * 1e3:.0f} | {cpu} | {setup} | {loop} | "
            f"{base / wall:.2f} | {mean_cos:.5f} | {min_cos:.5f} | {centred:.4f} |"
        )
    return lines


def _median_of(reports: list[dict[str, Any]], key: str) -> str:
    values = [r[key] for r in reports if key in r]
    return f"{statistics.median(values):.1f}" if values else "-"


# --------------------------------------------------------------------------- breakdown


def median_seconds(
    calls: dict[str, Callable[[], object]], rounds: int
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per call, names shuffled each round, one untimed round first.

    CPU seconds are this process's (all its threads): for one thread they barely move with
    the machine's load, where wall seconds do.
    """
    order = random.Random(1)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    for round_index in range(rounds + 1):
        names = list(calls)
        order.shuffle(names)
        for name in names:
            start, cpu = time.perf_counter(), time.process_time()
            calls[name]()
            if round_index:
                times[name].append((time.perf_counter() - start, time.process_time() - cpu))
    return {
        name: (statistics.median(w for w, _ in pairs), statistics.median(c for _, c in pairs))
        for name, pairs in times.items()
    }


def drain(loader: Iterable[Any]) -> None:
    for _ in loader:
        pass


def breakdown(folder: Path, checkpoint: Path, args: argparse.Namespace) -> list[str]:
    """Decode + transform per image on one core (workers=0, one thread), and the model."""
    import torch
    import torch.nn.functional as F

    from pactl.checkpoint import load_model
    from pactl.console import QUIET
    from pactl.embed import inference_model
    from pactl.loaders import loader_for
    from pactl.runtime import autocast
    from pactl.verbs.sources import source_items

    # Loader workers run one torch thread each; in this process too, lest tiny ops contend.
    torch.set_num_threads(1)
    files, _ = source_items(str(folder), None, QUIET)
    model, config, payload = load_model(checkpoint)
    n = len(files)
    log(f"breakdown: loaders on {n} images, one process ...")
    loaders = median_seconds(
        {
            "baseline": lambda: drain(baseline_loader(folder, payload["model_config"], 0)),
            "pactl": lambda: drain(loader_for(files, None, config, 128, 0, torch.device("cpu"))),
        },
        rounds=3,
    )
    torch.set_num_threads(args.threads)
    batch = next(
        iter(loader_for(files, None, config, args.breakdown_batch, 0, torch.device("cpu")))
    )
    images = batch.images
    channels_last = images.contiguous(memory_format=torch.channels_last)
    variants = {
        "fp32": (model, images, "none"),
        "fp32 + channels_last": (_cl_copy(model), channels_last, "none"),
        "fp32 + channels_last, frozen": (
            inference_model(_cl_copy(model), config, torch.device("cpu")),
            channels_last,
            "none",
        ),
        "bf16": (model, images, "bf16"),
        "bf16 + channels_last": (_cl_copy(model), channels_last, "bf16"),
    }

    def forward(net: torch.nn.Module, x: torch.Tensor, amp: str) -> torch.Tensor:
        with torch.inference_mode(), autocast(torch.device("cpu"), amp):
            return net(x).float()

    log(f"breakdown: model variants on a batch of {len(images)}, {args.threads} threads ...")
    calls: dict[str, Callable[[], object]] = {
        name: functools.partial(forward, *variant) for name, variant in variants.items()
    }
    models = median_seconds(calls, rounds=3)
    reference = forward(*variants["fp32"])
    lines = [
        f"Where the time goes: decode + transform in one process with one thread ({n} images, "
        f"workers 0); {config.backbone} forward at {config.image_size} on a batch of "
        f"{len(images)} ({args.threads} threads; CPU ms add up all threads).",
        "",
        "| stage | wall ms per image | CPU ms per image | cos vs fp32: mean | centred |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    names = {
        "baseline": "decode + transform, torchvision ImageFolder",
        "pactl": "decode + transform, pactl loader (draft-mode JPEG)",
    }
    for side, (wall, cpu) in loaders.items():
        lines.append(f"| {names[side]} | {wall / n * 1e3:.1f} | {cpu / n * 1e3:.1f} | - | - |")
    centre = reference.mean(dim=0)
    for name, (net, x, amp) in variants.items():
        out = forward(net, x, amp)
        cos = (out * reference).sum(dim=1).mean().item()
        centred = F.cosine_similarity(out - centre, reference - centre, dim=1).mean().item()
        wall, cpu = (v / len(images) * 1e3 for v in models[name])
        lines.append(f"| model {name} | {wall:.1f} | {cpu:.1f} | {cos:.5f} | {centred:.4f} |")
    return lines


def _cl_copy(model: Any) -> Any:
    import copy

    import torch

    return copy.deepcopy(model).to(memory_format=torch.channels_last)


# --------------------------------------------------------------------------- fast path


FASTPATH_SIZES = (1_000, 10_000, 100_000)  # embed sizes the one-off costs are spread over


def fastpath_variants(model: Any, config: Any, chosen: list[str]) -> dict[str, Callable[[], Any]]:
    """Name -> a function that prepares a copy of the network and returns its forward."""
    import torch

    from pactl.embed.fastpath import Compiled, fuse_batchnorm, inference_model

    def eager() -> Any:
        return _cl_copy(model)

    def script() -> Any:  # today's path: trace, freeze, optimize_for_inference
        return inference_model(_cl_copy(model), config, torch.device("cpu"))

    def fused() -> Any:  # BatchNorm folded into the convolutions by torch.fx, eager otherwise
        return fuse_batchnorm(_cl_copy(model))

    def compiled() -> Any:  # pactl's: inductor with freezing, on fixed chunks of 32 images
        return Compiled(_cl_copy(model))

    def exported() -> Any:  # torch.export + AOTInductor: a compiled .so, loaded back
        import tempfile as tf

        size = config.image_size
        example = torch.randn(2, 3, size, size).contiguous(memory_format=torch.channels_last)
        batch = torch.export.Dim("batch", min=1, max=4096)
        program = torch.export.export(_cl_copy(model), (example,), dynamic_shapes=({0: batch},))
        folder = tf.mkdtemp(prefix="pactl-aoti-")
        with torch._inductor.config.patch(freezing=True):
            package = torch._inductor.aoti_compile_and_package(
                program, package_path=str(Path(folder) / "net.pt2")
            )
        return torch._inductor.aoti_load_package(package)

    variants = {
        "eager": eager,
        "torchscript": script,
        "fx-fused": fused,
        "compile": compiled,
        "export+aoti": exported,
    }
    return {name: make for name, make in variants.items() if name.split("+")[0] in chosen}


def fastpath(folder: Path, checkpoint: Path, args: argparse.Namespace) -> list[str]:
    """The network alone, prepared each way, in this process: one-off preparation seconds (the
    first call at the batch size, and the first call at another batch size, which a compiled
    network recompiles for), then the median ms per image over rounds in shuffled order, and
    the cosine of its vectors to the eager network's."""
    import torch

    from pactl.checkpoint import load_model
    from pactl.console import QUIET
    from pactl.loaders import loader_for
    from pactl.verbs.sources import source_items

    torch.set_num_threads(args.threads)
    files, _ = source_items(str(folder), None, QUIET)
    model, config, _ = load_model(checkpoint)
    model.eval()
    batch = args.fastpath_batch
    loader = loader_for(files, None, config, batch, 0, torch.device("cpu"))
    images = next(iter(loader)).images.contiguous(memory_format=torch.channels_last)
    if len(images) < batch:
        raise SystemExit(f"--fastpath needs at least {batch} images (--images)")
    other = images[: batch - 1]  # a last, shorter batch
    forwards: dict[str, Any] = {}
    prep: dict[str, tuple[float, float]] = {}
    chosen = args.variants.split(",")
    for name, make in fastpath_variants(model, config, chosen).items():
        log(f"fastpath: preparing {name} ...")
        start = time.perf_counter()
        try:
            with torch.inference_mode(False):
                net = make()
            with torch.inference_mode():
                net(images)
            first = time.perf_counter() - start
            start = time.perf_counter()
            with torch.inference_mode():
                net(other)
        except Exception as e:  # one variant failing must not hide the others' figures
            log(f"  {name} failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        forwards[name] = net
        prep[name] = (first, time.perf_counter() - start)

    def forward(net: Any) -> Any:
        with torch.inference_mode():
            return net(images).float()

    log(f"fastpath: {len(forwards)} variants, batch {batch}, {args.fastpath_rounds} rounds ...")
    calls: dict[str, Callable[[], object]] = {
        name: functools.partial(forward, net) for name, net in forwards.items()
    }
    times = median_seconds(calls, rounds=args.fastpath_rounds)
    if "eager" not in forwards:
        raise SystemExit("--fastpath needs the eager variant (the reference)")
    reference = forward(forwards["eager"])
    per_image = {name: wall / batch for name, (wall, _) in times.items()}
    base = "torchscript" if "torchscript" in per_image else "eager"
    sizes = " | ".join(f"{n:,} images s" for n in FASTPATH_SIZES)
    lines = [
        f"The network alone: {config.backbone} at {config.image_size}, fp32, channels_last, "
        f"batch {batch}, {args.threads} threads; median of {args.fastpath_rounds} rounds in "
        f"shuffled order after one untimed round. Totals = first call + another batch size's "
        f"first call + images x ms per image.",
        "",
        f"| variant | first call s | other batch size s | ms per image | CPU ms per image | "
        f"{base} / variant | cos vs eager: min | {sizes} |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(FASTPATH_SIZES),
    ]
    for name, (first, second) in prep.items():
        wall, cpu = times[name]
        cos = (forward(forwards[name]) * reference).sum(dim=1).min().item()
        totals = " | ".join(f"{first + second + n * per_image[name]:.0f}" for n in FASTPATH_SIZES)
        lines.append(
            f"| {name} | {first:.1f} | {second:.1f} | {per_image[name] * 1e3:.1f} | "
            f"{cpu / batch * 1e3:.1f} | {per_image[base] / per_image[name]:.2f} | {cos:.6f} | "
            f"{totals} |"
        )
    return lines


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="48 images, resnet18")
    parser.add_argument("--images", type=int, default=None, help="how many (default 1000)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers, both sides")
    parser.add_argument("--rounds", type=int, default=1, help="runs per side (median)")
    parser.add_argument("--backbone", default=None, help="torchvision ResNet (default resnet50)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--resize-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    parser.add_argument("--extra", choices=EXTRAS, action="append", default=[])
    parser.add_argument("--breakdown", action="store_true", help="time loaders and model apart")
    parser.add_argument("--breakdown-images", type=int, default=128)
    parser.add_argument("--breakdown-batch", type=int, default=32)
    parser.add_argument(
        "--fastpath", action="store_true", help="only the network, prepared each way"
    )
    parser.add_argument("--fastpath-batch", type=int, default=32)
    parser.add_argument("--fastpath-rounds", type=int, default=3)
    parser.add_argument(
        "--variants",
        default="eager,torchscript,fx-fused,compile",
        help="--fastpath: of eager, torchscript, fx-fused, compile, export (AOTInductor)",
    )
    default_work = Path(tempfile.gettempdir()) / "pactl-bench-embed"
    parser.add_argument("--work", type=Path, default=default_work, help="image cache folder")
    parser.add_argument("--seed", type=int, default=0)
    sides = ["baseline", "pactl-eager", "pactl-nchw"]
    parser.add_argument("--side", choices=sides, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.images = args.images or (48 if args.quick else 1000)
    args.backbone = args.backbone or ("resnet18" if args.quick else "resnet50")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side:
        run = run_baseline if args.side == "baseline" else run_pactl_library
        print(json.dumps(run(args)))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    cache = ensure_images(args.work, max(args.images, args.breakdown_images), args.seed)
    folder = subset_folder(args.work, cache, args.images)
    checkpoint = ensure_checkpoint(
        args.work, args.backbone, args.image_size, args.resize_size, args.seed
    )
    if args.fastpath:
        print("\n".join(fastpath(folder, checkpoint, args)))
        return 0
    sides = ["baseline", "pactl", *[f"pactl-{extra}" for extra in dict.fromkeys(args.extra)]]
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        walls, reports, outs = time_sides(sides, folder, checkpoint, Path(tmp), args)
        base = read_side(outs["baseline"])
        cosines = {side: agreement(read_side(outs[side]), base) for side in sides[1:]}
        unlike = between_files(base)
    n = args.images
    print(
        f"Embedding {n} synthetic {WIDTH}x{HEIGHT} JPEGs (quality {QUALITY}) with "
        f"{args.backbone} at {args.image_size} (resize {args.resize_size}), random weights, on "
        f"the CPU: {args.workers} DataLoader workers and {args.threads} torch threads on both "
        f"sides; each side a fresh process timed whole (start, model, load, embed, write); "
        f"median of {args.rounds} round(s). Baseline batch {BASELINE_BATCH}, pactl's default 128."
    )
    print()
    print("\n".join(results_table(walls, reports, cosines, n)))
    print()
    ratio = statistics.median(walls["baseline"]) / statistics.median(walls["pactl"])
    full = n >= 1000 and args.backbone == "resnet50" and args.image_size == 224
    verdict = ("met" if ratio >= TARGET else "MISSED") if full else f"not judged ({n} images)"
    print(f"- baseline / pactl embed = {ratio:.2f} (target >= {TARGET}): {verdict}")
    for side in sides[2:]:
        other = statistics.median(walls["baseline"]) / statistics.median(walls[side])
        print(f"- baseline / {LABELS[side]} = {other:.2f}")
    mean_cos, min_cos, centred, matched = cosines["pactl"]
    print(
        f"- same files, pactl vs baseline: mean cosine {mean_cos:.5f}, min {min_cos:.5f}, "
        f"centred {centred:.4f} ({matched} files matched)"
    )
    print(
        f"- for scale, different files on the baseline side: mean cosine {unlike[0]:.5f}, "
        f"centred {unlike[1]:.4f}"
    )
    if args.breakdown:
        part = subset_folder(args.work, cache, min(args.breakdown_images, n))
        print()
        print("\n".join(breakdown(part, checkpoint, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
