"""The image checks of `pactl audit` against planted issues on a real set.

    python -m tools.planted_checks OUT SOURCE [SOURCE ...] [--plant 20] [--seed 0]
    python -m tools.planted_checks OUT SOURCE --plant 0 --copies 200    # the label-free copies

Every image below each SOURCE folder is copied into OUT/ordinary/ as it is; --plant of them,
drawn by --seed, each give one planted image per issue in OUT/planted/: dark (x 0.12), bright
(x 0.2 + 204), blurry (a Gaussian of 1.5% of the longer side, 1.5 px at least), blank (one grey
level), grey (the image in grey, planted only where the set is in colour), strip (a 5:1 crop),
tiny (a side of 1/8) and broken (the first 200 bytes). With --copies N, N more of them each give
a changed copy in OUT/copies/ (as the audit's own calibration changes them: resized, cropped to
80-95% of each side, saved as JPEG, or all three, in turn). Then `pactl audit OUT --no-labels
--top 0 -f csv` runs (with --no-copies where no copies are planted) and stdout gets, per issue,
the share of its planted images flagged with it, per check how many ordinary images it flagged,
and with --copies the share of each change's copies reported with their original and the pairs
reported that were not planted. OUT is replaced only when it holds this script's marker.
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

MARKER = ".pactl-planted-checks"
PLANTS = ("dark", "bright", "blurry", "low_information", "grayscale", "odd_aspect", "odd_size")


def planted(image: object, issue: str) -> object:
    """A PIL RGB image changed to show `issue`."""
    from PIL import Image, ImageFilter

    assert isinstance(image, Image.Image)
    pixels = np.asarray(image, dtype=np.float64)
    w, h = image.size
    if issue == "dark":
        return Image.fromarray((pixels * 0.12).astype(np.uint8))
    if issue == "bright":
        return Image.fromarray((pixels * 0.2 + 204).astype(np.uint8))
    if issue == "blurry":
        return image.filter(ImageFilter.GaussianBlur(max(1.5, 0.015 * max(w, h))))
    if issue == "low_information":
        return Image.new("RGB", image.size, (int(pixels.mean()),) * 3)
    if issue == "grayscale":
        return image.convert("L")
    if issue == "odd_aspect":
        return image.crop((0, 0, w, max(1, w // 5))) if w >= h else image.crop((0, 0, h // 5, h))
    return image.resize((max(1, w // 8), max(1, h // 8)))


def build(out: Path, sources: list[Path], plant: int, seed: int) -> tuple[list[Path], bool]:
    """OUT/ordinary and OUT/planted: the ordinary files, and whether the set is in colour."""
    from pactl.audit.checks import measure
    from pactl.datasets import list_images
    from pactl.images import load_image

    if out.exists():
        if not (out / MARKER).is_file():
            sys.exit(f"{out} exists and is not this script's: name another folder")
        shutil.rmtree(out)
    (out / "ordinary").mkdir(parents=True)
    (out / "planted").mkdir()
    (out / MARKER).touch()
    files = [p for s in sources for p in list_images(s)]
    ordinary = []
    for i, path in enumerate(files):
        ordinary.append(out / "ordinary" / f"{i:06d}{path.suffix.lower()}")
        shutil.copyfile(path, ordinary[-1])
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(files), size=min(plant, len(files)), replace=False)
    images = [load_image(files[i]) for i in chosen.tolist()]
    colour = float(np.median([measure(im)[6] for im in images])) > 0.02
    for n, image in enumerate(images if plant else []):
        for issue in PLANTS:
            if issue == "grayscale" and not colour:
                continue
            planted(image, issue).save(out / "planted" / f"{issue}-{n:03d}.png")  # type: ignore[attr-defined]
        (out / "planted" / f"unreadable-{n:03d}.jpg").write_bytes(
            files[chosen[n]].read_bytes()[:200]
        )
    return ordinary, colour


def plant_copies(out: Path, ordinary: list[Path], n: int, seed: int) -> dict[str, tuple[str, str]]:
    """N changed copies in OUT/copies: copy name -> (original name, change)."""
    from pactl.audit.copies import CHANGES, changed_copy
    from pactl.images import load_image

    (out / "copies").mkdir()
    rng = np.random.default_rng(seed + 1)
    planted = {}
    for i, at in enumerate(rng.choice(len(ordinary), size=n, replace=False).tolist()):
        change = CHANGES[i % len(CHANGES)]
        image, suffix = changed_copy(load_image(ordinary[at]), change, rng)
        name = f"copy-{i:04d}{suffix}"
        if suffix == ".jpg":
            image.save(out / "copies" / name, quality=int(rng.integers(30, 71)))
        else:
            image.save(out / "copies" / name)
        planted[name] = (ordinary[at].name, change)
    return planted


def copy_report(rows: list[dict[str, str]], planted: dict[str, tuple[str, str]]) -> None:
    """Per change, the share of planted copies reported with their original; unplanted pairs."""
    pairs = {
        frozenset((Path(r["path"]).name, Path(r["other"]).name))
        for r in rows
        if r["kind"] == "copy"
    }
    known = {frozenset((c, o)) for c, (o, _) in planted.items()}
    for change in sorted({c for _, c in planted.values()}):
        mine = [frozenset((c, o)) for c, (o, ch) in planted.items() if ch == change]
        print(f"planted copies ({change}): {sum(p in pairs for p in mine)}/{len(mine)} reported")
    print(f"copy pairs reported: {len(pairs)}, not planted: {len(pairs - known)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("sources", type=Path, nargs="+")
    parser.add_argument("--plant", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--copies", type=int, default=0)
    args = parser.parse_args()
    ordinary, colour = build(args.out, args.sources, args.plant, args.seed)
    copies = plant_copies(args.out, ordinary, args.copies, args.seed) if args.copies else {}
    command = ["pactl", "audit", str(args.out), "--no-labels", "--top", "0", "-f", "csv"]
    command += [] if copies else ["--no-copies"]
    print("$", " ".join(command), file=sys.stderr)
    done = subprocess.run(
        [sys.executable, "-m", "pactl", *command[1:]], capture_output=True, text=True, check=True
    )
    print(done.stderr, file=sys.stderr, end="")
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    flagged = {(r["kind"], Path(r["path"]).name) for r in rows}
    print(
        f"{len(ordinary):,} ordinary images, {args.plant} planted of each issue (colour: {colour})"
    )
    if copies:
        copy_report(rows, copies)
    for issue in (*PLANTS, "unreadable"):
        mine = sorted(p.name for p in (args.out / "planted").glob(f"{issue}-*"))
        if mine:
            found = sum((issue, name) in flagged for name in mine)
            print(f"planted {issue}: {found}/{len(mine)} flagged {issue}")
    names = {p.name for p in ordinary}
    for issue in (*PLANTS, "unreadable"):
        wrong = sum(1 for kind, name in flagged if kind == issue and name in names)
        print(f"ordinary images flagged {issue}: {wrong}")


if __name__ == "__main__":
    main()
