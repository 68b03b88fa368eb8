"""What a verb embeds: the images of a folder, a dataset or a CSV (one split, or all), and
their labels.
"""

from __future__ import annotations

import os
from pathlib import Path

from pactl.console import Reporter, quoted
from pactl.errors import PactlError, UsageError


def check_source(source: str) -> None:
    """SOURCE is a dataset of the catalog or an existing path; anything else is a usage mistake
    (a misspelt dataset name, most often), said before any work."""
    from pactl.datasets import CATALOG

    if source not in CATALOG and not os.path.lexists(source):
        raise UsageError(
            f"{quoted(source)} is neither a known dataset ({', '.join(sorted(CATALOG))}) "
            "nor an existing folder or CSV file"
        )


def source_items(
    source: str, split: str | None, reporter: Reporter, follow_links: bool = False
) -> tuple[list[Path], list[str]]:
    """Images and labels to embed: a plain folder (labels from class sub-folders, if any),
    or the rows of a dataset / manifest / CSV (optionally one split). Links that lead out of
    the folder are skipped (a folder) or refused (a manifest row) unless `follow_links`."""
    from pactl.datasets import list_images, load_source

    path = Path(source)
    if split is None and path.is_dir() and not (path / "manifest.csv").is_file():
        files = list_images(path, follow_links=follow_links, reporter=reporter)
        if not files:
            raise PactlError(f"{path} has no images")
        labels = [f.relative_to(path).parts[0] if f.parent != path else "" for f in files]
        return files, labels
    manifest = load_source(source, reporter, follow_links=follow_links, splits=split is not None)
    if split:
        manifest = manifest.select(split)
        if not len(manifest):
            raise PactlError(f"{source} has no rows in split {split!r}")
    return manifest.files(), list(manifest.class_names)
