"""One script that checks the GPU path end to end and measures it, for a lent GPU machine.

    python -m tools.gpu_check                 # on the GPU (exits 2 without one)
    python -m tools.gpu_check --device cpu --quick    # a smoke run of the same steps on the CPU

Steps, each printed as a markdown table row on stdout (progress on stderr):
1. a training step of resnet50 at 224 (random weights) in fp32, bf16 autocast, and bf16 +
   channels_last: median ms per step, images/s, the loss of each (bf16 close to fp32);
2. the Proxy-Anchor loss at SOP scale on the device vs the CPU: equal values, device time;
3. DDP with nccl across the visible GPUs (2+ needed; with one GPU a world of one is started to
   check the nccl path): the global-batch loss equals the single-process loss;
4. embed throughput of pactl.embed.embed_files on synthetic photo-sized JPEGs, fp32 vs bf16;
5. FAISS on those device-made vectors: pactl's default index against exact search;
6. JPEG decoding on the GPU (`pactl embed --gpu-decode`, nvJPEG) against PIL: images/s of the
   whole embed, and the vectors' agreement;
7. FAISS on the GPU (the `gpu` extra) against the CPU: build and search seconds of Flat, IVF
   with a flat quantiser and pactl's default IVF-HNSW on 200,000 vectors spread around the
   device-made ones, with each one's Recall@10 against exact search;
8. torch.compile on CUDA: first-call (compile) seconds and ms per batch against eager, bf16;
9. binary codes (`train --bits`, `index --binary`): the two code losses on the device against the
   CPU (equal values, device time), and exact Hamming top-10 of the signs of 200,000 device-made
   vectors by FAISS's IndexBinaryFlat (and GpuIndexBinaryFlat with the `gpu` extra) against a
   popcount brute force (pactl.codes.hamming), ties broken by id.

    python -m tools.gpu_check --dry-run       # the CPU parts only, CUDA steps say "skipped"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pactl.config import IndexConfig, ModelConfig, TrainConfig
from pactl.console import QUIET
from pactl.losses import proxy_anchor_loss
from pactl.training.distributed import World
from pactl.training.trainer import build_trainer, train_step

ROWS: list[str] = []


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def row(*cells: object) -> None:
    ROWS.append("| " + " | ".join(str(c) for c in cells) + " |")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Any, device: torch.device, repeats: int) -> float:
    fn()  # warm-up (kernels, cudnn autotune)
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def train_steps(device: torch.device, backbone: str, size: int, batch: int, repeats: int) -> None:
    model_cfg = ModelConfig(backbone=backbone, weights="none", image_size=size, resize_size=size)
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, size, size, generator=gen).to(device)
    labels = torch.randint(0, 98, (batch,), generator=gen).to(device)
    first: dict[str, float] = {}
    for name, amp, cl in (
        ("fp32", "none", False),
        ("bf16", "bf16", False),
        ("bf16+channels_last", "bf16", True),
    ):
        cfg = TrainConfig(device=str(device), amp=amp, channels_last=cl, workers=0)
        t = build_trainer(model_cfg, cfg, 98, World())
        first[name] = float(train_step(t, images, labels))
        seconds = timed(lambda t=t: train_step(t, images, labels), device, repeats)
        row(
            f"train step {backbone}@{size} b{batch} {name}",
            f"{seconds * 1e3:.1f} ms",
            f"{batch / seconds:.0f} img/s",
            f"first loss {first[name]:.4f}",
        )
    drift = abs(first["bf16"] - first["fp32"]) / abs(first["fp32"])
    row(
        "bf16 vs fp32 first-step loss",
        f"{drift:.2e} relative",
        "",
        "ok" if drift < 2e-2 else "CHECK",
    )


def loss_device_vs_cpu(device: torch.device, quick: bool, repeats: int) -> None:
    b, c, d = (32, 500, 64) if quick else (180, 11318, 512)
    gen = torch.Generator().manual_seed(1)
    x, p = torch.randn(b, d, generator=gen), torch.randn(c, d, generator=gen)
    y = torch.randint(0, c, (b,), generator=gen)
    on_cpu = float(proxy_anchor_loss(x, y, p))
    xd, pd = x.to(device).requires_grad_(), p.to(device).requires_grad_()
    on_device = float(proxy_anchor_loss(xd, y.to(device), pd).detach())

    def step() -> None:
        proxy_anchor_loss(xd, y.to(device), pd).backward()

    seconds = timed(step, device, repeats)
    loss_row(f"Proxy-Anchor fwd+bwd B{b} C{c} D{d}", seconds, on_device, on_cpu)


def loss_row(check: str, seconds: float, on_device: float, on_cpu: float) -> None:
    """A loss's time on the device and its value's agreement with the CPU's."""
    rel = abs(on_device - on_cpu) / abs(on_cpu)
    row(check, f"{seconds * 1e3:.2f} ms", f"{rel:.1e} rel. to CPU", "ok" if rel < 1e-4 else "CHECK")


