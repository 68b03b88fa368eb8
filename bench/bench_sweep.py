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

    python bench/bench_sweep.py /tmp/pactl-real/fonts                 # 2 points x 2 epochs
    python bench/bench_sweep.py /tmp/pactl-real/fonts --epochs 3 --values 16,32,64

Results (a markdown table) go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pactl.research.sweep as sweep
from pactl.console import Reporter
from pactl.research.sweep import SweepConfig, run_sweep


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="the glyph set folder (bench/real_sets.py)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--values", default="16,32", help="alpha values: the sweep's points")
    args = parser.parse_args()
    timed: dict[str, float] = {}
    inner = sweep.run_point

    def run_point(folder: Path, name: str, *rest: Any) -> dict[str, float]:
        began = time.perf_counter()
        found = inner(folder, name, *rest)
        timed[name] = time.perf_counter() - began
        return found

    sweep.run_point = run_point  # type: ignore[assignment]
    fixed = (
        ("backbone", "small"), ("weights", "none"), ("image_size", 32), ("batch_size", 64),
        ("epochs", args.epochs), ("workers", 0), ("device", "cpu"),
    )  # fmt: skip
    config = SweepConfig(
        source=str(args.data),
        params=(("alpha", tuple(float(v) for v in args.values.split(","))),),
        fixed=fixed,
    )
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "sweep"
        run_sweep(folder, config, "cpu", Reporter(quiet=True))
        rows = []
        for name, wall in sorted(timed.items()):
            with open(folder / "points" / name / "metrics.csv", newline="") as f:
                table = list(csv.DictReader(f))
            start = sum(float(r["seconds"]) for r in table if int(r["epoch"]) == 0)
            training = sum(float(r["seconds"]) for r in table if int(r["epoch"]) > 0)
            rows.append((name, wall, training, start, wall - training))
    print(
        f"| point | wall s | epochs 1-{args.epochs} s | overhead s | of it epoch 0 s "
        "| overhead / training | without epoch 0 |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, wall, training, start, overhead in rows:
        print(
            f"| {name} | {wall:.1f} | {training:.1f} | {overhead:.1f} | {start:.1f} "
            f"| {overhead / training:.1%} | {(overhead - start) / training:.1%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
