"""`pactl dedup` on real photos: Debian's wallpapers, copied, mixed into other images.

    python -m bench wallpapers                    # ~300 images, a few minutes on 2 cores
    python -m bench wallpapers --copies 5 --calib-groups 10 --seed 1

The originals: the wallpapers of the Debian packages in PACKAGES (installed with apt-get when
/usr/share/wallpapers is missing, which needs root; the script says so), the largest file of each
Plasma wallpaper and the light variant of each GNOME one (the dark variants are left out: they
are the same design recoloured), each saved at most MAX_SIDE pixels on its longest side. Every
copied original gets --copies seeded copies, each one or more of: resized (0.25 to 0.7 of its
side), cropped (0.6 to 0.9 of each side, anywhere), recompressed as JPEG (quality 15 to 45),
colour-shifted (brightness, contrast, saturation 0.7 to 1.3, a hue turn of up to 0.05). A copy
group is an original with its copies.

The originals are shuffled with --seed: --calib-groups of them are copied into a calibration
folder, --test-groups into a test folder, and the rest of the wallpapers go uncopied into the
test folder, with scikit-image's sample photos split between the two folders (distinct
distractors: singletons). Both folders are embedded by `pactl embed --backbone
timm:efficientnet_lite0 --weights imagenet` (offline ImageNet weights, `pactl[lite0]`); the
threshold is calibrated (pactl.calibrate, --precision) on the calibration folder's labelled
pairs only, and `pactl dedup --threshold` runs at it on the test folder.

Reported: copy groups recovered whole (every member in one dedup group), partly (two or more
together, not all), missed (no two together); false merges (pairs of different originals in one
dedup group); pair precision and recall over all pairs of the test folder (a pair is found when
dedup puts both in one group, true when both are of one copy group); wall time of the embeds and
the dedup. imagededup's published UKBench figure for its CNN is printed beside it: their figure,
on another set. Table to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageEnhance

ROOT = Path(__file__).resolve().parents[1]

if TYPE_CHECKING:
    from pactl.calibrate import Calibration

PACKAGES = ("gnome-backgrounds", "plasma-workspace-wallpapers")
PLASMA = Path("/usr/share/wallpapers")
GNOME = Path("/usr/share/backgrounds/gnome")
MAX_SIDE = 1600
SKIMAGE_PHOTOS = (  # colour or grey photos, none a copy of another (motorcycle_right left out)
    "astronaut", "brick", "camera", "cat", "cell", "coffee", "coins", "colorwheel", "grass",
    "gravel", "hubble_deep_field", "immunohistochemistry", "logo", "microaneurysms", "moon",
    "page", "retina", "rocket", "text", "horse", "clock",
)  # fmt: skip
IMAGEDEDUP_UKBENCH = "imagededup CNN on UKBench (their published figure, another set): " \
    "precision 0.995 at recall 0.127, threshold 0.9"  # fmt: skip
BACKBONE = "timm:efficientnet_lite0"
PACTL = [sys.executable, "-m", "pactl"]


@dataclass(frozen=True)
class Original:
    name: str
    image: Image.Image


def ensure_wallpapers() -> None:
    """Install PACKAGES with apt-get when the wallpapers are missing (says so on stderr)."""
    if PLASMA.is_dir() and GNOME.is_dir():
        return
    print(f"installing {' '.join(PACKAGES)} with apt-get (needs root)", file=sys.stderr)
    subprocess.run(["apt-get", "install", "-y", *PACKAGES], check=True, stdout=sys.stderr)


def wallpaper_files() -> list[tuple[str, Path]]:
    """(name, file): the largest image of each Plasma wallpaper, GNOME's light variants."""
    found: list[tuple[str, Path]] = []
    for folder in sorted(p for p in PLASMA.iterdir() if (p / "contents/images").is_dir()):
        files = [f for f in (folder / "contents/images").iterdir() if "x" in f.stem]
        if files:
            largest = max(files, key=lambda f: _pixels(f.stem))
            found.append((f"plasma-{folder.name}", largest))
    for file in sorted(GNOME.glob("*-l.webp")):
        found.append((f"gnome-{file.stem[:-2]}", file))
    return found


