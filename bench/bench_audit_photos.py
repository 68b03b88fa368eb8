"""The label-free audit (`pactl audit FOLDER`) on photo-sized JPEGs, stage by stage, beside
fastdup's published throughput.

    python -m bench audit photos --n 2000 --work /tmp/pactl-audit-photos [--seed 0]

The set: --n JPEGs of 640 x 480 (quality 90), nine in ten of them originals cut from real
photos available offline (scikit-image's sample photos and, where installed, the wallpapers of
Debian's gnome-backgrounds: `apt-get install -y gnome-backgrounds`; nothing is installed here):
a 4:3 window of 35 to 90% of a photo's width at a random place, mirrored at random, its
brightness, contrast, saturation and hue shifted, resized to 640 x 480. The other tenth are
planted copies of as many originals, made as audit makes its own (pactl.audit.copies
.changed_copy: resized, cropped to 80-95% of each side, re-encoded as JPEG at quality 30-70, or
all three; every copy a JPEG, at quality 90 where not re-encoded).

The audit runs in a fresh process (`python -m bench.bench_audit_photos probe`), as `pactl audit
FOLDER -f csv --top 0` runs it (pactl.cli, its default --workers), timing each stage by wall
and CPU seconds (this process's and its worker processes', which are reaped at each stage's
end), logging every image decode (PIL's ImageFile.load, in the worker processes too: spawn
imports this module there as the main one) and sampling the resident memory of the process and
its workers every 0.2 s. Reported: each stage's time and images (or pairs) per CPU second,
i.e. per core; how many times each image was decoded and at what size; the planted copies'
recall (a copy reported with its original) and the pairs reported that are not planted (with
whether the two windows overlap in one photo); and the figures at 1,000,000 and 10,000,000
images extrapolated linearly from this run (marked so), beside fastdup's published figure.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SIZE = (640, 480)
COPY_SHARE = 0.1  # of the set: planted copies
SKIMAGE_PHOTOS = (  # photos scikit-image ships (no download), none a copy of another
    "astronaut", "brick", "camera", "cat", "coffee", "coins", "grass", "gravel",
    "hubble_deep_field", "immunohistochemistry", "moon", "retina", "rocket", "horse", "clock",
)  # fmt: skip
GNOME = Path("/usr/share/backgrounds/gnome")
SOURCE_SIDE = 1600  # wallpapers are shrunk to this side first (they are 4096 px)
DECODE_LOG = "PACTL_BENCH_DECODE_LOG"  # where each process appends its decodes
STAGES_OUT = "PACTL_BENCH_STAGES"  # where the probe writes its stages (JSON)
FASTDUP = (
    "fastdup (its README, their published figure: another set, machine and check): "
    "11,582,724 images in 11,561 s on 32 cores, about 31 images/s a core"
)
FASTDUP_PER_CORE = 11_582_724 / 11_561 / 32


@dataclass(frozen=True)
class Window:
    """Where an original was cut from: its photo, the box (left, top, right, bottom) in that
    photo's pixels, and whether it was mirrored."""

    source: int
    box: tuple[int, int, int, int]
    mirrored: bool


def sources() -> list[Any]:
    """The photos the originals are cut from, RGB."""
    from PIL import Image
    from skimage import data

    photos = [Image.fromarray(getattr(data, n)()).convert("RGB") for n in SKIMAGE_PHOTOS]
    wallpapers = sorted(GNOME.glob("*.webp")) if GNOME.is_dir() else []
    if not wallpapers:
        print("no gnome-backgrounds: apt-get install -y gnome-backgrounds", file=sys.stderr)
    for path in wallpapers:
        image = Image.open(path).convert("RGB")
        if min(image.size) >= 480:  # the 256 px ones would only be blown up
            image.thumbnail((SOURCE_SIDE, SOURCE_SIDE))
            photos.append(image)
    return photos


def cut(photos: list[Any], rng: np.random.Generator) -> tuple[Any, Window]:
    """One original: a 4:3 window of a photo, mirrored at random, colour-shifted, 640 x 480."""
    from PIL import Image, ImageOps

    source = int(rng.integers(len(photos)))
    photo = photos[source]
    w, h = photo.size
    width = min(rng.uniform(0.35, 0.9) * w, h * 4 / 3)
    height = width * 3 / 4
    x, y = rng.uniform(0, w - width), rng.uniform(0, h - height)
    box = (round(x), round(y), round(x + width), round(y + height))
    image = photo.crop(box).resize(SIZE, Image.Resampling.BICUBIC)
    mirrored = bool(rng.random() < 0.5)
    if mirrored:
        image = ImageOps.mirror(image)
    return shifted(image, rng), Window(source, box, mirrored)


