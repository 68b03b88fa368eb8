"""Two real-image retrieval sets as pactl dataset folders, built offline from Debian packages.

    python -m tools.real_sets fonts /tmp/pactl-real/fonts        # glyphs drawn by many fonts
    python -m tools.real_sets fashion /tmp/pactl-real/fashion    # Fashion-MNIST, 600 per class
    python -m tools.real_sets fonts OUT --max-fonts 40 --min-fonts 24 --size 64 --overwrite
    python -m tools.real_sets fashion OUT --per-class 1000 --seed 1 --overwrite

fonts: a class is one character (Latin, digits, punctuation, Latin-1, Greek, Cyrillic), an image
is that character drawn by one font file of the Debian font packages in FONT_PACKAGES (installed
with apt-get when missing, which needs root). A font takes part when its cmap covers every ASCII
letter and digit; fonts whose drawings nearly equal a font already taken (metric clones such as
Liberation 2 and Arimo) are left out, and families take turns so that no large family fills the
set. A character is drawn only by the fonts whose cmap maps it and whose drawing is neither blank
nor the font's .notdef box; characters drawn identically to an earlier character by most fonts
(Latin A, Greek Alpha, Cyrillic A) keep only the earlier one; a character needs --min-fonts
drawings. Glyphs are black on white, the ink centred horizontally, the baseline on a fixed row
(so ',' and an apostrophe differ, and so do 'o' and 'O'). fonts.csv lists the fonts taken.

fashion: Fashion-MNIST's idx files from the Debian package dataset-fashion-mnist (installed when
missing); --per-class images of each class drawn without replacement from the 70,000 of the
train and t10k files together, written as 28x28 grayscale PNGs. Classes 0-4 train, 5-9 test.

Both are deterministic for a given --seed and set of packages. The class split is disjoint:
fonts shuffles the kept characters with the seed and gives the first half to train. A folder is
replaced (--overwrite) only when it holds this script's marker file. Counts go to stdout,
progress to stderr.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import random
import shutil
import subprocess
import sys
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from pactl.datasets.manifest import write_manifest

MARKER = ".pactl-real-set"
Row = tuple[str, int, str, str]  # path, label, split, class_name

FONT_PACKAGES = (
    "fonts-dejavu-core",
    "fonts-dejavu-extra",
    "fonts-liberation",
    "fonts-freefont-ttf",
    "fonts-noto-core",
    "fonts-crosextra-carlito",
    "fonts-crosextra-caladea",
    "fonts-urw-base35",
    "fonts-croscore",
    "fonts-open-sans",
    "fonts-linuxlibertine",
    "fonts-texgyre",
    "fonts-ebgaramond",
    "fonts-paratype",
    "fonts-cantarell",
    "fonts-comfortaa",
    "fonts-quicksand",
    "fonts-lato",
)
FONT_SUFFIXES = (".ttf", ".otf")
REQUIRED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
PROBE = "AaGgQRekfy&3@"  # drawn to tell near-identical fonts apart
CLONE_DIFF = 0.02  # mean |difference| of probe drawings (0..1) below which a font is a clone
MISSING = "\U0010fffd"  # a private-use codepoint no font maps: draws .notdef
EM = 0.55  # font size as a fraction of the canvas side
BASELINE = 0.70  # baseline row as a fraction of the canvas side

FASHION_PACKAGE = "dataset-fashion-mnist"
FASHION_FILES = (
    ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
)
FASHION_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
FASHION_TRAIN_CLASSES = 5  # classes 0-4 train, 5-9 test


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- Debian packages


def missing_packages(packages: Sequence[str]) -> list[str]:
    """The packages dpkg does not list as installed."""
    missing = []
    for name in packages:
        query = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True
        )
        if "install ok installed" not in query.stdout:
            missing.append(name)
    return missing


def ensure_packages(packages: Sequence[str]) -> None:
    """apt-get install the missing packages (an `apt-get update` first when that fails)."""
    missing = missing_packages(packages)
    if not missing:
        return
    log(f"installing Debian packages: {' '.join(missing)}")
    if os.geteuid() != 0:
        raise SystemExit(f"not root: install them first with apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    if subprocess.run(install, env=env, stdout=sys.stderr).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, stdout=sys.stderr, check=True)
        subprocess.run(install, env=env, stdout=sys.stderr, check=True)
    log(f"installed: {' '.join(missing)}")


def package_files(package: str) -> list[Path]:
    listing = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True)
    return [Path(line) for line in listing.stdout.splitlines() if line.strip()]


# ---------------------------------------------------------------- output folder


def fresh_folder(out: Path, overwrite: bool) -> None:
    """An empty `out` holding the marker; a used folder is replaced only if it has the marker."""
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise SystemExit(f"{out} is not empty and was not made by this script; choose another")
        if not overwrite:
            raise SystemExit(f"{out} exists; pass --overwrite to build it again")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by tools/real_sets.py; --overwrite may replace it\n")


def save_png(image: Image.Image, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=False)


def print_counts(name: str, rows: Sequence[Row]) -> None:
    """Classes and images per split, to stdout."""
    print(f"{name}: {len(rows)} images")
    for split in ("train", "test"):
        labels = [r[1] for r in rows if r[2] == split]
        print(f"  {split}: {len(set(labels))} classes, {len(labels)} images")


# ---------------------------------------------------------------- fonts: characters


def candidate_characters() -> list[str]:
    """ASCII, Latin-1, Greek and basic Cyrillic, in codepoint order (303 characters)."""
    points = list(range(0x21, 0x7F))  # ASCII printable but space
    points += [p for p in range(0xA1, 0x100) if p != 0xAD]  # Latin-1 but the soft hyphen
    points += [p for p in range(0x391, 0x3AA) if p != 0x3A2]  # Greek capitals
    points += list(range(0x3B1, 0x3CA))  # Greek small letters, final sigma included
    points += [0x401, *range(0x410, 0x450), 0x451]  # Cyrillic with Io
    return [chr(p) for p in points]


def class_name(char: str) -> str:
    """'U+0041 LATIN CAPITAL LETTER A': unique, readable, no commas or markup."""
    return f"U+{ord(char):04X} {unicodedata.name(char, 'UNNAMED')}"


def parse_chars(text: str) -> list[str]:
    """--chars: the characters themselves, duplicates and whitespace dropped, order kept."""
    return list(dict.fromkeys(c for c in text if not c.isspace()))


# ---------------------------------------------------------------- fonts: discovery


@dataclass(frozen=True)
class FontFile:
    path: Path
    package: str
    family: str
    style: str
    cmap: frozenset[int]  # codepoints the font maps


def read_font(path: Path, package: str) -> FontFile | None:
    """Family, style and cmap of a text font; None for a symbol font or an unreadable file."""
    from fontTools.ttLib import TTFont, TTLibError

    try:
        with TTFont(path, lazy=True) as font:
            cmap = font.getBestCmap() or {}
            if not all(_plain_glyph(cmap.get(ord(c)), ord(c)) for c in REQUIRED):
                return None  # a symbol font (Dingbats, Symbol) maps ASCII to other pictures
            names = font["name"]
            family = names.getDebugName(16) or names.getDebugName(1) or path.stem
            style = names.getDebugName(17) or names.getDebugName(2) or ""
    except (TTLibError, KeyError, OSError, AssertionError) as e:
        log(f"skipping {path}: {e}")
        return None
    return FontFile(path, package, family, style, frozenset(cmap))


def _plain_glyph(glyph: str | None, codepoint: int) -> bool:
    """The cmap maps codepoint to the glyph named for it (Adobe Glyph List or uniXXXX)."""
    from fontTools.agl import UV2AGL

    return glyph is not None and glyph in (UV2AGL.get(codepoint), f"uni{codepoint:04X}")


def discover_fonts(packages: Sequence[str]) -> list[FontFile]:
    """Text fonts of the packages (REQUIRED mapped to its own glyphs), one per (family, style)."""
    seen: set[tuple[str, str]] = set()
    fonts = []
    for package in packages:
        files = sorted(p for p in package_files(package) if p.suffix.lower() in FONT_SUFFIXES)
        for path in files:
            if not path.is_file():
                continue
            font = read_font(path, package)
            if font is None:
                continue
            key = (font.family.lower(), font.style.lower())
            if key not in seen:
                seen.add(key)
                fonts.append(font)
    return fonts


def family_turns(fonts: Sequence[FontFile], seed: int) -> list[FontFile]:
    """Fonts ordered so families take turns: a seeded family order, styles shuffled within."""
    rng = random.Random(seed)
    by_family: dict[str, list[FontFile]] = defaultdict(list)
    for font in fonts:
        by_family[font.family].append(font)
    families = sorted(by_family)
    rng.shuffle(families)
    for name in families:
        rng.shuffle(by_family[name])
    ordered = []
    for turn in range(max(len(v) for v in by_family.values())):
        ordered += [by_family[f][turn] for f in families if turn < len(by_family[f])]
    return ordered


# ---------------------------------------------------------------- fonts: drawing


def draw_glyph(font: ImageFont.FreeTypeFont, char: str, size: int) -> Image.Image | None:
    """`char` black on a white size x size canvas, ink centred horizontally, baseline fixed.

    A glyph too large for the canvas is drawn at a smaller font size until it fits. None when
    the glyph has no ink.
    """
    baseline = round(size * BASELINE)
    for _ in range(8):
        left, top, right, bottom = font.getbbox(char, anchor="ls")
        if right <= left or bottom <= top:
            return None
        x = (size - (right - left)) / 2 - left
        fits = right - left <= size - 2 and baseline + top >= 1 and baseline + bottom <= size - 1
        if fits:
            image = Image.new("L", (size, size), 255)
            ImageDraw.Draw(image).text((x, baseline), char, font=font, fill=0, anchor="ls")
            return image if int(np.asarray(image).min()) < 128 else None
        font = font.font_variant(size=max(1, int(font.size * 0.85)))
    return None


def load_font(path: Path, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(path), size=max(8, round(size * EM)))


def probe_pixels(font: ImageFont.FreeTypeFont, size: int) -> np.ndarray:
    """(len(PROBE), size, size) float32 in [0, 1]: the probe characters, blank where missing."""
    out = np.ones((len(PROBE), size, size), dtype=np.float32)
    for i, char in enumerate(PROBE):
        image = draw_glyph(font, char, size)
        if image is not None:
            out[i] = np.asarray(image, dtype=np.float32) / 255.0
    return out


def choose_fonts(candidates: Sequence[FontFile], max_fonts: int, size: int) -> list[FontFile]:
    """The first max_fonts candidates whose probe drawings differ from every font taken."""
    chosen: list[FontFile] = []
    probes: list[np.ndarray] = []
    for font in candidates:
        if len(chosen) == max_fonts:
            break
        pixels = probe_pixels(load_font(font.path, size), size)
        pairs = zip(chosen, probes, strict=True)
        clone = next((c for c, p in pairs if _mean_diff(p, pixels) < CLONE_DIFF), None)
        if clone is not None:
            log(f"  {font.family} {font.style}: drawn like {clone.family} {clone.style}; left out")
            continue
        chosen.append(font)
        probes.append(pixels)
    return chosen


def _mean_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).mean())


def draw_all(
    fonts: Sequence[FontFile], chars: Sequence[str], size: int
) -> dict[str, dict[int, Image.Image]]:
    """char -> {font index: drawing}, for the fonts that map the char and draw real ink."""
    drawings: dict[str, dict[int, Image.Image]] = {c: {} for c in chars}
    for index, font_file in enumerate(fonts):
        font = load_font(font_file.path, size)
        notdef = draw_glyph(font, MISSING, size)
        notdef_bytes = notdef.tobytes() if notdef is not None else None
        for char in chars:
            if ord(char) not in font_file.cmap:
                continue
            image = draw_glyph(font, char, size)
            if image is not None and image.tobytes() != notdef_bytes:
                drawings[char][index] = image
    return drawings


def drop_lookalikes(drawings: dict[str, dict[int, Image.Image]], chars: Sequence[str]) -> list[str]:
    """chars without those drawn pixel-identically to an earlier kept char by most shared fonts.

    Latin A, Greek Alpha and Cyrillic A are one glyph in most fonts: as separate classes they
    could not be told apart by anyone, so only the first (in `chars` order) stays.
    """
    kept: list[str] = []
    for char in chars:
        mine = {i: im.tobytes() for i, im in drawings[char].items()}
        if not mine:
            continue
        twin = next((k for k in kept if _same_share(mine, drawings[k]) > 0.5), None)
        if twin is None:
            kept.append(char)
        else:
            log(f"  {class_name(char)}: drawn as {class_name(twin)}; left out")
    return kept


def _same_share(mine: dict[int, bytes], other: dict[int, Image.Image]) -> float:
    shared = [i for i in mine if i in other]
    if not shared:
        return 0.0
    return sum(mine[i] == other[i].tobytes() for i in shared) / len(shared)


def split_classes(classes: Sequence[str], seed: int) -> dict[str, str]:
    """A seeded class-disjoint split: the first half of a shuffled copy trains, the rest tests."""
    order = sorted(classes)
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    return {c: ("train" if i < half else "test") for i, c in enumerate(order)}


def build_fonts(args: argparse.Namespace) -> list[Row]:
    ensure_packages(FONT_PACKAGES)
    candidates = family_turns(discover_fonts(FONT_PACKAGES), args.seed)
    log(f"{len(candidates)} text fonts found; choosing up to {args.max_fonts}")
    fonts = choose_fonts(candidates, args.max_fonts, args.size)
    chars = parse_chars(args.chars) if args.chars else candidate_characters()
    log(f"drawing {len(chars)} characters with {len(fonts)} fonts ...")
    drawings = draw_all(fonts, chars, args.size)
    distinct = drop_lookalikes(drawings, chars)
    kept = [c for c in distinct if len(drawings[c]) >= args.min_fonts]
    log(f"{len(kept)} of {len(chars)} characters kept ({len(distinct) - len(kept)} lack fonts)")
    if len(kept) < 4:
        raise SystemExit(f"only {len(kept)} characters have {args.min_fonts} fonts; lower it")
    split = split_classes(kept, args.seed)
    fresh_folder(args.out, args.overwrite)
    rows: list[Row] = []
    for label, char in enumerate(kept):
        for index, image in sorted(drawings[char].items()):
            rel = f"{split[char]}/U{ord(char):04X}/{index:03d}.png"
            save_png(image, args.out / rel)
            rows.append((rel, label, split[char], class_name(char)))
    write_font_list(args.out / "fonts.csv", fonts)
    write_manifest(args.out / "manifest.csv", rows)
    return rows


def write_font_list(path: Path, fonts: Iterable[FontFile]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["index", "family", "style", "package", "path"])
        for i, font in enumerate(fonts):
            writer.writerow([i, font.family, font.style, font.package, font.path])


# ---------------------------------------------------------------- fashion

IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format), gzipped or not, as an array of its declared shape."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] not in IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file")
    ndim = data[3]
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = np.dtype(IDX_TYPES[data[2]])
    body = 4 + 4 * ndim
    expected = body + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise ValueError(f"{path}: {len(data)} bytes, the header says {expected}")
    return np.frombuffer(data, dtype, offset=body).reshape(shape).astype(dtype.newbyteorder("="))


def find_idx(folder_files: Iterable[Path], stem: str) -> Path:
    """The file named stem or stem.gz among the package's files."""
    for path in folder_files:
        if path.name in (stem, stem + ".gz") and path.is_file():
            return path
    raise SystemExit(f"{FASHION_PACKAGE} has no {stem}(.gz); see dpkg -L {FASHION_PACKAGE}")


