"""`pactl --help` start-up time (target under 0.3 s) and `import pactl.serve.client` (the
`--server` client, standard library only), beside a bare interpreter start.

    python -m bench help [--runs 20] [--before DIR]

Each figure is the median wall time of whole processes; the commands take turns, one run of
each in every round, so a machine that gets busier slows them alike. The bare `python -c pass`
start is the floor the machine allows. `--before DIR`: the same commands on another checkout
of pactl (its folder holding pactl/, e.g. a `git worktree` of an older commit), in the same
rounds, for a before/after ratio.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
from pathlib import Path

from bench import harness

ROOT = Path(__file__).resolve().parents[1]

TARGET_S = 0.3
COMMANDS = {
    "`python -c pass`": ["-c", "pass"],
    "`pactl --help`": ["-m", "pactl", "--help"],
    "`import pactl.serve.client`": ["-c", "import pactl.serve.client"],
}


def run(args: list[str], tree: Path) -> None:
    """`python ARGS` with `tree` first on the import path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, *args], capture_output=True, check=True, cwd=tree, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--before", type=Path, help="another checkout to time beside this one")
    args = parser.parse_args(argv)
    trees = {"now": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    steps = {
        (side, name): functools.partial(run, command, tree)
        for side, tree in trees.items()
        for name, command in COMMANDS.items()
    }  # one warm-up round fills the file cache
    timings = harness.interleaved(steps, rounds=args.runs, warmup=1)
    median = {key: timing.median for key, timing in timings.items()}
    print("| command | " + " | ".join(f"{side} (median s)" for side in trees) + " |")
    print("| --- |" + " ---: |" * len(trees))
    for name in COMMANDS:
        print(f"| {name} | " + " | ".join(f"{median[(s, name)]:.3f}" for s in trees) + " |")
    help_now = median[("now", "`pactl --help`")]
    bare = median[("now", "`python -c pass`")]
    print(
        f"\npactl --help / bare interpreter: {help_now / bare:.1f}x; "
        f"target {TARGET_S} s {'met' if help_now < TARGET_S else 'MISSED'}"
    )
    if "before" in trees:
        for name in list(COMMANDS)[1:]:
            ratio = median[("before", name)] / median[("now", name)]
            print(f"{name}: before / now {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
