"""What resumable embedding costs: `pactl embed` committing its progress every --commit-every
images against the same embed in one piece.

Each commit ends a chunk: the chunk's DataLoader (and its worker processes) stops, its vectors
are written to a progress file (.npz, fsynced, renamed into place), and the next chunk starts a
new DataLoader. The cost per commit is fixed, so it matters most for a cheap network; the bench
shows it for the test network (`small`, 32 px: the worst case) and for ResNet-18 at 112 px.

Data: N synthetic 64x64 PNGs (seeded colour fields with noise) in 8 class folders, made once in
the work folder. Each variant is `python -m pactl embed DIR --backbone B --weights none
--commit-every C --workers W` in a fresh process into a fresh folder, timed from the outside
(imports and model build count the same for every variant). Variants run in a shuffled order
each round; the figures are the median wall seconds and their ratio against one piece
(`--commit-every` larger than N). The vectors of every variant are checked equal to one piece's.

    python -m bench resume                  # 12,288 images, commits every 4,096 and 1,024
    python -m bench resume --quick          # 2,048 images, commits every 512: a minute
    python -m bench resume --images 20000 --every 4096 --every 512 --rounds 3

Results (a markdown table) go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

NETWORKS = {
    "small": ["--backbone", "small", "--weights", "none", "--image-size", "32"],
    "resnet18": ["--backbone", "resnet18", "--weights", "none", "--image-size", "112"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=12_288)
    p.add_argument("--every", type=int, action="append", help="--commit-every (repeatable)")
    p.add_argument("--network", choices=list(NETWORKS), action="append", help="(repeatable)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2,048 images, every 512, small only")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.every, args.network = 2_048, args.every or [512], ["small"]
    args.every = args.every or [4096, 1024]
    args.network = args.network or list(NETWORKS)
    return args


def make_images(folder: Path, n: int, seed: int) -> Path:
    """n 64x64 PNGs in 8 class folders, made once (a marker file records the count)."""
    marker = folder / f".made-{n}-{seed}"
    if marker.exists():
        return folder
    rng = np.random.default_rng(seed)
    for i in range(n):
        cls = folder / f"class_{i % 8}"
        cls.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 256, size=(1, 1, 3))
        noise = rng.integers(-40, 40, size=(64, 64, 3))
        pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(cls / f"{i:06d}.png")
        if i % 1000 == 999:
            print(f"  made {i + 1:,} images", file=sys.stderr)
    marker.touch()
    return folder


def embed(images: Path, out: Path, network: str, every: int, workers: int) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the process and its loader workers)."""
    args = [sys.executable, "-m", "pactl", "embed", str(images), *NETWORKS[network]]
    args += ["--out", str(out), "--commit-every", str(every), "--workers", str(workers), "-q"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or Path(scratch)
        images = make_images(work / f"images-{args.images}", args.images, args.seed)
        whole = args.images + 1  # one piece: no commit before the end
        variants = [(net, every) for net in args.network for every in [whole, *args.every]]
        seconds: dict[tuple[str, int], list[tuple[float, float]]] = {v: [] for v in variants}
        rng = random.Random(args.seed)
        for r in range(args.rounds):
            order = variants[:]
            rng.shuffle(order)
            for net, every in order:
                out = work / f"out-{net}-{every}-{r}"
                took = embed(images, out, net, every, args.workers)
                seconds[(net, every)].append(took)
                wall, cpu = took
                print(
                    f"  round {r + 1}: {net}, every {every:,}: {wall:.1f} s, {cpu:.1f} CPU s",
                    file=sys.stderr,
                )
        check_equal(work, variants, args.rounds)
    print(f"{args.images:,} PNGs of 64x64, --workers {args.workers}, {os.cpu_count()} CPUs,")
    print(f"median of {args.rounds} round(s) of the whole process: wall and CPU seconds\n")
    print("| network | --commit-every | commits | wall s | vs one piece | CPU s | vs one piece |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for net, every in variants:
        row = [f"| {net} | {'one piece' if every == whole else f'{every:,}'}"]
        row.append(str(-(-args.images // every)))
        for k in (0, 1):
            median = statistics.median(s[k] for s in seconds[(net, every)])
            base = statistics.median(s[k] for s in seconds[(net, whole)])
            row += [f"{median:.1f}", f"{median / base:.2f}x"]
        print(" | ".join(row) + " |")


def check_equal(work: Path, variants: list[tuple[str, int]], rounds: int) -> None:
    """Every variant's vectors equal the one-piece run's of the same network."""
    from pactl.embed import read_embedded

    for r in range(rounds):
        for net, every in variants:
            first = [e for n, e in variants if n == net][0]
            want = np.asarray(read_embedded(work / f"out-{net}-{first}-{r}")[0])
            got = np.asarray(read_embedded(work / f"out-{net}-{every}-{r}")[0])
            if not np.allclose(got, want, atol=1e-5):
                raise SystemExit(f"{net}, every {every}: vectors differ from one piece")


if __name__ == "__main__":
    main()
