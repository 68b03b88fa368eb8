"""Same-item search end to end: the calibration a run stores, and what reads it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import train_tiny
from test_calibrate import _brute_force

from pactl import checkpoint as ckpt
from pactl.calibrate import read_calibration
from pactl.errors import PactlError


def test_training_stores_the_threshold_of_the_held_out_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pactl.config import TrainConfig
    from pactl.console import QUIET
    from pactl.datasets import load_source
    from pactl.embed import embed_files
    from pactl.training.splits import check_splits

    run = train_tiny(tmp_path, monkeypatch, capsys, classes=8, per_class=5)
    payload = ckpt.load(run / "best.pt")
    cal = read_calibration(payload["calibration"], "best.pt")
    assert (run / "calibration.png").is_file()
    # The validation classes, embedded here with best.pt, give the same threshold by brute force.
    splits = check_splits(load_source(str(tmp_path / "imgs"), QUIET), TrainConfig(batch_size=8))
    model, config, _ = ckpt.load_model(run / "best.pt")
    done = embed_files(model, splits.val.files(), config, torch.device("cpu"), QUIET)
    assert cal.split == "val" and cal.images == len(splits.val) == len(done.rows)
    threshold, recall = _brute_force(done.vectors, splits.val.labels[done.rows], cal.precision)
    assert cal.threshold == pytest.approx(threshold, abs=1e-4)
    assert cal.recall == pytest.approx(recall)


def test_damaged_calibration_is_refused_and_old_checkpoints_load(tmp_path: Path) -> None:
    from pactl.config import ModelConfig

    state = {"w": torch.zeros(2)}
    payload = ckpt.export_payload(state, ModelConfig(backbone="small", weights="none"), [], 1, {})
    ckpt.save(tmp_path / "old.pt", payload)
    assert "calibration" not in ckpt.load(tmp_path / "old.pt")
    ckpt.save(tmp_path / "bad.pt", {**payload, "calibration": {"format": "pactl.calibration"}})
    with pytest.raises(PactlError, match="bad.pt: calibration"):
        ckpt.load(tmp_path / "bad.pt")


def test_bundles_carry_the_calibration_and_dedup_uses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pactl.calibrate import same_item_threshold
    from pactl.config import EmbedConfig, IndexConfig, ModelConfig
    from pactl.console import QUIET
    from pactl.errors import UsageError
    from pactl.verbs.dedup import dedup
    from pactl.verbs.index import index_images
    from pactl.verbs.lineage import calibration_of
    from pactl.verbs.vector_sources import gather_vectors

    run = train_tiny(tmp_path, monkeypatch, capsys, classes=8, per_class=5)
    stored = ckpt.load(run / "best.pt")["calibration"]
    imgs = str(tmp_path / "imgs")
    bundle, meta = index_images(
        imgs, run / "best.pt", tmp_path / "b", None, IndexConfig(), EmbedConfig("cpu"), QUIET
    )
    assert meta["calibration"] == stored
    threshold, how = same_item_threshold(calibration_of(meta), "b")
    assert threshold == stored["threshold"] and "calibrated on the val classes" in how
    # dedup at the calibrated threshold: the groups of all pairs at or above it, by brute force.
    found = dedup(bundle, None, None, strict=False, keep="first", reporter=QUIET)
    vectors, items, _ = gather_vectors(bundle / "vectors")
    assert found.threshold == threshold
    assert {frozenset(m.id for m in g) for g in found.members} == brute_groups(
        np.asarray(vectors), items.ids, threshold
    )
    assert [len(g) for g in found.removable or []] == [len(g) - 1 for g in found.members]
    same = dedup(bundle / "vectors", None, None, strict=False, keep=None, reporter=QUIET)
    assert [[m.id for m in g] for g in same.members] == [[m.id for m in g] for g in found.members]
    # A backbone's bundle has none, and says what to give instead.
    backbone = ModelConfig(backbone="small", weights="none", embedding_dim=0, image_size=16)
    _, plain = index_images(
        imgs, backbone, tmp_path / "p", None, IndexConfig(), EmbedConfig("cpu"), QUIET
    )
    assert plain["calibration"] is None
    with pytest.raises(UsageError, match="no same-item calibration.*--threshold"):
        same_item_threshold(calibration_of(plain), "p")


def brute_groups(vectors: np.ndarray, ids: np.ndarray, t: float) -> set[frozenset[int]]:
    """Connected components of the graph of pairs at or above t, in float64."""
    x = vectors.astype(np.float64)
    same = x @ x.T >= t - 1e-6
    label = list(range(len(x)))

    def root(i: int) -> int:
        while label[i] != i:
            i = label[i]
        return i

    for i, j in zip(*np.nonzero(same), strict=True):
        label[max(root(i), root(j))] = min(root(i), root(j))
    groups: dict[int, set[int]] = {}
    for i in range(len(x)):
        groups.setdefault(root(i), set()).add(int(ids[i]))
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def test_eval_calibrates_a_checkpoint_and_a_backbone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pactl.config import ModelConfig
    from pactl.console import QUIET
    from pactl.verbs.evaluate import calibrate_source

    run = train_tiny(tmp_path, monkeypatch, capsys, classes=8, per_class=5)
    payload = ckpt.load(run / "best.pt")
    del payload["calibration"]
    ckpt.save(run / "best.pt", payload)  # as a checkpoint from before calibration
    imgs = str(tmp_path / "imgs")
    cal = calibrate_source(imgs, run / "best.pt", 0.9, "cpu", 0, QUIET)
    assert cal.split == "test" and cal.precision == 0.9
    assert ckpt.load(run / "best.pt")["calibration"] == cal.to_dict()
    backbone = ModelConfig(backbone="small", weights="none", embedding_dim=0, image_size=16)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    plain = calibrate_source(imgs, backbone, 0.9, "cpu", 0, QUIET)
    assert plain.images == cal.images
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing stored
