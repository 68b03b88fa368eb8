"""What the CPU recipe for a user's own data costs: a training step and an evaluation forward
pass per image, by backbone and image size, on this machine's CPU.

    python -m bench recipe                                  # lite0 and resnet18/50
    python -m bench recipe --backbones timm:efficientnet_lite0 --sizes 96,128,160

Random weights (the cost does not depend on them), batch 64, channels_last, float32, the
Proxy-Anchor loss over 100 classes, AdamW; the fastest of --rounds steps after one warm-up.
Data loading is not included. Table to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from pactl.config import ModelConfig
from pactl.losses import build_loss
from pactl.model import build_model


def per_image_ms(backbone: str, size: int, batch: int, rounds: int) -> tuple[float, float]:
    """(training step, evaluation forward) milliseconds per image."""
    net, _ = build_model(ModelConfig(backbone=backbone, weights="none", image_size=size))
    net.to(memory_format=torch.channels_last)
    criterion = build_loss("proxy_anchor", 100, 512, 32.0, 0.1)
    optimizer = torch.optim.AdamW([*net.parameters(), *criterion.parameters()], lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, size, size, generator=gen)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 100, (batch,), generator=gen)
    net.train()
    steps = []
    for _ in range(rounds + 1):
        began = time.perf_counter()
        loss = criterion(net(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps.append(time.perf_counter() - began)
    net.eval()
    forwards = []
    with torch.no_grad():
        for _ in range(rounds + 1):
            began = time.perf_counter()
            net(images)
            forwards.append(time.perf_counter() - began)
    return min(steps[1:]) / batch * 1e3, min(forwards[1:]) / batch * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbones", default="timm:efficientnet_lite0,resnet18,resnet50")
    parser.add_argument("--sizes", default="64,96,128,224")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}")
    print("\n| backbone | image size | train step ms/image | eval forward ms/image |")
    print("| --- | ---: | ---: | ---: |")
    for backbone in args.backbones.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            print(f"{backbone} at {size}...", file=sys.stderr, flush=True)
            step, forward = per_image_ms(backbone, size, args.batch, args.rounds)
            print(f"| {backbone} | {size} | {step:.2f} | {forward:.2f} |", flush=True)


if __name__ == "__main__":
    main()
