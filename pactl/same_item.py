"""Same-item search: the cosine threshold a bundle or vectors folder is searched at (given, or
calibrated on held-out classes), and `pactl dedup`'s library side."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pactl.console import Reporter
from pactl.errors import PactlError, UsageError

NO_CALIBRATION = (
    "has no same-item calibration (its network is a backbone as published, not a trained "
    "run, or a checkpoint never calibrated): give --threshold T (a cosine, e.g. 0.9), or "
    "calibrate the checkpoint with `pactl eval --calibrate --checkpoint PATH`"
)


def calibration_of(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The calibration recorded in a bundle's meta.json, else its checkpoint's (calibrated
    after the bundle was built), else None."""
    from pactl.pipeline import checkpoint_calibration

    recorded = meta.get("calibration")
    if isinstance(recorded, dict):
        return recorded
    return checkpoint_calibration(meta)


def same_item_threshold(
    meta: dict[str, Any],
    where: str,
    threshold: float | None = None,
    precision: float | None = None,
) -> tuple[float, str]:
    """The threshold to search at and a line saying where it comes from: `threshold` as given,
    else the calibrated one (for `precision`, or the precision it was calibrated for)."""
    from pactl.calibrate import read_calibration

    if threshold is not None:
        if precision is not None:
            raise UsageError("give --threshold or --precision, not both")
        if not -1.0 <= threshold <= 1.0:
            raise UsageError(f"--threshold must be a cosine from -1 to 1, got {threshold}")
        return threshold, f"threshold {threshold:g} (given)"
    if precision is not None and not 0.0 < precision <= 1.0:
        raise UsageError(f"--precision must be in (0, 1], got {precision}")
    recorded = calibration_of(meta)
    if recorded is None:
        raise UsageError(f"{where} {NO_CALIBRATION}")
    cal = read_calibration(recorded, f"{where}/meta.json")
    target = precision if precision is not None else cal.precision
    point = cal.point_for(target)
    if point is None:
        raise PactlError(
            f"no cosine threshold reaches precision {target:g} on the {cal.split} classes "
            f"{where} was calibrated on: ask for a lower --precision, or give --threshold"
        )
    t, reached, recall = point
    return t, (
        f"threshold {t:.4f}, calibrated on the {cal.split} classes: precision {reached:.4f} "
        f"at recall {recall:.4f} (target {target:g})"
    )


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
    from pactl.index.dedup import DedupConfig, find_groups, removable

    searcher, items, meta = _searcher(folder, reporter)
    t, how = same_item_threshold(meta, str(folder), threshold, precision)
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
        check_range_search(bundle.index, str(folder))
        searcher = BundleSearcher(bundle)
        if searcher.approximate:
            reporter.warn(
                f"{folder} stores compressed codes: scores are approximate; dedup its vectors "
                "folder for exact ones"
            )
        live = ~bundle.is_deleted(bundle.items.ids)
        return searcher, bundle.items.take(np.flatnonzero(live)), bundle.meta
    from pactl.pipeline import gather_vectors

    vectors, items, meta = gather_vectors(folder)
    return VectorSearcher(vectors, reporter=reporter), items, meta


def _is_bundle(folder: Path) -> bool:
    import json

    from pactl.index import BUNDLE_FORMAT

    try:
        return json.loads((folder / "meta.json").read_bytes()).get("format") == BUNDLE_FORMAT
    except (OSError, ValueError, AttributeError):
        return False
