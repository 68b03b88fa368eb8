"""`pactl eval`: a checkpoint's or a backbone's metrics on a dataset's test split, and its
same-item calibration on held-out classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pactl.config import (
    IndexConfig,
    ModelConfig,
)
from pactl.console import Reporter
from pactl.errors import PactlError

if TYPE_CHECKING:
    from pactl.checkpoint import ModelSource


def default_ks(source: str) -> tuple[int, ...]:
    """The K of Recall@K a dataset is reported with: its preset's (the paper's), else 1, 2, 4, 8."""
    from pactl.recipe import PRESETS

    return PRESETS[source].train.eval_ks if source in PRESETS else (1, 2, 4, 8)


def run_source(checkpoint: Path) -> tuple[str, bool] | None:
    """The source a checkpoint's run trained on and whether it followed links, when the
    checkpoint lies in a run folder (beside its config.json); else None."""
    from pactl.runs import resumed_configs

    if not (checkpoint.parent / "config.json").is_file():
        return None
    source, _, cfg = resumed_configs(checkpoint.parent)
    return source, cfg.follow_links


def eval_checkpoint(
    source: str,
    model_from: ModelSource,
    ks: tuple[int, ...],
    device_name: str,
    workers: int,
    reporter: Reporter,
    follow_links: bool = False,
) -> tuple[dict[str, float], ModelConfig]:
    """Recall@K, MAP@R, R-precision and NMI of a checkpoint's or a backbone's network on a
    dataset's test split, and the network's model config."""
    from pactl.checkpoint import open_network
    from pactl.config import TrainConfig
    from pactl.datasets import load_source
    from pactl.embed.cache import run_cache
    from pactl.runtime import resolve_device
    from pactl.training.evaluation import score_network

    manifest = load_source(source, reporter, follow_links=follow_links)
    evaluation = manifest.select(*manifest.eval_splits())
    if not len(evaluation):
        raise PactlError(f"{source} has no test split to evaluate on")
    model, network = open_network(model_from)
    device = resolve_device(device_name)
    model.to(device)
    cfg = TrainConfig(eval_ks=ks, workers=workers)
    cache = run_cache(model_from, network, cfg.amp)
    scores = score_network(
        model, evaluation, network.config, cfg, device, reporter, with_nmi=True, cache=cache
    )
    return scores, network.config


def calibrate_source(
    source: str,
    model_from: ModelSource,
    precision: float,
    device_name: str,
    workers: int,
    reporter: Reporter,
    follow_links: bool = False,
) -> Any:
    """The same-item calibration of a checkpoint's or a backbone's network on a dataset's
    held-out classes (its val split if it has one, else its test split); a checkpoint gets it
    stored, with calibration.png beside it. Returns the pactl.calibrate.Calibration."""
    from pactl.calibrate import CalibrationConfig, calibrate, describe
    from pactl.checkpoint import open_network
    from pactl.config import TrainConfig
    from pactl.datasets import load_source
    from pactl.embed.cache import run_cache
    from pactl.runtime import resolve_device
    from pactl.training.evaluation import calibrate_checkpoint, split_vectors

    manifest = load_source(source, reporter, follow_links=follow_links)
    split = "val" if manifest.has_split("val") else "test"
    part = manifest.select("val") if split == "val" else manifest.select(*manifest.eval_splits())
    if not len(part):
        raise PactlError(f"{source} has no test split to calibrate on")
    device = resolve_device(device_name)
    cfg = TrainConfig(workers=workers, precision=precision)
    model, network = open_network(model_from)
    model.to(device)
    cache = run_cache(model_from, network, cfg.amp)
    embedded = split_vectors(model, part, split, network.config, cfg, device, reporter, None, cache)
    if isinstance(model_from, Path):
        return calibrate_checkpoint(model_from, part, split, cfg, device, reporter, embedded)
    vectors, labels = embedded
    calibration = calibrate(vectors, labels, CalibrationConfig(precision=precision), split)
    reporter.log(f"{describe(calibration)} (not stored: no checkpoint)")
    return calibration


def eval_codes(
    source: str,
    model_from: ModelSource,
    ks: tuple[int, ...],
    device_name: str,
    workers: int,
    reporter: Reporter,
    codes: IndexConfig,
    bundle_dir: Path | None = None,
    follow_links: bool = False,
) -> tuple[dict[str, float], ModelConfig]:
    """eval_checkpoint's metrics of the float vectors, then Recall@K, MAP@R and R-precision of
    their binary codes (codes_*: Hamming order, ties broken by id) and of those codes rescored
    by cosine (rescored_*). The codes are those `pactl index --binary` would make of the
    evaluated (gallery) vectors with `codes` (rotation learned on them, rescoring depth tuned
    on them), or with the rotation and depth of the binary bundle `bundle_dir`."""
    from pactl import metrics
    from pactl.checkpoint import open_network
    from pactl.config import TrainConfig
    from pactl.datasets import load_source
    from pactl.embed.cache import run_cache
    from pactl.index.binary.metrics import code_metrics
    from pactl.runtime import resolve_device
    from pactl.training.evaluation import mean_pairwise_cosine, split_vectors

    manifest = load_source(source, reporter, follow_links=follow_links)
    splits = manifest.eval_splits()
    if not len(manifest.select(*splits)):
        raise PactlError(f"{source} has no test split to evaluate on")
    model, network = open_network(model_from)
    device = resolve_device(device_name)
    model.to(device)
    cfg = TrainConfig(eval_ks=ks, workers=workers)
    cache = run_cache(model_from, network, cfg.amp)
    embedded = [
        split_vectors(
            model, manifest.select(s), s, network.config, cfg, device, reporter, None, cache
        )
        for s in dict.fromkeys(splits[-1:] if splits != ("query", "gallery") else splits)
    ]
    (q, q_labels), (g, g_labels) = embedded[0], embedded[-1]
    symmetric = len(embedded) == 1
    gallery, labels = (None, None) if symmetric else (g, g_labels)
    scores = metrics.score_vectors(q, q_labels, ks, gallery, labels, with_nmi=True, seed=cfg.seed)
    scores["mean_cos"] = mean_pairwise_cosine(g)
    binary = gallery_codes(g, network, codes, bundle_dir, reporter)
    return {**scores, **code_metrics(binary, q, q_labels, g_labels, ks, symmetric)}, network.config


def gallery_codes(
    gallery: np.ndarray,
    network: Any,
    codes: IndexConfig,
    bundle_dir: Path | None,
    reporter: Reporter,
) -> Any:
    """The gallery's codes as a BinaryIndex in memory (ids: its rows): with the binary bundle's
    rotation and rescoring depth, or as `pactl index --binary` chooses them for these vectors
    (a network trained with --bits: its own signs). `network`: the pactl.checkpoint.Network
    that embedded the gallery, which must be the bundle's."""
    from dataclasses import asdict, replace

    from pactl.index.binary.build import build_codes
    from pactl.verbs.index import binary_config

    rotation = None
    if bundle_dir is not None:
        from pactl.index import load_bundle
        from pactl.index.binary.search import BinaryIndex

        bundle = load_bundle(bundle_dir)
        held = bundle.index
        if not isinstance(held, BinaryIndex):
            raise PactlError(f"{bundle_dir} holds float vectors: --index takes a binary bundle")
        if bundle.meta.get("fingerprint") != network.fingerprint:
            raise PactlError(
                f"the network evaluated is not the one that made {bundle_dir} (weights "
                f"fingerprint {network.fingerprint[:12]}): leave out --checkpoint, or give its own"
            )
        rotation = held.rotation
        codes = replace(codes, rescore=held.rescore if codes.rescore is None else codes.rescore)
    meta = {"model_config": asdict(network.config)}
    config = binary_config(replace(codes, binary=True), meta, gallery.shape[1])
    assert config is not None  # binary=True
    ids = np.arange(len(gallery), dtype=np.int64)

    def rows(wanted: np.ndarray) -> np.ndarray:
        return np.where((wanted >= 0) & (wanted < len(gallery)), wanted, -1)

    binary, record = build_codes([(gallery, ids)], config, reporter, gallery, rows, 0, rotation)
    facts = record["binary"]
    reporter.log(
        f"codes: {facts['bits']} bits, rotation {facts['rotation']}, rescoring "
        f"{facts['rescore']} candidates a hit"
    )
    return binary


def bundle_network(bundle_dir: Path) -> Path:
    """The checkpoint that made a bundle (`pactl eval --index`); one line for a backbone's."""
    from pactl.index.reading import check_folder, read_meta
    from pactl.store.generations import read_current
    from pactl.verbs.lineage import bundle_checkpoint

    check_folder(bundle_dir)
    meta = read_current(bundle_dir, lambda gen: read_meta(bundle_dir, gen))
    found = bundle_checkpoint(meta, bundle_dir)
    if found is None:
        raise PactlError(
            f"{bundle_dir} was made by a backbone without training: give its --backbone and "
            "--weights too"
        )
    return found


def eval_qdrant(target: str, collection: str, reporter: Reporter) -> dict[str, float]:
    """`pactl eval --qdrant`: the recall@10 of a Qdrant collection's search as it is tuned
    against pactl's exact neighbours over its vectors, and its ms a query
    (pactl.interop.qdrant.eval_collection)."""
    from pactl.interop.qdrant import eval_collection

    return eval_collection(target, collection, reporter)
