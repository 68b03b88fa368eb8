"""Opening a bundle of 1,000,000 items: items.csv parsed (older bundles) against items.bin mapped.

Target: the lean table opens a bundle at least 5x faster and with at least 5x less memory than
parsing items.csv.

Setup, seeded and cached in --workdir between runs: a bundle of --n items with realistic paths
(/data/photos/<class>/<name>_NNNNNNN.jpg over --classes classes, the class as label, sizes and
modification times) and a Flat index of --dim-d random unit vectors (ids 0..n-1, as `pactl
embed` numbers them), written by save_bundle (items.csv and items.bin); and a copy of it as a
bundle of an older pactl, items.bin and its record in meta.json removed, so items.csv is parsed.

Each measurement runs in a fresh Python process that imports pactl.index, then times
load_bundle (or the item table alone: ItemTable.read of items.csv against ItemTable.open of
items.bin) and reads its memory from /proc/self/status: the growth of VmHWM (peak resident set)
over what the imports took, and of RssAnon (heap) and RssFile (mapped files, page cache). Not
ru_maxrss: a child started by vfork inherits its parent's peak. Then it answers one query's
worth of rows (10 paths and labels by id) and checks them against the rule the paths were made
by. Each variant runs --repeat times; the table shows the median time (wall clock, and the
process's CPU time, steadier on a shared machine) and the largest memory.

Run from the repository root:
  python -m bench items                 # 1,000,000 items
  python -m bench items --n 100000 --repeat 3
Results go to stdout (a markdown table), progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

NAMES = ("IMG", "DSC", "photo", "P", "shot")
PAGE = 4096  # /proc/self/status counts whole pages

CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from pactl.index import ItemTable, load_bundle

def status():
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out

folder, what, form = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
if form == "ref":  # another pactl's item table (its items.py), read from items.csv
    import importlib.util
    import pactl.index.bundle
    spec = importlib.util.spec_from_file_location("reference_items", sys.argv[4])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ItemTable = pactl.index.bundle.ItemTable = module.ItemTable
before = status()
start, cpu = time.perf_counter(), time.process_time()
if what == "bundle":
    items = load_bundle(folder).items
elif form in ("csv", "ref"):
    items = ItemTable.read(folder / "items.csv")
else:
    items = ItemTable.open(folder / "items.bin")
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
after = status()
ids = np.arange(0, len(items), max(1, len(items) // 10))[:10]
rows = [(items.paths[p], items.labels[p]) for p in items.positions(ids).tolist()]
print(json.dumps({
    "seconds": seconds,
    "cpu": cpu,
    **{k: after[k] - before[k] for k in after},
    "rows": [[int(i), p, lab] for i, (p, lab) in zip(ids.tolist(), rows)],
}))
"""


def item_path(i: int, classes: int) -> tuple[str, str]:
    label = f"class_{i % classes:04d}"
    return f"/data/photos/{label}/{NAMES[i % len(NAMES)]}_{i:07d}.jpg", label


def build(workdir: Path, n: int, classes: int, dim: int) -> tuple[Path, Path]:
    """The bundle (items.bin) and its older-pactl copy (items.csv only), made once."""
    import faiss

    from pactl.index import save_bundle
    from pactl.store.generations import current_dir

    lean, old = workdir / f"lean-{n}-{classes}-{dim}", workdir / f"old-{n}-{classes}-{dim}"
    if lean.is_dir() and old.is_dir():
        return lean, old
    shutil.rmtree(lean, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    rng = np.random.default_rng(0)
    log(f"building a bundle of {n:,} items in {lean}")
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(dim)
    index.add(vectors)
    sizes = rng.integers(20_000, 8_000_000, n).tolist()
    mtimes = (1_700_000_000 * 10**9 + rng.integers(0, 10**17, n)).tolist()
    rows = [(i, *item_path(i, classes), sizes[i], mtimes[i]) for i in range(n)]
    save_bundle(lean, index, rows, {})
    shutil.copytree(lean, old, symlinks=True)
    gen = current_dir(old)
    meta = json.loads((gen / "meta.json").read_text())
    del meta["files"]["items.bin"]
    (gen / "items.bin").unlink()
    (old / "items.bin").unlink()
    (gen / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return lean, old


def measure(
    folder: Path, what: str, form: str, classes: int, reference: Path | None
) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), what, form, str(reference)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    for i, path, label in result.pop("rows"):
        if (path, label) != item_path(i, classes):
            raise SystemExit(f"{folder} ({form}): item {i} reads back as {path!r}, {label!r}")
    return result


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=8, help="vector size of the Flat index")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--reference",
        type=Path,
        help="an items.py of another pactl version: its items.csv reader is measured too",
    )
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "pactl-items")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    lean, old = build(args.workdir, args.n, args.classes, args.dim)
    sizes = {name: (lean / name).stat().st_size for name in ("items.csv", "items.bin")}
    mib = {name: f"{size / 2**20:.1f} MiB" for name, size in sizes.items()}
    print(f"{args.n:,} items, {args.classes:,} labels, Flat index of {args.dim}-d vectors;")
    print(f"items.csv {mib['items.csv']}, items.bin {mib['items.bin']}\n")
    forms = {"ref": old, "csv": old, "bin": lean} if args.reference else {"csv": old, "bin": lean}
    heads = ["what", "items.csv, reference reader", "items.csv", "items.bin", "csv/bin"]
    heads += ["reference/bin"]
    print("| " + " | ".join(heads if args.reference else heads[:1] + heads[2:5]) + " |")
    print("| --- " + "| ---: " * (len(forms) * 2 - 1) + "|")
    for what in ("bundle", "table"):
        runs: dict[str, list[dict[str, Any]]] = {form: [] for form in forms}
        for r in range(args.repeat):
            for form, folder in forms.items():
                log(f"{what} from {form}, run {r + 1}/{args.repeat}")
                runs[form].append(measure(folder, what, form, args.classes, args.reference))
        name = "load_bundle" if what == "bundle" else "item table alone"
        for key, text in (("seconds", "open time"), ("cpu", "open CPU time")):
            seconds = {f: statistics.median(x[key] for x in runs[f]) for f in runs}
            print(row(f"{name}: {text} (median)", seconds, lambda v: f"{v * 1000:,.1f} ms"))
        for key, text in (("VmHWM", "peak RSS growth"), ("RssAnon", "heap growth")):
            peak = {f: max(x[key] for x in runs[f]) for f in runs}
            print(row(f"{name}: {text} (max)", peak, lambda v: f"{v / 2**20:,.1f} MiB", PAGE))


def row(name: str, values: dict[str, float], show: Any, floor: float = 1e-9) -> str:
    """A table row: each value, then each CSV reader's ratio to items.bin; a value under
    `floor` (a page, for memory) counts as `floor`, and its ratios are lower bounds."""
    low = values["bin"] < floor
    cells = [show(v) for v in values.values()]
    for form in ("csv", "ref"):
        if form in values:
            ratio = values[form] / max(values["bin"], floor)
            cells.append(f"at least {ratio:,.0f}x" if low else f"{ratio:,.1f}x")
    return f"| {name} | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    main()