def shifted(image: Any, rng: np.random.Generator) -> Any:
    """Brightness, contrast and saturation times 0.7 to 1.3, hue turned by up to a tenth."""
    from PIL import Image, ImageEnhance

    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        image = enhance(image).enhance(float(rng.uniform(0.7, 1.3)))
    hsv = np.asarray(image.convert("HSV")).copy()
    hsv[..., 0] = (hsv[..., 0].astype(np.int16) + int(rng.integers(-25, 26))) % 256
    return Image.fromarray(hsv, "HSV").convert("RGB")


def write_set(work: Path, n: int, seed: int) -> tuple[Path, list[tuple[str, str, str]]]:
    """The folder of n JPEGs (work/photos) and the planted (copy, original, change) triples;
    windows.json: each original's Window."""
    from pactl.audit.copies import CHANGES, changed_copy

    rng = np.random.default_rng(seed)
    folder = work / "photos"
    if folder.is_dir() and any(folder.iterdir()):
        raise SystemExit(f"{folder} holds another set: name another --work")
    folder.mkdir(parents=True, exist_ok=True)
    photos = sources()
    copies = int(n * COPY_SHARE)
    windows: dict[str, Window] = {}
    for i in range(n - copies):
        image, windows[str(folder / f"{i:07d}.jpg")] = cut(photos, rng)
        image.save(folder / f"{i:07d}.jpg", quality=90)
    planted = []
    originals = list(windows)
    chosen = rng.choice(len(originals), size=copies, replace=False)
    for n_copy, o in enumerate(chosen.tolist()):
        from PIL import Image

        change = CHANGES[n_copy % len(CHANGES)]
        copy, suffix = changed_copy(Image.open(originals[o]), change, rng)
        quality = int(rng.integers(30, 71)) if suffix == ".jpg" else 90
        out = folder / f"c{n_copy:06d}.jpg"
        copy.save(out, quality=quality)
        planted.append((str(out), originals[o], change))
    (work / "windows.json").write_text(
        json.dumps({p: [w.source, list(w.box), w.mirrored] for p, w in windows.items()})
    )
    (work / "set.json").write_text(json.dumps({"n": n, "seed": seed, "planted": planted}))
    return folder, planted


def kept_set(work: Path, n: int, seed: int) -> tuple[Path, list[tuple[str, str, str]]] | None:
    """write_set's folder and planted copies where `work` holds them for this n and seed."""
    try:
        made = json.loads((work / "set.json").read_text())
    except (OSError, ValueError):
        return None
    if (made["n"], made["seed"]) != (n, seed):
        return None
    return work / "photos", [tuple(p) for p in made["planted"]]


# ---- the probe: the audit in a fresh process, measured ----------------------------------------


def log_decodes(path: str) -> None:
    """Append '<pid>\\t<file>\\t<width>\\t<height>' to `path` for each image PIL decodes in this
    process (the size decoded: draft mode's, where it shrank a JPEG)."""
    from PIL import ImageFile

    load = ImageFile.ImageFile.load

    def counted_load(self: Any) -> Any:
        decoding = bool(self.tile)  # load() of a decoded image decodes nothing
        name = getattr(self.fp, "name", None) or self.filename
        if isinstance(name, int):  # pactl opens images by descriptor (never a FIFO)
            name = os.readlink(f"/proc/self/fd/{name}")
        pixels = load(self)
        if decoding:
            line = f"{os.getpid()}\t{name}\t{self.size[0]}\t{self.size[1]}\n"
            with open(path, "a") as f:
                f.write(line)
        return pixels

    ImageFile.ImageFile.load = counted_load  # type: ignore[method-assign]


def cpu_seconds() -> float:
    """User and system seconds of this process and of its children reaped so far."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class Stages:
    """Each stage's (name, wall seconds, CPU seconds, items), in the order they ended."""

    done: list[tuple[str, float, float, int]]

    @contextmanager
    def timed(self, name: str, items: int) -> Iterator[None]:
        wall, cpu = time.perf_counter(), cpu_seconds()
        try:
            yield
        finally:
            self.done.append((name, time.perf_counter() - wall, cpu_seconds() - cpu, items))

    def wrap(self, module: Any, name: str, items: Callable[..., int]) -> None:
        """Time every call of `module.name` as a stage of that name."""
        inner = getattr(module, name)

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            with self.timed(name, items(*args, **kwargs)):
                return inner(*args, **kwargs)

        setattr(module, name, timed_call)

    def wrap_bars(self) -> None:
        """Time every progress bar of pactl's Reporter as a stage named by its description."""
        from pactl.console import Reporter

        bar = Reporter.bar

        @contextmanager
        def timed_bar(reporter: Any, description: str, total: int | None) -> Iterator[Any]:
            with self.timed(description, total or 0), bar(reporter, description, total) as a:
                yield a

        Reporter.bar = timed_bar  # type: ignore[method-assign,assignment]


