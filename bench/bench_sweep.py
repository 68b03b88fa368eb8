"""What a sweep point costs outside training: `pactl sweep`'s time per point against the time its
epochs take.

A point's time is measured around pactl.research.sweep.run_point (lock, run folder, manifest
already loaded once per sweep, network built, provenance written, epoch 0 evaluated before
training, the epoch estimate, every epoch, checkpoints, curves.png). Its training time is the sum
of metrics.csv's `seconds` over epochs 1..N (each epoch's steps and its evaluation). The overhead
is the difference; the target is under 10% of the training time. Epoch 0 (the evaluation before
the first step, every run's baseline) is shown apart: it is most of the overhead.

Data: the glyph set of bench/real_sets.py (built there first:
`python bench/real_sets.py fonts /tmp/pactl-real/fonts`). Recipe: the test network `small` at
32 px from random weights, batch 64, so that the overhead is as large a share as it gets (a
larger network makes training longer and the overhead the same).

Points whose networks start alike share epoch 0 (pactl.training.start_cache): the first evaluates
it, the others copy its row, seconds included, so for them the table shows the epoch 0 as shared and
counts none of its seconds. The last row is the whole sweep: every point's time against every
point's training.

`--decoding` measures instead what a cache of decoded images could save: one pass of PIL
decoding over the train and test splits, one pass of the train loader (decoding, augmentation,
batching) and of the test loader, and the training steps over the train loader's batches.

    python -m bench sweep /tmp/pactl-real/fonts                 # 2 points x 2 epochs
    python -m bench sweep /tmp/pactl-real/fonts --epochs 3 --values 16,32,64
    python -m bench sweep /tmp/pactl-real/fonts --decoding
    python -m bench sweep /tmp/pactl-real/fonts --values 4,8,16,32,64 \
        --set backbone=timm:efficientnet_lite0 --set weights=/tmp/pactl-real/lite0.pth \
        --set image_size=64                           # the loss study's network
    python -m bench sweep /tmp/pactl-real/fonts --values 16,32 --epochs 6 \
        --set backbone=timm:efficientnet_lite0 --set weights=/tmp/pactl-real/lite0.pth \
        --set image_size=128 --set workers=2          # the CPU recipe's own setting

Results (a markdown table) go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import pactl.research.sweep as sweep
from pactl.console import Reporter
from pactl.research.sweep import SweepConfig, run_sweep

FIXED = (
    ("backbone", "small"), ("weights", "none"), ("image_size", 32), ("batch_size", 64),
    ("workers", 0), ("device", "cpu"),
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="the glyph set folder (bench/real_sets.py)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--values", default="16,32", help="alpha values: the sweep's points")
    parser.add_argument("--decoding", action="store_true", help="decoding against the steps")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a setting in place of the recipe's (as pactl sweep --set), repeatable",
    )  # fmt: skip
    args = parser.parse_args(argv)
    given = dict(sweep.parse_setting(text, many=False) for text in args.set)
    config = SweepConfig(
        source=str(args.data),
        params=(("alpha", tuple(float(v) for v in args.values.split(","))),),
        fixed=(
            *((k, v) for k, v in FIXED if k not in given),
            *given.items(),
            ("epochs", args.epochs),
        ),
    )
    began = time.process_time(), time.perf_counter()
    print(decoding_table(config) if args.decoding else overhead_table(config, args.epochs))
    cpu, wall = time.process_time() - began[0], time.perf_counter() - began[1]
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"\n{cpu:.0f} s of CPU in {wall:.0f} s of wall time; load average {load} at the end")
    return 0


def overhead_table(config: SweepConfig, epochs: int) -> str:
    """Each point's time around run_point against its epochs' seconds, and the whole sweep's."""
    timed: dict[str, float] = {}
    inner = sweep.run_point

    def run_point(folder: Path, name: str, *rest: Any) -> dict[str, float]:
        began = time.perf_counter()
        found = inner(folder, name, *rest)
        timed[name] = time.perf_counter() - began
        return found

    sweep.run_point = run_point  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "sweep"
        run_sweep(folder, config, "cpu", Reporter(quiet=True))
        measured_by = {  # the point that evaluated each shared epoch 0
            json.loads(p.read_text())["run"] for p in (folder / "cache" / "epoch0").glob("*.json")
        }
        rows = [
            point_row(folder / "points" / name, wall, measured_by) for name, wall in timed.items()
        ]
    lines = [
        f"| point | wall s | epochs 1-{epochs} s | overhead s | epoch 0 s "
        "| overhead / training | without epoch 0 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, wall, training, start in sorted(rows):
        shown = f"{start:.1f}" if start is not None else "shared"
        lines.append(line(name, wall, training, shown, start or 0.0))
    wall, training = sum(r[1] for r in rows), sum(r[2] for r in rows)
    start = sum(r[3] or 0.0 for r in rows)
    lines.append(line("all points", wall, training, f"{start:.1f}", start))
    return "\n".join(lines)


def point_row(
    run: Path, wall: float, measured_by: set[str]
) -> tuple[str, float, float, float | None]:
    """(name, wall, training seconds, epoch 0 seconds or None where the row was shared)."""
    with open(run / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    start = sum(float(r["seconds"]) for r in table if int(r["epoch"]) == 0)
    training = sum(float(r["seconds"]) for r in table if int(r["epoch"]) > 0)
    return run.name, wall, training, start if run.name in measured_by else None


def line(name: str, wall: float, training: float, shown: str, start: float) -> str:
    overhead = wall - training
    return (
        f"| {name} | {wall:.1f} | {training:.1f} | {overhead:.1f} | {shown} "
        f"| {overhead / training:.1%} | {(overhead - start) / training:.1%} |"
    )


def decoding_table(config: SweepConfig) -> str:
    """PIL decoding, the loaders and the training steps over one pass, on the first point."""
    from pactl.datasets import load_source
    from pactl.images import load_image
    from pactl.loaders import loader_for
    from pactl.training.distributed import World
    from pactl.training.trainer import build_trainer, train_step

    model_cfg, cfg = sweep.sweep_point_configs(config, "cpu", {"alpha": 16.0}, 0)
    manifest = load_source(config.source, Reporter(quiet=True))
    train, test = manifest.select("train"), manifest.select("test")
    labels = np.searchsorted(np.unique(train.labels), train.labels)
    t = build_trainer(model_cfg, cfg, int(labels.max()) + 1, World())
    timed: dict[str, float] = {}

    def timing(what: str, work: Any) -> Any:
        began = time.perf_counter()
        done = work()
        timed[what] = time.perf_counter() - began
        return done

    for name, part in (("train", train), ("test", test)):
        timing(f"PIL decoding, {name} split", lambda p=part: [load_image(f) for f in p.files()])
    order = torch.utils.data.RandomSampler(range(len(labels)), generator=torch.Generator())
    batches = timing(
        f"train loader ({cfg.augment}, batch {cfg.batch_size})",
        lambda: list(loader_for(train.files(), labels, t.model_cfg, cfg.batch_size, 0,
                                t.device, train=True, augment=cfg.augment, sampler=order)),
    )  # fmt: skip
    timing(
        "test loader (test transform, batch 128)",
        lambda: list(loader_for(test.files(), None, t.model_cfg, 128, 0, t.device, draft=False)),
    )
    t.model.train()
    timing(
        "training steps over those batches",
        lambda: [train_step(t, b.images, b.labels) for b in batches],
    )
    steps = timed["training steps over those batches"]
    lines = [
        f"| one pass ({len(train):,} train, {len(test):,} test images) | s | of the steps |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {what} | {s:.2f} | {s / steps:.1%} |" for what, s in timed.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