def _pixels(stem: str) -> int:
    width, _, height = stem.partition("x")
    return int(width) * int(height) if width.isdigit() and height.isdigit() else 0


def load(file: Path) -> Image.Image:
    image = Image.open(file).convert("RGB")
    image.thumbnail((MAX_SIDE, MAX_SIDE))
    return image


def skimage_photos() -> list[Original]:
    from skimage import data

    photos = []
    for name in SKIMAGE_PHOTOS:
        array = getattr(data, name)()
        photos.append(Original(f"skimage-{name}", Image.fromarray(array).convert("RGB")))
    return photos


def make_copy(image: Image.Image, rng: random.Random, kinds: list[str]) -> tuple[Image.Image, int]:
    """A copy of `image` through the given kinds of change; returns it and a JPEG quality
    (0: saved at quality 95)."""
    out, quality = image, 0
    if "crop" in kinds:
        w, h = out.size
        cw, ch = int(w * rng.uniform(0.6, 0.9)), int(h * rng.uniform(0.6, 0.9))
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        out = out.crop((x, y, x + cw, y + ch))
    if "resize" in kinds:
        scale = rng.uniform(0.25, 0.7)
        out = out.resize((max(32, int(out.width * scale)), max(32, int(out.height * scale))))
    if "colour" in kinds:
        for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
            out = enhance(out).enhance(rng.uniform(0.7, 1.3))
        hsv = np.asarray(out.convert("HSV")).copy()
        hsv[..., 0] = (hsv[..., 0].astype(np.int16) + int(rng.uniform(-0.05, 0.05) * 255)) % 256
        out = Image.fromarray(hsv, "HSV").convert("RGB")
    if "jpeg" in kinds:
        quality = rng.randint(15, 45)
    return out, quality


COPY_KINDS = (["resize"], ["crop"], ["jpeg"], ["colour"], ["crop", "resize", "jpeg", "colour"])


def save(image: Image.Image, path: Path, quality: int) -> None:
    if quality:
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=quality)
        path.write_bytes(buffer.getvalue())
    else:
        image.save(path, "PNG" if path.suffix == ".png" else "JPEG", quality=95)


def write_group(original: Original, folder: Path, copies: int, rng: random.Random) -> list[str]:
    """The original and its copies in `folder`; returns their file names."""
    names = [f"{original.name}.jpg"]
    save(original.image, folder / names[0], 0)
    for k in range(copies):
        kinds = COPY_KINDS[k % len(COPY_KINDS)]
        if k >= len(COPY_KINDS):  # beyond the five: random mixes
            kinds = rng.sample(["resize", "crop", "jpeg", "colour"], rng.randint(2, 4))
        image, quality = make_copy(original.image, rng, kinds)
        names.append(f"{original.name}~copy{k}-{'+'.join(kinds)}.jpg")
        save(image, folder / names[-1], quality)
    return names