class PeakMemory:
    """The most resident memory this process and its children held at once, sampled."""

    def __init__(self, every: float = 0.2) -> None:
        self.peak, self.every, self.stop = 0, every, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        while not self.stop.wait(self.every):
            self.peak = max(self.peak, tree_rss(os.getpid()))

    def close(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and its children (one level: the audit's worker processes)."""
    from bench.harness import status_bytes

    total = status_bytes("VmRSS", pid) or 0
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return total + sum(status_bytes("VmRSS", c) or 0 for c in children)


def probe(argv: list[str]) -> None:
    """`pactl audit` with argv, its stages timed into $PACTL_BENCH_STAGES."""
    from pactl.audit import copies
    from pactl.cli import app
    from pactl.verbs import audit_folder

    stages = Stages([])
    stages.wrap_bars()
    stages.wrap(audit_folder, "outliers", lambda thumbs, *a, **k: len(thumbs))
    stages.wrap(copies, "propose", lambda data, *a, **k: len(data))
    stages.wrap(copies, "made_copies", lambda *a, **k: copies.COPY_SAMPLE)
    memory = PeakMemory()
    with stages.timed("whole audit", 0):
        try:
            app(argv, standalone_mode=False)
        finally:
            peak = memory.close()
    record = {
        "stages": stages.done,
        "peak_tree_bytes": peak,
        "main_peak_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
        "largest_worker_peak_bytes": int(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        * 1024,
    }
    Path(os.environ[STAGES_OUT]).write_text(json.dumps(record))


if os.environ.get(DECODE_LOG):  # the probe and, imported by spawn as their main, its workers
    log_decodes(os.environ[DECODE_LOG])


# ---- the bench: the set written, the probe run, its figures ------------------------------------


@dataclass(frozen=True)
class Measured:
    """What the probe recorded, the decode log's lines and the audit's CSV rows."""

    record: dict[str, Any]
    decodes: list[tuple[str, int, int]]  # file, width, height decoded
    rows: list[dict[str, str]]
    wall: float


def run_probe(folder: Path, work: Path) -> Measured:
    """The audit of `folder` in a fresh process, measured (stderr passed through)."""
    log, stages = work / "decodes.tsv", work / "stages.json"
    log.unlink(missing_ok=True)
    env = {**os.environ, DECODE_LOG: str(log), STAGES_OUT: str(stages)}
    command = [sys.executable, "-m", "bench.bench_audit_photos", "probe", "audit", str(folder),
               "-f", "csv", "--top", "0"]  # fmt: skip
    began = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=True)
    wall = time.perf_counter() - began
    decodes = []
    for line in log.read_text().splitlines() if log.is_file() else []:
        _, name, width, height = line.split("\t")
        decodes.append((name, int(width), int(height)))
    rows = list(csv.DictReader(done.stdout.splitlines()))
    return Measured(json.loads(stages.read_text()), decodes, rows, wall)


def stage_table(measured: Measured) -> list[str]:
    """The stages as a markdown table: wall, CPU, items per CPU second (per core)."""
    lines = ["| stage | items | wall s | CPU s | items / CPU s (a core) |",
             "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, wall, cpu, items in measured.record["stages"]:
        rate = f"{items / cpu:,.1f}" if items and cpu > 0 else ""
        lines.append(f"| {name} | {items:,} | {wall:.1f} | {cpu:.1f} | {rate} |")
    return lines


def decode_lines(measured: Measured, folder: Path) -> list[str]:
    """How many times each image of the set was decoded, and at which sizes."""
    inside = [(n, w, h) for n, w, h in measured.decodes if n.startswith(str(folder))]
    per_file = Counter(n for n, _, _ in inside)
    times = Counter(per_file.values())
    sizes = Counter(f"{w}x{h}" for _, w, h in inside)
    files = len(list(folder.glob("*.jpg")))
    return [
        f"decodes of the set's {files:,} images: {len(inside):,}; images decoded once: "
        f"{times.get(1, 0):,}, more than once: {sum(v for k, v in times.items() if k > 1):,} "
        f"(times: {dict(sorted(times.items()))}), never: {files - len(per_file):,}",
        f"  sizes decoded (most common): {sizes.most_common(6)}",
        f"decodes of other files (the copies audit makes to calibrate): "
        f"{len(measured.decodes) - len(inside):,}",
    ]


def overlapping(a: list[Any], b: list[Any]) -> bool:
    """Whether two windows (source, box, mirrored) cut one photo where they overlap."""
    if a[0] != b[0]:
        return False
    (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = a[1], b[1]
    return min(ax1, bx1) > max(ax0, bx0) and min(ay1, by1) > max(ay0, by0)


def pair_lines(measured: Measured, planted: list[tuple[str, str, str]], work: Path) -> list[str]:
    """The planted copies' recall (by change) and the pairs reported that are not planted."""
    windows = json.loads((work / "windows.json").read_text())
    found = {frozenset((r["path"], r["other"])) for r in measured.rows if r["kind"] == "copy"}
    truth = {frozenset((c, o)): change for c, o, change in planted}
    lines = [f"planted copies: {len(truth):,}; copy pairs reported: {len(found):,}; recall "
             f"{len(found & truth.keys()) / max(len(truth), 1):.4f}"]  # fmt: skip
    for change in sorted(set(truth.values())):
        kind = {p for p, c in truth.items() if c == change}
        lines.append(f"  {change}: {len(found & kind) / max(len(kind), 1):.4f} of {len(kind)}")
    false = found - truth.keys()
    overlap = sum(
        all(p in windows for p in pair) and overlapping(*(windows[p] for p in pair))
        for pair in false
    )
    lines.append(
        f"reported pairs not planted: {len(false):,} ({len(false) / max(len(found), 1):.4f} of "
        f"those reported); of them two windows overlapping in one photo: {overlap:,}"
    )
    return lines


def scale_lines(measured: Measured, n: int) -> list[str]:
    """Throughput per core, and the stages that grow with the set at 1,000,000 and 10,000,000
    images, extrapolated from this run (CPU seconds): reading linearly, the crop boxes up to
    CROP_ITEMS images, the alignment as many pairs an image up to ALIGN_MOST, the calibration
    (a fixed COPY_SAMPLE) as it was. The rest (start-up, outliers, the whole descriptors'
    index) is left out: a lower bound."""
    from pactl.audit.copies import ALIGN_MOST, CROP_ITEMS

    record = measured.record
    first: dict[str, tuple[float, float, int]] = {}
    for name, wall, cpu, items in record["stages"]:
        first.setdefault(name, (wall, cpu, items))  # the set's reading, not the calibration's
    whole_wall, whole_cpu, _ = first["whole audit"]
    read_cpu = first["reading thumbnails"][1]
    _, align_cpu, pairs = first.get("aligning candidate pairs", (0.0, 0.0, 0))
    made_cpu = first["made_copies"][1]
    boxes_cpu = first.get("looking in crop boxes", (0.0, 0.0, 0))[1]
    lines = [
        f"decode + thumbnail: {n / read_cpu:,.1f} images/s a core (CPU time); alignment: "
        f"{pairs / max(align_cpu, 1e-9):,.1f} pairs/s a core ({pairs:,} pairs); the whole audit: "
        f"{n / whole_cpu:,.1f} images/s a core, {whole_wall:.1f} s wall, {whole_cpu:.1f} s CPU",
        f"peak memory: the audit's processes together {record['peak_tree_bytes'] / 2**30:.2f} "
        f"GiB (sampled every 0.2 s); its main process {record['main_peak_bytes'] / 2**30:.2f} "
        f"GiB; the largest worker {record['largest_worker_peak_bytes'] / 2**30:.2f} GiB",
        FASTDUP + f" ({FASTDUP_PER_CORE:.1f})",
    ]
    for big in (1_000_000, 10_000_000):
        read, boxes = read_cpu * big / n, boxes_cpu * min(big, CROP_ITEMS) / n
        aligned = min(pairs * big / n, ALIGN_MOST)
        align = align_cpu / max(pairs, 1) * aligned
        cpu = read + boxes + align + made_cpu
        lines.append(
            f"EXTRAPOLATED to {big:,} images: decode + thumbnail {read / 60:,.0f} CPU min, crop "
            f"boxes {boxes / 60:,.0f}, alignment of {aligned:,.0f} pairs {align / 60:,.0f}, "
            f"calibration {made_cpu / 60:.1f}: at least {cpu / 60:,.0f} CPU min, "
            f"{cpu / 2 / 60:,.0f} min on 2 cores, {big / cpu:.1f} images/s a core"
        )
    return lines


def photos_mode(work: Path, n: int, seed: int) -> None:
    """The set written (kept where work holds the one of this n and seed), audited, reported."""
    work = work.absolute()
    began = time.perf_counter()
    folder, planted = kept_set(work, n, seed) or write_set(work, n, seed)
    print(f"{n:,} photo-sized JPEGs ({len(planted):,} planted copies) written in "
          f"{time.perf_counter() - began:.1f} s to {folder}", flush=True)  # fmt: skip
    measured = run_probe(folder, work)
    for line in [*stage_table(measured), *decode_lines(measured, folder),
                 *pair_lines(measured, planted, work), *scale_lines(measured, n)]:  # fmt: skip
        print(line)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["probe"]:
        probe(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--work", type=Path, default=Path("/tmp/pactl-audit-photos"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    photos_mode(args.work, args.n, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
