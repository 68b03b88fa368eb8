"""Datasets as manifests: the catalog of known sets, user folders and CSVs.

Rooms, in reading order: catalog.py (the known datasets), manifest.py (a folder or CSV -> the
manifest), benchmarks.py and digits.py (the built-in sets), download.py (resumable, checksummed
fetches) and archives.py (safe extraction).
"""

from __future__ import annotations

from pathlib import Path

from pactl.console import Reporter
from pactl.datasets.catalog import CATALOG, dataset_folder, is_prepared, prepare, spec
from pactl.datasets.manifest import (
    Manifest,
    list_images,
    manifest_from_folder,
    read_manifest,
    write_manifest,
)
from pactl.errors import PactlError

__all__ = [
    "CATALOG",
    "Manifest",
    "dataset_folder",
    "is_prepared",
    "list_images",
    "load_source",
    "manifest_from_folder",
    "prepare",
    "read_manifest",
    "spec",
    "typical_side",
    "write_manifest",
]

SIDE_SAMPLE = 64  # images whose headers typical_side reads


def load_source(
    source: str, reporter: Reporter, *, follow_links: bool = False, splits: bool = True
) -> Manifest:
    """A manifest from a dataset name, a folder (with or without manifest.csv) or a CSV file.

    Links leading outside a folder or a CSV's folder are skipped or refused unless
    `follow_links`; the catalog's own datasets are pactl's, and their links are followed.
    With `splits` False, a CSV without a split column is read even when it has too few
    classes for the default split (embedding uses none). Every image it names must be there
    (a row naming a missing file is one error, before any network loads); one that is there
    but cannot be decoded is the reader's to leave out.
    """
    from pactl.store.regular_files import check_present

    manifest = _load(source, reporter, follow_links, splits)
    if manifest.duplicates:
        reporter.log(f"{manifest.source}: dropped {manifest.duplicates} duplicate rows")
    check_present(manifest.files(), manifest.source or source)
    return manifest


def _load(source: str, reporter: Reporter, follow_links: bool, splits: bool) -> Manifest:
    if source in CATALOG:
        if not is_prepared(source):
            if not CATALOG[source].offline:
                raise PactlError(
                    f"dataset {source!r} is not downloaded yet: run `pactl download {source}`"
                )
            reporter.log(f"preparing {source} (first use)")
            prepare(source, reporter)
        # `--from FOLDER` links the user's extracted folder into the dataset's on purpose.
        return read_manifest(dataset_folder(source) / "manifest.csv", follow_links=True)
    path = Path(source)
    if path.is_dir():
        if (path / "manifest.csv").is_file():
            return read_manifest(path / "manifest.csv", follow_links=follow_links, splits=splits)
        return manifest_from_folder(path, follow_links=follow_links, reporter=reporter)
    if path.is_file():
        if path.suffix.lower() != ".csv":
            raise PactlError(f"{path} is not a CSV; give a dataset name, a folder or a .csv")
        return read_manifest(path, follow_links=follow_links, splits=splits)
    raise PactlError(
        f"{source!r} is neither a known dataset ({', '.join(sorted(CATALOG))}) "
        "nor an existing folder or CSV file"
    )


def typical_side(manifest: Manifest, sample: int = SIDE_SAMPLE) -> int | None:
    """The median short side, in pixels, of `sample` of the manifest's training images taken
    evenly through it (headers only, no decoding); None when none of them reads."""
    import numpy as np

    from pactl.images import ImageError, pixel_size

    train = manifest.select("train") if manifest.has_split("train") else manifest
    files = train.files()
    if not files:
        return None
    picks = sorted(set(np.linspace(0, len(files) - 1, min(sample, len(files))).round().astype(int)))
    sides = []
    for i in picks:
        try:
            sides.append(min(pixel_size(files[i])))
        except ImageError:
            continue
    return int(np.median(sides)) if sides else None
