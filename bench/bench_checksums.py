"""What a bundle's content checksums cost: save_bundle with them against the same save without
(checksums.record replaced by an empty record), and `verify_bundle` (every byte hashed) against
reading the same files and opening the bundle.

Setup, seeded: a Flat index of --n random unit vectors of --dim dimensions and items with
realistic paths, in a temporary folder. Each variant runs --repeat times; the table shows the
median wall time and the ratio against its peer from the same run. The page cache is warm
(the files were just written), as it is when a bundle is written and when serve starts after it.

Run from the repository root:
  python -m bench checksums                  # 200,000 x 256 (200 MB of vectors)
  python -m bench checksums --n 50000 --repeat 3
Results go to stdout (a markdown table), progress to stderr.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from bench import harness


def timed(run: Callable[[], Any], repeat: int) -> float:
    """Median seconds of `repeat` runs after one warm-up (harness.timed)."""
    return harness.timed(run, repeats=repeat, warmup=1)[0].median


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    import faiss

    from pactl.index import load_bundle, save_bundle, verify_bundle
    from pactl.store import checksums

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.n, args.dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(args.dim))
    index.add_with_ids(x, np.arange(args.n, dtype=np.int64))
    rows = [(i, f"/data/photos/c{i % 500}/img_{i:07d}.jpg", f"c{i % 500}") for i in range(args.n)]
    meta = {"fingerprint": "f" * 64, "factory": "Flat"}
    work = Path(tempfile.mkdtemp(prefix="pactl-bench-checksums-"))
    try:
        bundle = work / "b"
        print(f"saving {args.n:,} x {args.dim} ...", file=sys.stderr)
        with_sums = timed(lambda: save_bundle(bundle, index, rows, meta), args.repeat)
        empty = {"algorithm": checksums.ALGORITHM, "generation": "", "files": {}}
        with mock.patch.object(checksums, "record", lambda *a, **k: empty):
            without = timed(lambda: save_bundle(work / "plain", index, rows, meta), args.repeat)
        save_bundle(bundle, index, rows, meta)
        files = [f for f in bundle.iterdir() if f.is_file() and not f.name.startswith(".")]
        size = sum(f.stat().st_size for f in files if f.name != "meta.json")

        def read_and_open() -> None:
            for f in files:
                f.read_bytes()
            load_bundle(bundle)

        print("verifying ...", file=sys.stderr)
        verify = timed(lambda: verify_bundle(bundle), args.repeat)
        plain_read = timed(read_and_open, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mb = size / 1e6
    print(f"{args.n:,} items x {args.dim}-d, {mb:.0f} MB of files, median of {args.repeat}\n")
    print("| step | with checksums | peer | peer's time | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for step, mine, peer, theirs in (
        ("save_bundle", with_sums, "without checksums", without),
        ("verify_bundle", verify, "read the files + load_bundle", plain_read),
    ):
        print(f"| {step} | {mine:.2f} s | {peer} | {theirs:.2f} s | {mine / theirs:.2f}x |")


if __name__ == "__main__":
    main()
