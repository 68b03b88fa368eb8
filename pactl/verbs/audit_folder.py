"""`pactl audit FOLDER` without labels and without a trained run: the copies and near copies
within the set, its outliers and the image checks, from one decode of each image (the
thumbnails), or by an ImageNet network's features where its weights are here
(pactl.audit.features: `--features auto`, the default, says in one line when it falls back to
the thumbnails). What needs labels (suspected labels, the class view, leaks across splits) is said
so in one line.

The copy search treats the set as one split under one label and reports every pair it accepts
(kind copy); its threshold is the likeness the copies it makes of the set's own images reach
(pactl.audit.copies: without splits or labels no pair is known to be distinct, so the share of
false pairs cannot be estimated and stderr says so). Outliers are the images whose thumbnails
(or features) lie farthest from their k nearest: 1 - the mean cosine to them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pactl.audit.checks import ImageChecks
from pactl.audit.copies import Copy, CopyThreshold
from pactl.console import Reporter, counted
from pactl.errors import PactlError, UsageError
from pactl.verbs.audit import AuditConfig, Finding

NEEDS_LABELS = (
    "without labels: no suspected labels, class view or leaks across splits (they need a "
    "labelled set and a run: pactl train DATA, then pactl audit runs/<run>)"
)


@dataclass
class Unlabelled:
    """The images of a folder as one split under one label (pactl.audit.copies.CopySource)."""

    paths: list[str]
    codes: np.ndarray
    splits: list[str]
    what: str

    def __len__(self) -> int:
        return len(self.paths)


@dataclass
class FolderResult:
    data: Unlabelled
    outlier: np.ndarray  # (N,) 1 - mean descriptor cosine to the k nearest (NaN: not read)
    copies: list[Copy]
    threshold: CopyThreshold | None
    checks: ImageChecks | None
    features: str = "thumbnail"  # what the outliers and copies were found by, in words


def read_folder(folder: Path, no_labels: bool, reporter: Reporter) -> Unlabelled:
    """Every image below `folder`; a folder of class sub-folders needs `no_labels` (its labels
    are audited through a run)."""
    from pactl.datasets import list_images

    files = list_images(folder, reporter=reporter)
    if not files:
        raise PactlError(f"{folder} holds no images (and is neither a run nor a bundle)")
    nested = any(len(p.relative_to(folder).parts) >= 2 for p in files)
    if nested and not no_labels:
        raise UsageError(
            f"{folder} holds class sub-folders: audit its labels through a run (pactl train "
            f"{folder}, then pactl audit runs/<run>), or pass --no-labels for its copies, "
            "outliers and image checks without them"
        )
    paths = [str(p.absolute()) for p in files]
    return Unlabelled(paths, np.zeros(len(paths), np.int64), [""] * len(paths), str(folder))


def audit_folder(folder: Path, config: AuditConfig, no_labels: bool, reporter: Reporter) -> Any:
    """The label-free audit of the images below `folder` (FolderResult): outliers and copies by
    an ImageNet network's features where config.features allows and its weights are here
    (pactl.audit.features), else by the thumbnails."""
    from pactl.audit.features import chosen_weights
    from pactl.verbs.audit import image_checks, read_images

    data = read_folder(folder, no_labels, reporter)
    weights = chosen_weights(config.features, config.weights, reporter)
    reporter.log(f"auditing {counted(len(data), 'image')} of {folder}; {NEEDS_LABELS}")
    if weights is not None:
        result = by_features(data, config, weights, reporter)
        if config.checks:
            pictures = read_images(data.paths, replace(config, copies=False), reporter)
            result = replace(result, checks=image_checks(pictures, reporter))
        return result
    if config.features == "thumbnails":  # auto's fallback said why in its own line
        reporter.log("features: the thumbnails (grey cells of each image)")
    pictures = read_images(data.paths, replace(config, checks=True), reporter)  # outliers too
    checks = image_checks(pictures, reporter) if config.checks else None
    return by_thumbnails(data, config, pictures, checks, reporter)


def by_thumbnails(
    data: Unlabelled, config: AuditConfig, pictures: Any, checks: Any, reporter: Reporter
) -> FolderResult:
    """Outliers and copies by the thumbnails `pictures` (pactl.audit.thumbnails.Pictures)."""
    from pactl.audit.copies import CANDIDATES, accepted_copies, propose
    from pactl.verbs.audit import worker_count

    k, workers = max(config.neighbours, CANDIDATES), worker_count(config)
    outlier = outliers(pictures.thumbs, pictures.read, k, config.batch_size)
    copies: list[Copy] = []
    threshold = None
    proposals = propose(data, k, config.batch_size, reporter, workers, pictures) if (
        config.copies
    ) else None  # fmt: skip
    del pictures
    if proposals is not None:
        given = config.copy_threshold
        copies, threshold = accepted_copies(data, proposals, given, reporter, workers, every=True)
        reporter.log(f"copies: {threshold.how}")
    elif config.copies:
        reporter.log("copies: not looked for (fewer than 2 images can be read)")
    return FolderResult(data, outlier, copies, threshold, checks)


def by_features(
    data: Unlabelled, config: AuditConfig, weights: Path, reporter: Reporter
) -> FolderResult:
    """Outliers and copies by the pooled features of an ImageNet network with `weights`."""
    from pactl.audit.copies import CANDIDATES
    from pactl.audit.features import centred, centring, feature_copies, feature_network
    from pactl.verbs.audit import worker_count

    reporter.log(f"features: the pretrained network's (EfficientNet-Lite0, weights {weights})")
    embed = feature_network(weights, config.device, reporter)
    raw, read = embed(data.paths)
    mean = raw[read].mean(axis=0) if read.any() else np.zeros(raw.shape[1], np.float32)
    x = centred(raw, read, mean)
    k, workers = max(config.neighbours, CANDIDATES), worker_count(config)
    outlier = outliers(x, read, k, config.batch_size)
    copies: list[Copy] = []
    threshold = None
    if config.copies:
        copies, threshold = feature_copies(
            data, x, k, config.copy_threshold, centring(embed, mean),
            reporter, workers,
        )  # fmt: skip
    return FolderResult(data, outlier, copies, threshold, None, "pretrained features")


def outliers(thumbs: np.ndarray, read: np.ndarray, k: int, batch_size: int) -> np.ndarray:
    """(N,) 1 - each image's mean cosine to its k nearest by the thumbnail (grey cells less
    their mean, not whitened: whitening scales the axis an odd picture spreads along down to the
    others'); NaN where unread or uniform."""
    from pactl.audit.copies import mean_nearest
    from pactl.index.exact import cosine_index

    x = thumbs.astype(np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    blank = ~read | (norms[:, 0] < 1e-6)
    x = np.where(blank[:, None], 0, x / np.maximum(norms, 1e-12)).astype(np.float32)
    far = np.full(len(x), np.nan, dtype=np.float32)
    if (~blank).sum() < 2:
        return far
    nearest = cosine_index(x)
    for start in range(0, len(x), batch_size):
        rows = np.arange(start, min(start + batch_size, len(x)))
        sims, hits = nearest(x[rows], min(k + 1, len(x)))
        far[rows] = 1.0 - mean_nearest(rows, hits, sims, blank, k)
    far[blank] = np.nan
    return far


def folder_findings(result: FolderResult, top: int) -> list[list[Finding]]:
    """The lists of a label-free audit, each its first `top` rows (0: all): outliers, copies
    within the set by likeness, then each image check's images."""
    from pactl.verbs.audit import check_findings, copy_findings

    data = result.data

    def item(kind: str, rank: int, score: float, row: int, **more: Any) -> Finding:
        return Finding(kind, rank, score, data.paths[row], "", "", id=row, **more)

    seen = np.flatnonzero(np.isfinite(result.outlier))
    order = seen[np.lexsort((seen, -result.outlier[seen]))]
    order = order[:top] if top else order
    outliers = [
        item(
            "outlier", r, float(result.outlier[i]), i,
            reason=f"mean {result.features} cosine to its nearest {1 - result.outlier[i]:.4f}",
        )
        for r, i in enumerate(order.tolist(), start=1)
    ]  # fmt: skip
    lists = [outliers, copy_findings(result.copies, top, item, lambda j: "", data)["copy"]]
    if result.checks is not None:
        lists += check_findings(result.checks, top, item)
    return lists
