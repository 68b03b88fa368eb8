"""The four benchmarks of the Proxy-Anchor paper: an extracted folder -> manifest rows.

Each layout finds its dataset inside a folder (an archive's top folder, or a folder the user
extracted by hand and pactl linked) and turns the dataset's own listing files into rows of
`(path, label, split, class_name)`, with paths relative to the folder that will hold
manifest.csv and labels as the dataset's own class (or item) ids.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pactl.errors import PactlError

Row = tuple[str, int, str, str]
# A folder -> the dataset's own root somewhere inside it, or None when it is not there.
Locate = Callable[[Path], "Path | None"]
MAX_DEPTH = 4  # how far below the given folder a dataset's root is looked for


@dataclass(frozen=True)
class Layout:
    """How to recognise a dataset on disk and read its standard split."""

    locate: Locate
    rows: Callable[[Path, Path], list[Row]]  # (manifest folder, dataset root) -> rows
    expects: str  # what `locate` looks for, for the error message when it is missing

    def parse(self, folder: Path) -> list[Row]:
        """Rows for the dataset found under `folder`, every listed image checked to exist."""
        base = self.locate(folder)
        if base is None:
            raise PactlError(f"no {self.expects} found under {folder}")
        rows = self.rows(folder, base)
        if not rows:
            raise PactlError(f"{base} lists no images")
        missing = [r[0] for r in rows if not (folder / r[0]).is_file()]
        if missing:
            raise PactlError(
                f"{len(missing):,} of {len(rows):,} listed images are missing under {folder} "
                f"(first: {missing[0]}); the archive or folder is incomplete"
            )
        return rows


def find_dir(root: Path, accept: Callable[[Path], bool], max_depth: int = MAX_DEPTH) -> Path | None:
    """The shallowest folder at or below `root` that `accept`s, following links."""
    level = [root]
    for _ in range(max_depth + 1):
        below: list[Path] = []
        for folder in level:
            if accept(folder):
                return folder
            below.extend(_subfolders(folder))
        level = below
    return None


def _subfolders(folder: Path) -> Iterator[Path]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(".") and entry.is_dir():  # is_dir follows links
            yield Path(entry.path)


def _relative(folder: Path, path: Path) -> str:
    return path.relative_to(folder).as_posix()


def _read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PactlError(f"cannot read {path}: {e}") from None
    return [line for line in text.splitlines() if line.strip()]


def _pairs(path: Path) -> dict[str, str]:
    """`id value` lines (CUB's listing files) as a dict."""
    pairs = {}
    for number, line in enumerate(_read_lines(path), start=1):
        fields = line.split(maxsplit=1)
        if len(fields) != 2:
            raise PactlError(f"{path} line {number}: expected '<id> <value>', got {line!r}")
        pairs[fields[0]] = fields[1].strip()
    return pairs


def _first_half(class_id: int, classes: int) -> str:
    """The paper's split for CUB and Cars: the first half of the class ids train."""
    return "train" if class_id <= classes // 2 else "test"


# CUB-200-2011: CUB_200_2011/{images.txt, image_class_labels.txt, classes.txt, images/}.


def _locate_cub(folder: Path) -> Path | None:
    def accept(d: Path) -> bool:
        return (
            (d / "images.txt").is_file()
            and (d / "image_class_labels.txt").is_file()
            and (d / "images").is_dir()
        )

    return find_dir(folder, accept)


def _cub_rows(folder: Path, base: Path) -> list[Row]:
    images = _pairs(base / "images.txt")  # image id -> path below images/
    labels = _pairs(base / "image_class_labels.txt")  # image id -> class id
    names = _pairs(base / "classes.txt")  # class id -> "001.Black_footed_Albatross"
    rows = []
    for image_id, rel in images.items():
        if image_id not in labels:
            raise PactlError(f"{base}: image {image_id} has no line in image_class_labels.txt")
        label = int(labels[image_id])
        path = _relative(folder, base / "images" / rel)
        rows.append((path, label, _first_half(label, len(names)), names.get(str(label), "")))
    return rows


CUB = Layout(_locate_cub, _cub_rows, "CUB_200_2011 folder (images.txt, images/)")


# Cars-196: car_ims/NNNNNN.jpg and cars_annos.mat (annotations: relative_im_path, bbox_*,
# class 1..196, test; class_names). The mat's `test` flag is the classification split and
# is not used: metric learning trains on classes 1-98 and tests on 99-196.


def _locate_cars(folder: Path) -> Path | None:
    def accept(d: Path) -> bool:
        return (d / "cars_annos.mat").is_file() and (d / "car_ims").is_dir()

    return find_dir(folder, accept)


def _cars_rows(folder: Path, base: Path) -> list[Row]:
    import scipy.io

    path = base / "cars_annos.mat"
    try:
        mat = scipy.io.loadmat(path, squeeze_me=True, struct_as_record=False)
        annotations = np.atleast_1d(mat["annotations"])
        names = [str(n) for n in np.atleast_1d(mat["class_names"])]
    except (OSError, ValueError, KeyError, NotImplementedError) as e:
        raise PactlError(f"cannot read annotations from {path}: {e}") from None
    rows = []
    for record in annotations:
        label = int(getattr(record, "class"))
        rel = str(record.relative_im_path)  # "car_ims/000001.jpg"
        name = names[label - 1] if 1 <= label <= len(names) else ""
        rows.append((_relative(folder, base / rel), label, _first_half(label, len(names)), name))
    return rows


CARS = Layout(_locate_cars, _cars_rows, "cars_annos.mat beside a car_ims/ folder")


# Stanford Online Products: Stanford_Online_Products/{Ebay_train.txt, Ebay_test.txt, *_final/}.
# The files' own split: 11,318 training products, 11,316 test products.

SOP_HEADER = ["image_id", "class_id", "super_class_id", "path"]


def _locate_sop(folder: Path) -> Path | None:
    def accept(d: Path) -> bool:
        return (d / "Ebay_train.txt").is_file() and (d / "Ebay_test.txt").is_file()

    return find_dir(folder, accept)


def _sop_rows(folder: Path, base: Path) -> list[Row]:
    rows = []
    for listing, split in (("Ebay_train.txt", "train"), ("Ebay_test.txt", "test")):
        lines = _read_lines(base / listing)
        if not lines or lines[0].split() != SOP_HEADER:
            raise PactlError(f"{base / listing} does not start with '{' '.join(SOP_HEADER)}'")
        for number, line in enumerate(lines[1:], start=2):
            fields = line.split()
            if len(fields) != 4:
                raise PactlError(f"{base / listing} line {number}: expected 4 fields")
            # Products have no names; the manifest falls back to the class id.
            rows.append((_relative(folder, base / fields[3]), int(fields[1]), split, ""))
    return rows


SOP = Layout(_locate_sop, _sop_rows, "Stanford_Online_Products folder (Ebay_train.txt)")


# In-shop Clothes Retrieval: Eval/list_eval_partition.txt (a count, a header, then
# `img/.../id_00000002/02_1_front.jpg id_00000002 train|query|gallery`) and img.zip, whose
# top folder img/ sits beside the listing or in an Img/ folder next to Eval/.

INSHOP_HEADER = ["image_name", "item_id", "evaluation_status"]
INSHOP_SPLITS = ("train", "query", "gallery")


def _inshop_entries(listing: Path) -> list[list[str]]:
    lines = _read_lines(listing)
    if len(lines) < 2 or lines[1].split() != INSHOP_HEADER:
        raise PactlError(f"{listing}: expected a count, then '{' '.join(INSHOP_HEADER)}'")
    entries = [line.split() for line in lines[2:]]
    if lines[0].strip() != str(len(entries)):
        raise PactlError(f"{listing} announces {lines[0].strip()} images but lists {len(entries)}")
    for number, fields in enumerate(entries, start=3):
        if len(fields) != 3 or fields[2] not in INSHOP_SPLITS:
            raise PactlError(f"{listing} line {number}: expected '<image> <item id> <split>'")
    return entries


def _inshop_image_root(folder: Path, listing: Path, first_image: str) -> Path | None:
    """The folder (inside `folder`) that the listing's paths are relative to."""
    here, up = listing.parent, listing.parent.parent
    for candidate in (here, up, up / "Img", here / "Img"):
        inside = candidate == folder or folder in candidate.parents
        if inside and (candidate / first_image).is_file():
            return candidate
    return None


def _locate_inshop(folder: Path) -> Path | None:
    def accept(d: Path) -> bool:
        listing = d / "list_eval_partition.txt"
        if not listing.is_file():
            return False
        with open(listing, encoding="utf-8", errors="replace") as f:
            head = [f.readline() for _ in range(3)]
        fields = head[2].split()
        return bool(fields) and _inshop_image_root(folder, listing, fields[0]) is not None

    return find_dir(folder, accept)


def _inshop_rows(folder: Path, base: Path) -> list[Row]:
    listing = base / "list_eval_partition.txt"
    entries = _inshop_entries(listing)
    images = _inshop_image_root(folder, listing, entries[0][0]) if entries else None
    if images is None:
        raise PactlError(f"the images listed in {listing} are not beside it")
    rows = []
    for image, item, split in entries:
        label = int(item.rsplit("_", 1)[-1])  # "id_00000002" -> 2
        rows.append((_relative(folder, images / image), label, split, item))
    return rows


INSHOP = Layout(_locate_inshop, _inshop_rows, "list_eval_partition.txt beside the img/ folder")