def _ddp_worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from pactl.losses import ProxyAnchorLoss
    from pactl.training.distributed import gather_batch

    dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    criterion = ProxyAnchorLoss(10, 32).cuda()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(8 * world, 32, generator=gen).cuda()
    y = torch.randint(0, 10, (8 * world,), generator=gen).cuda()
    mine = slice(rank * 8, (rank + 1) * 8)
    emb, labels = gather_batch(x[mine], y[mine], World(rank, world, rank))
    loss = criterion(emb, labels)
    if rank == 0:
        torch.save({"loss": loss.detach().cpu(), "whole": criterion(x, y).detach().cpu()}, out)
    dist.destroy_process_group()


def ddp_nccl(device: torch.device) -> None:
    if device.type != "cuda":
        row("DDP nccl", "skipped (no CUDA)", "", "")
        return
    import torch.multiprocessing as mp

    world = max(1, min(torch.cuda.device_count(), 8))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "r0.pt")
        start = time.perf_counter()
        mp.start_processes(
            _ddp_worker,
            args=(world, str(Path(tmp) / "init"), out),
            nprocs=world,
            start_method="spawn",
        )
        got = torch.load(out, weights_only=True)
    same = torch.allclose(got["loss"], got["whole"], rtol=1e-5)
    row(
        f"DDP nccl, {world} process(es)",
        f"{time.perf_counter() - start:.1f} s incl. start",
        f"loss {float(got['loss']):.5f} vs {float(got['whole']):.5f}",
        "ok" if same else "CHECK",
    )


def embed_and_index(device: torch.device, quick: bool, workers: int) -> None:
    from PIL import Image

    from pactl import metrics
    from pactl.embed import embed_files
    from pactl.index import build_index
    from pactl.model import build_model

    n, side = (64, 256) if quick else (2048, 1024)
    backbone = "small" if quick else "resnet50"
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i in range(n):
            base = rng.integers(0, 255, size=(8, 8, 3), dtype=np.uint8)
            img = Image.fromarray(base).resize((side, side * 3 // 4), Image.Resampling.BILINEAR)
            path = Path(tmp) / f"{i:05d}.jpg"
            img.save(path, quality=90)
            files.append(path)
        net, cfg = build_model(ModelConfig(backbone=backbone, weights="none"))
        net.to(device)
        vectors = {}
        for amp in ("none", "bf16"):
            start = time.perf_counter()
            done = embed_files(
                net, files, cfg, device, QUIET, batch_size=128, workers=workers, amp=amp
            )
            seconds = time.perf_counter() - start
            vectors[amp] = done.vectors
            row(
                f"embed {n} JPEGs {side}x{side * 3 // 4} {backbone} amp={amp}",
                f"{n / seconds:.0f} img/s",
                f"{workers} workers",
                "",
            )
        cos = float(np.mean(np.sum(vectors["none"] * vectors["bf16"], axis=1)))
        row(
            "bf16 vs fp32 embeddings", f"mean cosine {cos:.4f}", "", "ok" if cos > 0.99 else "CHECK"
        )
        index, tuning = build_index(vectors["none"], IndexConfig(), QUIET)
        _, ids = index.search(vectors["none"][:64], 10)
        _, exact = metrics.knn(vectors["none"][:64], vectors["none"], 10)
        agree = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, exact, strict=True)])
        row(
            f"FAISS {tuning.get('factory')} on device-made vectors",
            f"Recall@10 {agree:.3f}",
            "vs exact",
            "ok" if agree >= 0.95 else "CHECK",
        )


