"""What sweep points that start alike share: epoch 0 (the row a fresh fit computes, never reused
across a seed or an image size), the BatchNorm calibration and the header check; a bad cache
file is only a miss."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import make_class_folder

import pactl.images
import pactl.runs
import pactl.training.evaluation
import pactl.training.loop
import pactl.training.splits
import pactl.training.start
import pactl.training.trainer
from pactl.checkpoint import clean_state_dict, fingerprint
from pactl.config import ModelConfig, TrainConfig
from pactl.console import QUIET
from pactl.datasets import load_source
from pactl.research.sweep import run_point
from pactl.training import start_cache
from pactl.training.distributed import World

MODEL = ModelConfig(backbone="small", weights="none", embedding_dim=16, image_size=16)
TRAIN = TrainConfig(
    epochs=1, batch_size=8, lr=1e-3, workers=0, val_classes=0, warmup_epochs=0, device="cpu"
)


def point_configs(params: dict[str, Any], seed: int) -> tuple[ModelConfig, TrainConfig]:
    """MODEL and TRAIN with one point's settings."""
    model = {k: v for k, v in params.items() if hasattr(MODEL, k)}
    train = {k: v for k, v in params.items() if not hasattr(MODEL, k)}
    return dataclasses.replace(MODEL, **model), dataclasses.replace(TRAIN, seed=seed, **train)


def rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def without_seconds(run: Path) -> list[dict[str, str]]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows(run)]


def test_points_differing_by_alpha_share_epoch_0_and_a_seed_or_image_size_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # curves.png and the calibration after the last epoch are not under test: a second a fit
    monkeypatch.setattr(pactl.training.loop, "finish_run", lambda *args: None)
    evaluated: list[int] = []
    evaluate_epoch = pactl.training.trainer.evaluate_epoch

    def counted(*args: Any, **kwargs: Any) -> dict[str, float]:
        evaluated.append(1)
        return evaluate_epoch(*args, **kwargs)

    monkeypatch.setattr(pactl.training.loop, "evaluate_epoch", counted)
    monkeypatch.setattr(pactl.training.start, "evaluate_epoch", counted)
    work: dict[str, int] = {"batchnorm": 0, "headers": 0}
    calibration, check = (
        pactl.training.start.run_batchnorm_calibration,
        pactl.images.unreadable_images,
    )

    def calibrated(*args: Any) -> None:
        work["batchnorm"] += 1
        calibration(*args)

    def checked(*args: Any) -> list[tuple[str, str]]:
        work["headers"] += 1
        return check(*args)

    monkeypatch.setattr(pactl.training.start, "run_batchnorm_calibration", calibrated)
    monkeypatch.setattr(pactl.images, "unreadable_images", checked)
    source = str(make_class_folder(tmp_path / "imgs", classes=4, per_class=4))
    manifest = load_source(source, QUIET)
    folder, cache = tmp_path / "sweep", tmp_path / "sweep" / "cache" / "epoch0"

    def point(name: str, seed: int = 0, **params: Any) -> Path:
        configs = point_configs(params, seed)
        run_point(folder, name, configs, source, manifest, QUIET)
        return folder / "points" / name

    first, second = point("a16", alpha=16.0), point("a32", alpha=32.0)
    assert len(evaluated) == 3  # epoch 0 once, epoch 1 of each point
    assert len(list(cache.glob("*.json"))) == 1
    assert work == {"batchnorm": 1, "headers": 1}  # the second point loaded both
    assert rows(first)[0] == rows(second)[0]  # the seconds too: those of the run that measured
    fresh = tmp_path / "fresh"
    pactl.runs.prepare_run_dir(fresh, resume=False, overwrite=False)
    pactl.training.loop.fit(source, manifest, *point_configs({"alpha": 32.0}, 0), fresh, QUIET)
    # The reference evaluated epoch 0 and calibrated BatchNorm itself; epoch 1 equal too:
    # training did not notice.
    assert without_seconds(fresh) == without_seconds(second)
    assert len(evaluated) == 5 and len(list(cache.glob("*.json"))) == 1
    assert work == {"batchnorm": 2, "headers": 2}

    point("a32-seed1", seed=1, alpha=32.0)
    point("a32-size20", alpha=32.0, image_size=20)
    assert len(evaluated) == 9  # each evaluated its own epoch 0
    assert len(list(cache.glob("*.json"))) == 3
    assert work == {"batchnorm": 4, "headers": 2}  # another start each; the same files
    assert len(list((folder / "cache" / "batchnorm").glob("*.pt"))) == 3


def test_the_network_built_from_a_seed_is_the_same_whatever_the_loss() -> None:
    world = World()
    made = {}
    for loss, alpha, seed in [
        ("proxy_anchor", 32.0, 0), ("proxy_anchor", 8.0, 0), ("proxy_nca", 32.0, 0),
        ("triplet", 32.0, 0), ("multi_similarity", 32.0, 0), ("proxy_anchor", 32.0, 1),
    ]:  # fmt: skip
        cfg = dataclasses.replace(TRAIN, loss=loss, alpha=alpha, seed=seed)
        t = pactl.training.trainer.build_trainer(MODEL, cfg, 4, world)
        made[(loss, alpha, seed)] = fingerprint(clean_state_dict(t.net))
    assert len({v for (_, _, seed), v in made.items() if seed == 0}) == 1
    assert made[("proxy_anchor", 32.0, 1)] != made[("proxy_anchor", 32.0, 0)]


