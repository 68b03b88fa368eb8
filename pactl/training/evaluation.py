"""A network's retrieval metrics on a split (Recall@K, MAP@R, R-precision, NMI), and the
same-item calibration of a checkpoint on held-out classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from pactl import checkpoint as ckpt
from pactl.config import ModelConfig, TrainConfig
from pactl.console import Reporter
from pactl.datasets import Manifest
from pactl.embed import embed_files

if TYPE_CHECKING:
    from pactl.calibrate import Calibration
    from pactl.embed.cache import RunCache


def score_network(
    net: nn.Module,
    manifest: Manifest,
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    device: torch.device,
    reporter: Reporter,
    with_nmi: bool = True,
    prepare: bool | None = None,
    keep: list[tuple[np.ndarray, np.ndarray]] | None = None,
    codes: bool = False,
    cache: RunCache | None = None,
) -> dict[str, float]:
    """Recall@K, MAP@R, R-precision (and NMI) on the test split, or query vs gallery.

    `prepare` as in embed_files; training passes False: a network that changes every epoch
    would be traced and frozen anew each time, which small networks do not pay back. `keep`
    (a list) receives the (vectors, labels) scored, where there is no gallery. `codes`: score
    the vectors' sign codes by Hamming distance, ties broken by id (pactl.codes.hamming).
    """
    from pactl import metrics
    from pactl.codes import hamming

    score = hamming.score_codes if codes else metrics.score_vectors

    def vectors(split: str) -> tuple[np.ndarray, np.ndarray]:
        part = manifest.select(split)
        return split_vectors(net, part, split, model_cfg, cfg, device, reporter, prepare, cache)

    if manifest.eval_splits() == ("query", "gallery"):
        q, ql = vectors("query")
        g, gl = vectors("gallery")
        scores = score(q, ql, cfg.eval_ks, g, gl, with_nmi=with_nmi, seed=cfg.seed)
        return {**scores, "mean_cos": mean_pairwise_cosine(g)}
    split = "val" if manifest.has_split("val") else "test"
    v, vl = vectors(split)
    if keep is not None:
        keep.append((v, vl))
    scores = score(v, vl, cfg.eval_ks, with_nmi=with_nmi, seed=cfg.seed)
    return {**scores, "mean_cos": mean_pairwise_cosine(v)}


def split_vectors(
    net: nn.Module,
    part: Manifest,
    split: str,
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    device: torch.device,
    reporter: Reporter,
    prepare: bool | None = None,
    cache: RunCache | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The vectors of a split's readable images and their labels (`cache`: through the run's
    embeddings of `net`, pactl.embed.cache)."""
    if cache is not None:
        from pactl.embed.cache import embed_cached

        done = embed_cached(
            cache, net, part.files(), device, reporter, cfg.workers, cfg.channels_last, prepare
        )
    else:
        done = embed_files(
            net,
            part.files(),
            model_cfg,
            device,
            reporter,
            workers=cfg.workers,
            amp=cfg.amp,
            channels_last=cfg.channels_last,
            prepare=prepare,
            draft=False,
        )
    if done.failed:
        reporter.log(f"evaluation skipped {len(done.failed)} unreadable {split} images")
    return done.vectors, part.labels[done.rows]


def calibrate_checkpoint(
    path: Path,
    part: Manifest,
    split: str,
    cfg: TrainConfig,
    device: torch.device,
    reporter: Reporter,
    embedded: tuple[np.ndarray, np.ndarray] | None = None,
) -> Calibration:
    """The same-item threshold of the checkpoint's network at cfg.precision, measured on the
    pairs of `part` (held-out classes), stored in the checkpoint, its precision-recall curve
    drawn beside it (calibration.png). `embedded`: the (vectors, labels) of `part` by that
    network, where they are at hand (training's evaluation of the best epoch)."""
    from pactl.calibrate import CalibrationConfig, calibrate, describe
    from pactl.report import plot_calibration

    if embedded is None:
        model, model_cfg, _ = ckpt.load_model(path)
        model.to(device)
        embedded = split_vectors(model, part, split, model_cfg, cfg, device, reporter)
    vectors, labels = embedded
    config = CalibrationConfig(precision=cfg.precision, seed=cfg.seed)
    calibration = calibrate(vectors, labels, config, split)
    ckpt.store_calibration(path, calibration.to_dict())
    plot_calibration(calibration, path.parent / "calibration.png")
    reporter.log(f"{path.name}: {describe(calibration)}")
    return calibration


def mean_pairwise_cosine(vectors: np.ndarray) -> float:
    """Mean cosine over all pairs i != j of unit rows, in O(N D): (|sum v|^2 - N) / (N (N - 1)).
    Near 1 means every image maps to about the same point (a collapsed embedding)."""
    n = len(vectors)
    if n < 2:
        return float("nan")
    total = np.asarray(vectors, dtype=np.float64).sum(axis=0)
    return float((total @ total - n) / (n * (n - 1)))