def build_sets(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """Write work/calib and work/test; returns {folder: {file name: family}}."""
    rng = random.Random(args.seed)
    walls = wallpaper_files()
    rng.shuffle(walls)
    photos = skimage_photos()
    rng.shuffle(photos)
    need = args.calib_groups + args.test_groups
    if len(walls) < need:
        raise SystemExit(f"error: {len(walls)} wallpapers found, {need} asked for")
    families: dict[str, dict[str, str]] = {"calib": {}, "test": {}}
    plan = [("calib", w, True) for w in walls[: args.calib_groups]]
    plan += [("test", w, True) for w in walls[args.calib_groups : need]]
    plan += [("test", w, False) for w in walls[need:]]
    for where, (name, file), copied in plan:
        folder = args.work / where
        folder.mkdir(parents=True, exist_ok=True)
        original = Original(name, load(file))
        for written in write_group(original, folder, args.copies if copied else 0, rng):
            families[where][written] = name
    half = len(photos) // 3  # a third of the photos calibrate, two thirds are test distractors
    for where, part in (("calib", photos[:half]), ("test", photos[half:])):
        for photo in part:
            save(photo.image, args.work / where / f"{photo.name}.jpg", 0)
            families[where][f"{photo.name}.jpg"] = photo.name
    print(f"wrote {len(families['calib'])} calibration and {len(families['test'])} test images"
          f" ({len(walls)} wallpapers, {len(photos)} sample photos)", file=sys.stderr)  # fmt: skip
    return families


def embed(folder: Path, out: Path, threads: int) -> float:
    began = time.perf_counter()
    command = [*PACTL, "embed", str(folder), "--backbone", BACKBONE, "--weights", "imagenet",
               "--out", str(out), "--device", "cpu", "--batch-size", "32"]  # fmt: skip
    subprocess.run(command, check=True, stdout=sys.stderr, env=_env(threads))
    return time.perf_counter() - began


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def calibrate_on(vectors_dir: Path, families: dict[str, str], precision: float) -> Calibration:
    from pactl.calibrate import CalibrationConfig, calibrate
    from pactl.embed import read_embedded

    vectors, items, _ = read_embedded(vectors_dir)
    labels = np.array([families[Path(p).name] for p in items.paths.tolist()])
    return calibrate(np.asarray(vectors), labels, CalibrationConfig(precision), split="calib")


def dedup(
    vectors_dir: Path, threshold: float, strict: bool, threads: int
) -> tuple[dict[str, int], float]:
    """{file name: dedup group} of the grouped files, and the wall time of `pactl dedup`."""
    began = time.perf_counter()
    command = [*PACTL, "dedup", str(vectors_dir), "--threshold", repr(threshold),
               "--format", "csv", *(["--strict"] if strict else [])]  # fmt: skip
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True, env=_env(threads))
    seconds = time.perf_counter() - began
    rows = csv.DictReader(io.StringIO(done.stdout))
    return {Path(r["path"]).name: int(r["group"]) for r in rows}, seconds


@dataclass(frozen=True)
class Scores:
    whole: int  # copy groups all in one dedup group
    partly: int  # two or more members together, not all
    missed: int  # no two members together
    false_merges: int  # pairs of different originals in one dedup group
    precision: float  # of the pairs dedup put together, the share of one copy group
    recall: float  # of the pairs of one copy group, the share dedup put together
    found_pairs: int
    true_pairs: int


@dataclass(frozen=True)
class Ungrouped:
    precision: float  # of the test pairs at or above the threshold, the share of one copy group
    recall: float  # of the copy pairs, the share at or above the threshold
    by_kind: dict[str, float]  # per kind of copy: the share at or above it with its original


def pairs_at(vectors_dir: Path, families: dict[str, str], threshold: float) -> Ungrouped:
    """The pairs scoring at or above the threshold, without grouping (exact cosines in
    float64): how the calibration carries over to the test images, kind of copy by kind."""
    from pactl.embed import read_embedded

    vectors, items, _ = read_embedded(vectors_dir)
    x = np.asarray(vectors, dtype=np.float64)
    names = [Path(p).name for p in items.paths.tolist()]
    labels = np.array([families[n] for n in names])
    upper = np.triu(np.ones((len(x), len(x)), dtype=bool), k=1)
    cosine = x @ x.T
    above = (cosine >= threshold) & upper
    same = (labels[:, None] == labels[None, :]) & upper
    both = int((above & same).sum())
    row = {n: i for i, n in enumerate(names)}
    kinds: dict[str, list[bool]] = defaultdict(list)
    for name, i in row.items():
        if "~copy" in name:
            kind = name.rsplit("-", 1)[-1].removesuffix(".jpg")
            kind = kind if "+" not in kind else f"{kind.count('+') + 1} changes"
            kinds[kind].append(bool(cosine[i, row[f"{families[name]}.jpg"]] >= threshold))
    by_kind = {k: sum(v) / len(v) for k, v in sorted(kinds.items())}
    return Ungrouped(both / max(int(above.sum()), 1), both / max(int(same.sum()), 1), by_kind)


