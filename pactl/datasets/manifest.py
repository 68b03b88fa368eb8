"""manifest.csv: `path,label,split[,class_name]`, paths relative to the manifest's folder."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from pactl.errors import PactlError
from pactl.fsutil import atomic_write_text

SPLITS = ("train", "val", "test", "query", "gallery")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")


@dataclass(frozen=True)
class Manifest:
    """Labelled images: row i is `root / paths[i]` with integer `labels[i]` in `splits[i]`."""

    root: Path
    paths: tuple[str, ...]
    labels: np.ndarray  # (N,) int64
    splits: tuple[str, ...]
    class_names: tuple[str, ...]  # (N,) the class name of each row
    source: str = ""  # what the manifest was built from, for messages and config.json
    duplicates: int = 0  # repeated rows that were dropped

    def __len__(self) -> int:
        return len(self.paths)

    def select(self, *splits: str) -> Manifest:
        keep = [i for i, s in enumerate(self.splits) if s in splits]
        return self.subset(keep)

    def subset(self, rows: Sequence[int]) -> Manifest:
        return Manifest(
            root=self.root,
            paths=tuple(self.paths[i] for i in rows),
            labels=self.labels[np.asarray(rows, dtype=np.int64)],
            splits=tuple(self.splits[i] for i in rows),
            class_names=tuple(self.class_names[i] for i in rows),
            source=self.source,
        )

    def files(self) -> list[Path]:
        return [self.root / p for p in self.paths]

    def has_split(self, split: str) -> bool:
        return split in self.splits

    def eval_splits(self) -> tuple[str, ...] | tuple[str, str]:
        """("query", "gallery") for In-Shop style manifests, else ("test",)."""
        if self.has_split("query") and self.has_split("gallery"):
            return ("query", "gallery")
        return ("test",)


def write_manifest(path: Path, rows: Iterable[tuple[str, int, str, str]]) -> None:
    """Write `(path, label, split, class_name)` rows atomically."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["path", "label", "split", "class_name"])
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def read_manifest(path: Path) -> Manifest:
    """Read a manifest or a user CSV of `path,label[,split][,class_name]`."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            fields = [c.strip() for c in reader.fieldnames or []]
            records = [{k.strip(): (v or "").strip() for k, v in r.items() if k} for r in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise PactlError(f"cannot read {path}: {e}") from None
    missing = [c for c in ("path", "label") if c not in fields]
    if missing:
        raise PactlError(
            f"{path} lacks the column(s) {', '.join(missing)}: a manifest needs a header "
            f"'path,label[,split]' (it has: {', '.join(fields) or 'no header'})"
        )
    if not records:
        raise PactlError(f"{path} has a header but no rows")
    return _build(path.parent, records, source=str(path))


def _build(root: Path, records: list[dict[str, str]], source: str) -> Manifest:
    seen: set[str] = set()
    paths, raw_labels, splits = [], [], []
    for line, r in enumerate(records, start=2):
        rel = _safe_relative(r["path"], source, line)
        if rel in seen:
            continue  # duplicate rows would count an image twice in every metric
        seen.add(rel)
        if not r["label"]:
            raise PactlError(f"{source} line {line}: empty label")
        split = r.get("split", "")
        if split and split not in SPLITS:
            raise PactlError(
                f"{source} line {line}: unknown split {split!r} (use one of {', '.join(SPLITS)})"
            )
        paths.append(rel)
        raw_labels.append(r.get("class_name") or r["label"])
        splits.append(split)
    labels = _encode_labels(raw_labels)
    if all(not s for s in splits):
        splits = split_by_class(labels)
    elif any(not s for s in splits):
        raise PactlError(f"{source}: some rows have a split and others do not")
    duplicates = len(records) - len(paths)
    return Manifest(
        root, tuple(paths), labels, tuple(splits), tuple(raw_labels), source, duplicates
    )


def _safe_relative(value: str, source: str, line: int) -> str:
    """A path inside the manifest folder, in POSIX form; refuse absolute paths and `..`."""
    if not value:
        raise PactlError(f"{source} line {line}: empty path")
    posix = PurePosixPath(value.replace("\\", "/"))
    if posix.is_absolute() or ".." in posix.parts or (posix.parts and ":" in posix.parts[0]):
        raise PactlError(
            f"{source} line {line}: path {value!r} leaves the manifest's folder; "
            "paths must be relative to the CSV's folder"
        )
    return str(posix)


def _encode_labels(names: list[str]) -> np.ndarray:
    """Labels 0..C-1 from class names, integers in numeric order before other names."""
    unique = sorted(set(names), key=_label_key)
    index = {name: i for i, name in enumerate(unique)}
    return np.array([index[n] for n in names], dtype=np.int64)


def _label_key(name: str) -> tuple[int, int, str]:
    try:
        return (0, int(name), "")
    except ValueError:
        return (1, 0, name)


def split_by_class(labels: np.ndarray) -> list[str]:
    """The metric-learning split: the first half of the classes train, the rest test."""
    classes = np.unique(labels)
    if len(classes) < 4:
        raise PactlError(
            f"only {len(classes)} classes: a class-disjoint train/test split needs at least 4"
        )
    train = set(classes[: len(classes) // 2].tolist())
    return ["train" if int(lab) in train else "test" for lab in labels]


def manifest_from_folder(folder: Path) -> Manifest:
    """A folder of class sub-folders (`folder/<class>/<image>`) as a manifest split by class."""
    if not folder.is_dir():
        raise PactlError(f"{folder} is not a folder")
    records = [
        {"path": p.relative_to(folder).as_posix(), "label": p.relative_to(folder).parts[0]}
        for p in sorted(folder.rglob("*"))
        if p.suffix.lower() in IMAGE_EXTENSIONS and len(p.relative_to(folder).parts) >= 2
    ]
    if not records:
        raise PactlError(
            f"{folder} has no images in class sub-folders "
            f"(expected {folder}/<class>/<image>{IMAGE_EXTENSIONS[0]})"
        )
    return _build(folder, records, source=str(folder))


def list_images(folder: Path) -> list[Path]:
    """Every image below `folder`, sorted."""
    return sorted(
        p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
    )
