"""`pactl --help` start-up time: target under 0.3 s, reported beside a bare interpreter start.

    python bench/bench_help.py [--runs 20]

Each figure is the median wall time of whole processes, started one after another; the bare
`python -c pass` start is printed beside it as the floor the machine allows.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

TARGET_S = 0.3


def median_seconds(command: list[str], runs: int) -> float:
    subprocess.run(command, capture_output=True, check=True)  # warm the file cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    bare = median_seconds([sys.executable, "-c", "pass"], args.runs)
    help_ = median_seconds([sys.executable, "-m", "pactl", "--help"], args.runs)
    print("| command | median wall seconds |")
    print("| --- | ---: |")
    print(f"| `python -c pass` | {bare:.3f} |")
    print(f"| `pactl --help` | {help_:.3f} |")
    print(
        f"\npactl --help / bare interpreter: {help_ / bare:.1f}x; "
        f"target {TARGET_S} s {'met' if help_ < TARGET_S else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