def score(families: dict[str, str], groups: dict[str, int]) -> Scores:
    """Dedup's groups against the copy groups, pair by pair over every pair of the folder."""
    members: dict[str, list[str]] = defaultdict(list)
    for name, family in families.items():
        members[family].append(name)
    whole = partly = missed = 0
    for names in members.values():
        if len(names) < 2:
            continue
        placed = [groups.get(n, -1 - i) for i, n in enumerate(names)]  # ungrouped: unique
        biggest = max(placed.count(g) for g in placed)
        if biggest == len(names):
            whole += 1
        elif biggest >= 2:
            partly += 1
        else:
            missed += 1
    true_pairs = found = both = 0
    for a, b in combinations(sorted(families), 2):
        same = families[a] == families[b]
        together = a in groups and groups.get(b) == groups[a]
        true_pairs += same
        found += together
        both += same and together
    return Scores(whole, partly, missed, found - both,
                  both / found if found else float("nan"),
                  both / true_pairs if true_pairs else float("nan"), found, true_pairs)  # fmt: skip


def report(args: argparse.Namespace, cal: Calibration, run: Run) -> None:
    print(f"images: calibration {run.calib_images}, test {run.test_images} "
          f"({args.test_groups} copy groups of {args.copies + 1}, the rest distinct); "
          f"{BACKBONE}, offline ImageNet weights")  # fmt: skip
    assert cal.threshold is not None
    print(
        f"threshold {cal.threshold:.4f} calibrated at precision {cal.precision} on the "
        f"calibration images ({cal.classes} originals, {args.calib_groups} copied; "
        f"{cal.pairs:,} pairs; there precision {cal.measured:.4f}, recall {cal.recall:.4f})"
    )
    print(f"test pairs at or above it, ungrouped: precision {run.raw.precision:.4f}, "
          f"recall {run.raw.recall:.4f}")  # fmt: skip
    kinds = ", ".join(f"{k} {v:.2f}" for k, v in run.raw.by_kind.items())
    print(f"copies at or above it with their original, by kind: {kinds}")
    print("mode       whole partly missed false-merges pair-precision pair-recall dedup-s")
    for mode, (scores, seconds) in run.modes.items():
        print(f"{mode:<10} {scores.whole:>5} {scores.partly:>6} {scores.missed:>6} "
              f"{scores.false_merges:>12} {scores.precision:>14.4f} {scores.recall:>11.4f} "
              f"{seconds:>7.1f}")  # fmt: skip
    print(
        f"wall time: embed {run.embed_seconds:.1f} s (both folders), total "
        f"{run.total_seconds:.1f} s"
    )
    print(IMAGEDEDUP_UKBENCH)


@dataclass(frozen=True)
class Run:
    calib_images: int
    test_images: int
    raw: Ungrouped  # the test pairs at the threshold before grouping
    modes: dict[str, tuple[Scores, float]]  # connected / strict: scores, dedup seconds
    embed_seconds: float
    total_seconds: float


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=7, help="copies of each copied original")
    parser.add_argument("--calib-groups", type=int, default=12)
    parser.add_argument("--test-groups", type=int, default=20)
    parser.add_argument("--precision", type=float, default=0.99)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/pactl-bench-wallpapers"))
    args = parser.parse_args(argv)
    began = time.perf_counter()
    ensure_wallpapers()
    if args.work.exists():
        shutil.rmtree(args.work)
    families = build_sets(args)
    calib, test = args.work / "calib-vectors", args.work / "test-vectors"
    embed_s = embed(args.work / "calib", calib, args.threads)
    embed_s += embed(args.work / "test", test, args.threads)
    cal = calibrate_on(calib, families["calib"], args.precision)
    if cal.threshold is None:
        raise SystemExit(f"error: no threshold reaches precision {args.precision}")
    modes = {}
    for mode, strict in (("connected", False), ("strict", True)):
        groups, seconds = dedup(test, cal.threshold, strict, args.threads)
        modes[mode] = (score(families["test"], groups), seconds)
    (args.work / "families.json").write_text(json.dumps(families, indent=1))
    run = Run(len(families["calib"]), len(families["test"]),
              pairs_at(test, families["test"], cal.threshold), modes, embed_s,
              time.perf_counter() - began)  # fmt: skip
    report(args, cal, run)


if __name__ == "__main__":
    main()
