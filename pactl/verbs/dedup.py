"""`pactl dedup`'s library side: groups of the same item in a bundle or a vectors folder, at a
given or calibrated cosine threshold."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.console import Reporter


@dataclass
class Member:
    """One row of `pactl dedup`: a group member (rows of a group follow one another)."""

    group: int
    id: int
    path: str
    score: float  # cosine to the group's first member


@dataclass
class DedupResult:
    members: list[list[Member]]  # per group its members, first member first
    removable: list[list[Member]] | None  # with a keep rule: per group, all but the kept one
    images: int
    pairs: int
    threshold: float
    how: str  # where the threshold came from


def dedup(
    folder: Path,
    threshold: float | None,
    precision: float | None,
    strict: bool,
    keep: str | None,
    reporter: Reporter,
    batch_size: int = 4096,
) -> DedupResult:
    """Groups of the same item in a bundle (its own index) or a vectors folder (an index built
    for the search), at the given or calibrated threshold."""
    from pactl.calibrate import same_item_threshold
    from pactl.index.grouping import DedupConfig, find_groups, removable
    from pactl.verbs.lineage import calibration_of

    searcher, items, meta = _searcher(folder, reporter)
    t, how = same_item_threshold(calibration_of(meta), str(folder), threshold, precision)
    reporter.log(f"same item: {how}")
    groups = find_groups(searcher, DedupConfig(t, strict, batch_size), reporter)
    ids = items.ids[groups.rows]
    members = [
        Member(int(g), int(i), items.paths[int(r)], float(s))
        for g, i, r, s in zip(
            groups.group.tolist(), ids.tolist(), groups.rows, groups.score.tolist(), strict=True
        )
    ]
    drop = None
    if keep is not None:
        from pactl.index.dedup import file_facts

        rows = groups.rows
        sizes, mtimes = file_facts(
            lambda i: items.paths[int(rows[i])], items.sizes[rows], items.mtimes[rows]
        )
        mask = removable(groups, sizes, mtimes, keep).tolist()
        drop = _per_group([m for m, out in zip(members, mask, strict=True) if out])
    return DedupResult(_per_group(members), drop, groups.images, groups.pairs, t, how)


def _per_group(members: list[Member]) -> list[list[Member]]:
    out: list[list[Member]] = []
    for m in members:
        if not out or out[-1][0].group != m.group:
            out.append([])
        out[-1].append(m)
    return out


def _searcher(folder: Path, reporter: Reporter) -> tuple[Any, Any, dict[str, Any]]:
    """What dedup searches: a bundle's index over its live items, or a vectors folder."""
    from pactl.index.dedup import BundleSearcher, VectorSearcher, check_range_search

    if _is_bundle(folder):
        from pactl.index import load_bundle

        bundle = load_bundle(folder, mmap=False)
        live = ~bundle.is_deleted(bundle.items.ids)
        if getattr(bundle.index, "floats", None) is not None:  # exact, as a folder's
            floats = bundle.index.floats
            vectors = floats if live.all() else floats[np.flatnonzero(live)]
            found = VectorSearcher(vectors, reporter=reporter)
            return found, bundle.items.take(np.flatnonzero(live)), bundle.meta
        check_range_search(bundle.index, str(folder))
        searcher = BundleSearcher(bundle)
        if searcher.approximate:
            reporter.warn(
                f"{folder} stores compressed codes: scores are approximate; dedup its vectors "
                "folder for exact ones"
            )
        return searcher, bundle.items.take(np.flatnonzero(live)), bundle.meta
    from pactl.verbs.vector_sources import gather_vectors

    vectors, items, meta = gather_vectors(folder)
    return VectorSearcher(vectors, reporter=reporter), items, meta


def _is_bundle(folder: Path) -> bool:
    import json

    from pactl.index import BUNDLE_FORMAT

    try:
        return json.loads((folder / "meta.json").read_bytes()).get("format") == BUNDLE_FORMAT
    except (OSError, ValueError, AttributeError):
        return False