def make_jpegs(folder: Path, n: int, side: int) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(0)
    files = []
    for i in range(n):
        base = rng.integers(0, 255, size=(8, 8, 3), dtype=np.uint8)
        img = Image.fromarray(base).resize((side, side * 3 // 4), Image.Resampling.BILINEAR)
        noise = rng.integers(-8, 9, size=(side * 3 // 4, side, 3))
        pixels = np.clip(np.asarray(img, np.int16) + noise, 0, 255).astype(np.uint8)
        path = folder / f"{i:05d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        files.append(path)
    return files


def gpu_decode(device: torch.device, quick: bool, workers: int) -> None:
    """`--gpu-decode` against PIL, the whole embed timed (decode, transform, network)."""
    if device.type != "cuda":
        row("embed --gpu-decode vs PIL", "skipped (no CUDA)", "", "")
        return
    from pactl.embed import embed_files
    from pactl.model import build_model

    n, side = (64, 256) if quick else (2048, 1024)
    backbone = "small" if quick else "resnet50"
    with tempfile.TemporaryDirectory() as tmp:
        files = make_jpegs(Path(tmp), n, side)
        net, cfg = build_model(ModelConfig(backbone=backbone, weights="none"))
        net.to(device)
        got = {}
        for on_gpu in (False, True, False, True):  # twice each: the first pass warms caches
            start = time.perf_counter()
            done = embed_files(
                net, files, cfg, device, QUIET, workers=workers, amp="bf16", gpu_decode=on_gpu
            )
            sync(device)
            got[on_gpu] = (n / (time.perf_counter() - start), done.vectors)
        ratio = got[True][0] / got[False][0]
        cos = float(np.mean(np.sum(got[True][1] * got[False][1], axis=1)))
        row(
            f"embed {n} JPEGs {side}x{side * 3 // 4} {backbone} bf16, {workers} workers",
            f"GPU decode {got[True][0]:.0f} img/s vs PIL {got[False][0]:.0f} img/s",
            f"x{ratio:.2f}, mean cosine {cos:.4f}",
            "faster: consider on by default" if ratio > 1.1 else "keep off by default",
        )


def spread(vectors: np.ndarray, n: int, device: torch.device) -> np.ndarray:
    """`n` unit vectors scattered around the given ones (made on the device)."""
    gen = torch.Generator(device=device).manual_seed(0)
    base = torch.from_numpy(np.ascontiguousarray(vectors)).to(device)
    pick = torch.randint(0, len(base), (n,), generator=gen, device=device)
    noise = torch.randn(n, base.shape[1], generator=gen, device=device) * 0.05
    out = torch.nn.functional.normalize(base[pick] + noise, dim=1)
    return out.float().cpu().numpy()


def faiss_gpu_vs_cpu(device: torch.device, quick: bool) -> None:
    """Build + search on the GPU (faiss-gpu-cu12, the `gpu` extra) against the CPU."""
    from pactl import metrics
    from pactl.index.build import build_index
    from pactl.index.gpus import faiss_gpus, gpu_searcher

    gpus = faiss_gpus("auto")
    dim, n = (64, 20_000) if quick else (512, 200_000)
    seeds = torch.randn(256, dim, generator=torch.Generator().manual_seed(3))
    made = spread(torch.nn.functional.normalize(seeds, dim=1).numpy(), n, device)
    queries = made[:1000]
    _, exact = metrics.knn(queries, made, 11)
    factories = ["Flat", f"IVF{256 if quick else 1024},Flat", None]  # None: pactl's default
    for factory in factories:
        for where in ("cpu", "gpu"):
            if where == "gpu" and not gpus:
                row(f"FAISS {factory or 'default'} on GPU", "skipped", "FAISS has no GPU", "")
                continue
            config = IndexConfig(factory=factory, faiss_device=where)
            index, record = build_index(made, config, QUIET)
            searcher = gpu_searcher(index, gpus if where == "gpu" else 0)  # Flat: a GPU copy
            start = time.perf_counter()
            _, ids = searcher.search(queries, 11)
            searched = time.perf_counter() - start
            recall = np.mean(
                [len(set(a[1:]) & set(b[1:])) / 10 for a, b in zip(ids, exact, strict=True)]
            )
            row(
                f"FAISS {record['factory']} on {where.upper()}, {n:,} x {dim}",
                f"build {record['build_seconds']:.1f} s",
                f"search 1,000 queries {searched * 1e3:.0f} ms, R@10 {recall:.3f}",
                "ok" if recall >= 0.9 else "CHECK",
            )
    if gpus:
        bundle_on_gpu(made[: 20_000 if quick else 100_000], queries)


def bundle_on_gpu(vectors: np.ndarray, queries: np.ndarray) -> None:
    """What `pactl query --faiss-device gpu` does: a Flat bundle with tombstones loaded onto
    the GPUs answers as the CPU does (k within and past what a GPU search selects)."""
    from pactl.index import build_index, delete_items, load_bundle, save_bundle
    from pactl.index.search import search

    with tempfile.TemporaryDirectory() as tmp:
        index, record = build_index(vectors, IndexConfig(factory="Flat", faiss_device="cpu"), QUIET)
        rows = [(i, f"/v/{i}", "") for i in range(len(vectors))]
        save_bundle(Path(tmp) / "b", index, rows, {"fingerprint": "f" * 64, **record})
        delete_items(Path(tmp) / "b", ids=list(range(0, len(vectors), 3)))
        on_cpu = load_bundle(Path(tmp) / "b", faiss_device="cpu")
        on_gpu = load_bundle(Path(tmp) / "b", faiss_device="gpu")
        for k in (10, 3000):
            start = time.perf_counter()
            cpu_ids = search(on_cpu, queries, k)[1]
            cpu_s = time.perf_counter() - start
            start = time.perf_counter()
            gpu_ids = search(on_gpu, queries, k)[1]
            gpu_s = time.perf_counter() - start
            same = float(np.mean(cpu_ids == gpu_ids))
            row(
                f"query search on a Flat bundle, GPU copy {on_gpu.gpu_index is not None}, k={k}",
                f"{cpu_s / gpu_s:.1f}x CPU ({gpu_s * 1e3:.0f} vs {cpu_s * 1e3:.0f} ms)",
                f"{len(queries):,} queries, ids equal {same:.4f}",
                "ok" if same >= 0.999 else "CHECK",
            )


def compile_on_cuda(device: torch.device, quick: bool, repeats: int) -> None:
    """torch.compile (inductor) against eager on the GPU, bf16 autocast, channels_last."""
    if device.type != "cuda":
        row("torch.compile on CUDA", "skipped (no CUDA)", "", "")
        return
    from pactl.model import build_model

    backbone, size, batch = ("small", 64, 32) if quick else ("resnet50", 224, 128)
    net, _ = build_model(ModelConfig(backbone=backbone, weights="none", image_size=size))
    net = net.to(device).eval().to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device=device).contiguous(
        memory_format=torch.channels_last
    )

    def run(model: Any) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            return model(x).float()

    compiled = torch.compile(net)
    start = time.perf_counter()
    run(compiled)
    sync(device)
    first = time.perf_counter() - start
    eager_s = timed(lambda: run(net), device, repeats)
    compiled_s = timed(lambda: run(compiled), device, repeats)
    cos = float(torch.nn.functional.cosine_similarity(run(net), run(compiled)).min())
    row(
        f"torch.compile {backbone}@{size} b{batch} bf16",
        f"{compiled_s * 1e3:.1f} ms vs eager {eager_s * 1e3:.1f} ms (x{eager_s / compiled_s:.2f})",
        f"compile {first:.0f} s, min cosine {cos:.5f}",
        "ok" if cos > 0.99 else "CHECK",
    )


def codes_on_device(device: torch.device, quick: bool, repeats: int) -> None:
    """The code losses of `train --bits` on the device against the CPU, then exact Hamming search
    of the signs of vectors spread on the device, FAISS against the brute force."""
    from pactl.codes.learned import build_code_loss

    b, c, bits = (32, 100, 64) if quick else (180, 11318, 512)
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(b, bits, generator=gen), torch.randint(0, c, (b,), generator=gen)
    for proxies in ("learned", "hadamard"):
        torch.manual_seed(0)  # the learned proxies' draw, the same each run
        loss = build_code_loss(proxies, "proxy_anchor", c, bits, weight=0.1)
        on_cpu = float(loss(x, y).detach())
        moved = loss.to(device)
        xd = x.to(device).requires_grad_()
        on_device = float(moved(xd, y.to(device)).detach())

        def step(moved: torch.nn.Module = moved, xd: torch.Tensor = xd) -> None:
            moved(xd, y.to(device)).backward()

        seconds = timed(step, device, repeats)
        loss_row(f"code loss {proxies} fwd+bwd B{b} C{c} {bits} bits", seconds, on_device, on_cpu)
    hamming_search(device, quick)


def hamming_search(device: torch.device, quick: bool) -> None:
    import faiss

    from pactl.codes import hamming
    from pactl.index.gpus import faiss_gpus

    n, bits = (20_000, 64) if quick else (200_000, 512)
    seeds = torch.randn(256, bits, generator=torch.Generator().manual_seed(6))
    made = spread(torch.nn.functional.normalize(seeds, dim=1).numpy(), n, device)
    codes, queries = hamming.pack(made), made[:1000]
    start = time.perf_counter()
    truth, _ = hamming.neighbours(queries, made, 10)
    brute = time.perf_counter() - start
    kinds = [("CPU", faiss.IndexBinaryFlat(bits))]
    if faiss_gpus("auto"):
        kinds.append(("GPU", faiss.GpuIndexBinaryFlat(faiss.StandardGpuResources(), bits)))
    for where, index in kinds:
        index.add(codes)
        start = time.perf_counter()
        found, _ = index.search(codes[:1000], 10)
        searched = time.perf_counter() - start
        same = float(np.mean(found == truth))  # distances: ties may order ids differently
        row(
            f"exact Hamming top-10 on {where}, {n:,} x {bits} bits",
            f"{searched * 1e3:.0f} ms for 1,000 queries",
            f"brute force {brute * 1e3:.0f} ms, distances equal {same:.4f}",
            "ok" if same == 1.0 else "CHECK",
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument(
        "--dry-run", action="store_true", help="--device cpu --quick: CUDA steps are skipped"
    )
    args = parser.parse_args()
    if args.dry_run:
        args.device, args.quick, args.repeats = "cpu", True, min(args.repeats, 2)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        log("no CUDA device visible; use --device cpu for a smoke run")
        return 2
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    log(f"device: {name}, torch {torch.__version__}")
    steps = [
        lambda: train_steps(
            device,
            "small" if args.quick else "resnet50",
            32 if args.quick else 224,
            8 if args.quick else 128,
            args.repeats,
        ),
        lambda: loss_device_vs_cpu(device, args.quick, args.repeats),
        lambda: ddp_nccl(device),
        lambda: embed_and_index(device, args.quick, args.workers),
        lambda: gpu_decode(device, args.quick, args.workers),
        lambda: faiss_gpu_vs_cpu(device, args.quick),
        lambda: compile_on_cuda(device, args.quick, args.repeats),
        lambda: codes_on_device(device, args.quick, args.repeats),
    ]
    for number, step in enumerate(steps, 1):
        try:
            step()
        except Exception as e:  # one failing check must not hide the others' figures
            row(f"step {number}", "FAILED", type(e).__name__, str(e)[:80])
    print(f"GPU check on {name}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}\n")
    print("| check | figure | detail | verdict |")
    print("| --- | --- | --- | --- |")
    print("\n".join(ROWS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