def load_fashion(files: Sequence[Path]) -> tuple[np.ndarray, np.ndarray]:
    """(70000, 28, 28) uint8 images and (70000,) labels: the train file, then t10k."""
    images, labels = [], []
    for image_stem, label_stem in FASHION_FILES:
        x = read_idx(find_idx(files, image_stem))
        y = read_idx(find_idx(files, label_stem))
        if x.ndim != 3 or y.shape != x.shape[:1]:
            raise SystemExit(f"{image_stem}: shapes {x.shape} and {y.shape} do not match")
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels).astype(np.int64)


def fashion_sample(labels: np.ndarray, per_class: int, seed: int) -> list[int]:
    """Sorted row indices: per_class drawn without replacement from each class, seeded."""
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if per_class > len(members):
            raise SystemExit(f"class {c} has {len(members)} images, fewer than {per_class}")
        chosen += rng.choice(members, size=per_class, replace=False).tolist()
    return sorted(chosen)


def fashion_rows(labels: np.ndarray, indices: Sequence[int]) -> list[Row]:
    """Manifest rows for the chosen indices: classes below FASHION_TRAIN_CLASSES train."""
    rows = []
    for i in indices:
        label = int(labels[i])
        split = "train" if label < FASHION_TRAIN_CLASSES else "test"
        rows.append((f"{split}/{label}/{i:05d}.png", label, split, FASHION_CLASSES[label]))
    return rows


