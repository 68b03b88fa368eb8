"""The README's picture: `make demo`'s run answering one query of each unseen digit.

Runs the demo's commands in a fresh folder (pactl download digits, pactl train digits, pactl
index), then `pactl query` with the first test image of each of the digits 5-9 (classes the
network never trained on), `--k 4 --exclude-self --grid`: each row a query and its 4 nearest
indexed images, framed green when of the query's class and red when not. The grid is saved as
a palette PNG (at most 64 colours), small enough for the README's first screen.

    python -m tools.readme_picture                  # writes docs/img/demo-query.png
    python -m tools.readme_picture --out /tmp/x.png

78 s measured on 2 shared CPU cores (`time python -m tools.readme_picture`; four fresh
processes, each importing torch). Messages go to stderr; stdout gets the path written.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNSEEN = ("5", "6", "7", "8", "9")  # the digits' test classes: the first half trains
MAX_BYTES = 100_000


def pactl(args: list[str], env: dict[str, str], cwd: Path) -> None:
    """One pactl command, as a user would type it (the checkout's pactl, `python -m pactl`)."""
    print(f"$ pactl {' '.join(args)}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "pactl", *args], env=env, cwd=cwd, check=True)


def shrink(source: Path, out: Path, colours: int = 64) -> int:
    """`source` as a palette PNG of at most `colours` colours at `out`; returns its size."""
    from PIL import Image

    with Image.open(source) as picture:
        small = picture.convert("RGB").quantize(colors=colours, method=Image.Quantize.MEDIANCUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    small.save(out, optimize=True)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "demo-query.png")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pactl-picture-") as folder:
        work = Path(folder)
        home = work / "home"
        env = {**os.environ, "PACTL_HOME": str(home), "PACTL_RUNS": str(work / "runs")}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        pactl(["download", "digits", "--quiet"], env, work)
        pactl(["train", "digits", "--name", "demo", "--quiet"], env, work)
        pactl(["index", "--quiet"], env, work)
        digits = home / "datasets" / "digits"
        queries = [str(min((digits / d).glob("*.png"))) for d in UNSEEN]
        grid = work / "grid.png"
        query = [*queries, "--k", "4", "--exclude-self", "--grid", str(grid), "--quiet"]
        pactl(["query", *query, "--format", "csv"], env, work)
        size = shrink(grid, args.out)
    print(f"wrote {args.out} ({size:,} bytes)", file=sys.stderr)
    if size > MAX_BYTES:
        print(f"{args.out} is over {MAX_BYTES:,} bytes: too large for the README", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