def key(model: ModelConfig = MODEL, cfg: TrainConfig = TRAIN) -> str:
    return start_cache.start_key("state", {"test": "data"}, model, cfg, "cpu").digest


def test_every_setting_is_in_the_key_but_those_only_training_reads() -> None:
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert names >= start_cache.TRAINING_ONLY
    for name in names:
        changed = key(cfg=dataclasses.replace(TRAIN, **{name: "another"}))
        assert (changed == key()) == (name in start_cache.TRAINING_ONLY), name
    for f in dataclasses.fields(ModelConfig):
        assert key(model=dataclasses.replace(MODEL, **{f.name: "another"})) != key(), f.name
    other = start_cache.start_key("state2", {"test": "data"}, MODEL, TRAIN, "cpu").digest
    assert other != key()


def test_a_missing_half_written_or_foreign_file_is_a_miss(tmp_path: Path) -> None:
    mine = start_cache.start_key("state", {"test": "data"}, MODEL, TRAIN, "cpu")
    assert start_cache.read_row(tmp_path, mine) is None
    row = start_cache.SharedRow({"recall@1": 0.25, "nmi": float("nan"), "seconds": 1.5}, "run")
    assert start_cache.write_row(tmp_path, mine, row) is None
    found = start_cache.read_row(tmp_path, mine)
    assert found is not None and found.run == "run" and found.row["recall@1"] == 0.25
    path = tmp_path / f"{mine.digest}.json"
    whole = path.read_text()
    path.write_text(whole[: len(whole) // 2])
    assert start_cache.read_row(tmp_path, mine) is None
    # a file under this name that describes another start (a copied or edited cache)
    path.write_text(whole.replace('"state": "state"', '"state": "other"'))
    assert start_cache.read_row(tmp_path, mine) is None
    (tmp_path / "a-file").write_text("not a folder")
    assert start_cache.write_row(tmp_path / "a-file", mine, row) is not None  # only a saving lost


def test_a_header_check_is_reused_only_for_the_same_files_unchanged(tmp_path: Path) -> None:
    from PIL import Image

    files = []
    for i in range(3):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / f"{i}.png")
        files.append(tmp_path / f"{i}.png")
    cache = tmp_path / "cache"
    assert pactl.training.splits.unreadable_files(files, QUIET, cache) == []
    files[1].write_bytes(b"not an image")  # replaced since: another size and time
    bad = pactl.training.splits.unreadable_files(files, QUIET, cache)
    assert [path for path, _ in bad] == [str(files[1])]
    assert len(list((cache / "headers").glob("*.json"))) == 2
    # the stored result is what is read back (the check itself would find nothing wrong here)
    key = start_cache.headers_key(files)
    assert start_cache.read_unreadable(cache / "headers", key) == bad
    assert start_cache.headers_key(files[:2]) != key
    assert start_cache.headers_key(list(reversed(files))) != key
    path = cache / "headers" / f"{key.digest}.json"
    path.write_text(path.read_text()[:20])
    assert start_cache.read_unreadable(cache / "headers", key) is None


def test_batchnorm_buffers_are_read_back_only_under_their_own_key(tmp_path: Path) -> None:
    import torch

    mine = start_cache.batchnorm_key("state", "train", MODEL, 8, 8, "cpu")
    for changed in (
        start_cache.batchnorm_key("other", "train", MODEL, 8, 8, "cpu"),
        start_cache.batchnorm_key("state", "other", MODEL, 8, 8, "cpu"),
        start_cache.batchnorm_key("state", "train", MODEL, 4, 8, "cpu"),
        start_cache.batchnorm_key("state", "train", MODEL, 8, 2, "cpu"),
        start_cache.batchnorm_key("state", "train", MODEL, 8, 8, "cuda"),
        start_cache.batchnorm_key(
            "state", "train", dataclasses.replace(MODEL, image_size=20), 8, 8, "cpu"
        ),
    ):
        assert changed.digest != mine.digest
    buffers = {"bn.running_mean": torch.arange(3.0), "bn.num_batches_tracked": torch.tensor(8)}
    assert start_cache.read_buffers(tmp_path, mine) is None
    assert start_cache.write_buffers(tmp_path, mine, buffers) is None
    found = start_cache.read_buffers(tmp_path, mine)
    assert found is not None and set(found) == set(buffers)
    assert all(torch.equal(found[k], v) for k, v in buffers.items())
    path = tmp_path / f"{mine.digest}.pt"
    path.write_bytes(path.read_bytes()[:50])
    assert start_cache.read_buffers(tmp_path, mine) is None