def build_fashion(args: argparse.Namespace) -> list[Row]:
    ensure_packages([FASHION_PACKAGE])
    images, labels = load_fashion(package_files(FASHION_PACKAGE))
    log(f"Fashion-MNIST: {len(images)} images; drawing {args.per_class} per class")
    rows = fashion_rows(labels, fashion_sample(labels, args.per_class, args.seed))
    fresh_folder(args.out, args.overwrite)
    for rel, *_ in rows:
        index = int(Path(rel).stem)
        save_png(Image.fromarray(images[index]), args.out / rel)
    write_manifest(args.out / "manifest.csv", rows)
    return rows


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sets = parser.add_subparsers(dest="set", required=True)
    fonts = sets.add_parser("fonts", help="characters drawn by many installed fonts")
    fonts.add_argument("out", type=Path, help="dataset folder to write")
    fonts.add_argument("--max-fonts", type=int, default=24, help="fonts to draw with")
    fonts.add_argument("--min-fonts", type=int, default=16, help="drawings a character needs")
    fonts.add_argument("--chars", default=None, help="the characters to use (default: 303)")
    fonts.add_argument("--size", type=int, default=64, help="canvas side in pixels")
    fashion = sets.add_parser("fashion", help="Fashion-MNIST from dataset-fashion-mnist")
    fashion.add_argument("out", type=Path, help="dataset folder to write")
    fashion.add_argument("--per-class", type=int, default=600, help="images per class")
    for sub in (fonts, fashion):
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--overwrite", action="store_true", help="replace a folder made before")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = build_fonts(args) if args.set == "fonts" else build_fashion(args)
    print_counts(f"{args.set} set in {args.out}", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
