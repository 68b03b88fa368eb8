"""--label-noise (pactl.training.noise) and --drop-noisy (pactl.training.robust): the rate, the
seed, only the train labels, small-cluster groups moved whole, the batch share left out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, make_class_folder, one_error, read_csv, run_cli

from pactl.errors import PactlError
from pactl.training.noise import corrupt, parse_noise
from pactl.training.robust import label_doubt


def test_symmetric_noise_changes_exactly_the_rate_to_other_classes() -> None:
    labels = np.repeat(np.arange(4), 10)  # 40 labels of 4 classes
    noise = corrupt(labels, 0.25, "symmetric", seed=3)
    changed = np.flatnonzero(noise.labels != labels)
    assert changed.tolist() == noise.rows.tolist() and len(changed) == 10  # round(0.25 x 40)
    assert set(noise.labels[changed].tolist()) <= {0, 1, 2, 3}
    assert (noise.groups == -1).all()


def test_two_classes_every_changed_label_is_the_other_one() -> None:
    """With classes 0 and 1 the only other class is known by hand: 1 - label."""
    labels = np.array([0, 1] * 10)
    noise = corrupt(labels, 0.5, "symmetric", seed=0)
    assert len(noise.rows) == 10
    assert (noise.labels[noise.rows] == 1 - labels[noise.rows]).all()


def test_symmetric_noise_draws_the_other_classes_uniformly() -> None:
    """Over many rows of class 0 among 5 classes, each of the 4 others gets about a quarter."""
    labels = np.zeros(20_000, dtype=np.int64)
    labels[:4] = [1, 2, 3, 4]
    noise = corrupt(labels, 0.5, "symmetric", seed=1)
    moved = noise.labels[noise.rows][labels[noise.rows] == 0]
    shares = np.bincount(moved, minlength=5)[1:] / len(moved)
    assert np.abs(shares - 0.25).max() < 0.02


def test_noise_is_seeded() -> None:
    labels = np.repeat(np.arange(5), 8)
    a = corrupt(labels, 0.3, "symmetric", seed=7)
    b = corrupt(labels, 0.3, "symmetric", seed=7)
    c = corrupt(labels, 0.3, "symmetric", seed=8)
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.rows, b.rows)
    assert not np.array_equal(a.labels, c.labels)
    assert np.array_equal(corrupt(labels, 0.0, "symmetric", 7).labels, labels)


def test_small_cluster_moves_groups_of_one_class_whole() -> None:
    """Two classes of 16: groups of max(2, 16/8) = 2, the first group of a class stays, so
    rate 0.25 (8 images) moves 4 pairs of one class, each pair to the other class."""
    labels = np.repeat([0, 1], 16)
    noise = corrupt(labels, 0.25, "small_cluster", seed=2)
    assert len(noise.rows) == 8
    assert len(np.unique(labels[noise.rows])) == 1  # one class gave them
    assert sorted(np.bincount(noise.groups).tolist()) == [2, 2, 2, 2]
    assert (noise.labels[noise.rows] == 1 - labels[noise.rows]).all()


def test_small_cluster_groups_share_one_destination_and_the_rate_is_exact() -> None:
    labels = np.repeat(np.arange(6), 24)  # groups of 3
    noise = corrupt(labels, 0.4, "small_cluster", seed=4)
    assert len(noise.rows) == round(0.4 * len(labels))
    for g in np.unique(noise.groups):
        rows = noise.rows[noise.groups == g]
        assert len(np.unique(labels[rows])) == 1 and len(np.unique(noise.labels[rows])) == 1
        assert noise.labels[rows[0]] != labels[rows[0]]
        assert 1 <= len(rows) <= 3
    for c in range(6):  # each class keeps its first group: at least 3 of its own
        assert ((labels == c) & (noise.labels == c)).sum() >= 3


def test_small_cluster_stops_where_every_class_keeps_one_group() -> None:
    labels = np.repeat([0, 1], 8)  # groups of 2: 6 of each class can move
    noise = corrupt(labels, 0.9, "small_cluster", seed=0)
    assert len(noise.rows) == 12


@pytest.mark.parametrize("text", ["1", "1.5", "-0.1", "0.2:gaussian", "x", "nan", "0.2:"])
def test_a_rate_outside_0_1_or_an_unknown_kind_is_one_line(text: str) -> None:
    if text == "0.2:":
        assert parse_noise(text) == (0.2, "symmetric")
        return
    with pytest.raises(PactlError, match="RATE from 0 and below 1"):
        parse_noise(text)


def test_train_refuses_a_bad_rate_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    for option, value in (("--label-noise", "1.0"), ("--drop-noisy", "1")):
        code, _, err = run_cli(
            ["train", str(tmp_path / "imgs"), option, value, *TINY], monkeypatch, capsys
        )
        assert code == 2
        assert option in one_error(err) and "below 1" in err


def test_only_training_labels_change_and_noise_csv_lists_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """8 classes: 4 train (2 of them held out for validation), 4 test; 50% of the 10 images
    left to train on changed, every row of noise.csv an image of those classes, none of
    validation or test."""
    make_class_folder(tmp_path / "imgs", classes=8, per_class=5)
    args = ["train", str(tmp_path / "imgs"), "--epochs", "1", "--name", "n", *TINY]
    code, _, err = run_cli(
        [*args, "--label-noise", "0.5", "--val-classes", "0.25"], monkeypatch, capsys
    )
    assert code == 0, err
    run = tmp_path / "runs" / "n"
    rows = read_csv(run / "noise.csv")
    config = json.loads((run / "config.json").read_text())
    trained = set(config["classes"])
    assert len(trained) == 2 and len(rows) == 5
    for row in rows:
        assert row["label"] in trained and row["noisy_label"] in trained
        assert row["label"] != row["noisy_label"] and row["path"].startswith(row["label"] + "/")
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["label_noise"]["changed"] == len(rows)
    assert provenance["config"]["train_config"]["label_noise"] == "0.5"


def test_drop_noisy_leaves_the_most_doubted_share_out() -> None:
    """Memory of 3 classes in 2-D; in the second epoch a batch of 4 where one image (labelled 0)
    lies on class 1's side: with rate 0.25 exactly that one is left out."""
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
    doubt = label_doubt(0.25, labels, 3, 2, torch.device("cpu"))
    assert doubt is not None and label_doubt(0.0, labels, 3, 2, torch.device("cpu")) is None
    angle = {0: 0.0, 1: 2.1, 2: 4.2}
    points = torch.tensor(
        [[np.cos(angle[c]), np.sin(angle[c])] for c in labels], dtype=torch.float32
    )
    points[2] = torch.tensor([np.cos(2.1), np.sin(2.1)])  # image 2: labelled 0, looks like 1
    everything = torch.arange(9)
    doubt.select(points, torch.as_tensor(labels), everything)  # epoch 0: remembers
    doubt.epoch = 1
    batch = torch.tensor([0, 2, 3, 6])
    kept, kept_labels = doubt.select(points[batch], torch.as_tensor(labels)[batch], batch)
    assert kept.shape == (3, 2)
    assert torch.equal(kept, points[[0, 3, 6]]) and kept_labels.tolist() == [0, 1, 2]


AUTO_TOLERANCE = 0.05  # of the training images: how near auto's count comes to the planted one


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_drop_noisy_auto_leaves_out_about_the_planted_flips(rate: float) -> None:
    """8 tight clusters of 40 in 16-D, `rate` of the labels flipped symmetrically: after the
    memory is filled, auto leaves out within AUTO_TOLERANCE x N of the planted count, and at
    least 90% of the images it leaves out are flipped ones; a batch then loses exactly those."""
    rng = np.random.default_rng(5)
    truth = np.repeat(np.arange(8), 40)
    centres = rng.normal(size=(8, 16))
    points = centres[truth] + 0.25 * rng.normal(size=(len(truth), 16))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    noise = corrupt(truth, rate, "symmetric", seed=1)
    doubt = label_doubt("auto", noise.labels, 8, 16, torch.device("cpu"))
    assert doubt is not None
    vectors, everything = torch.as_tensor(points, dtype=torch.float32), torch.arange(len(truth))
    assert doubt.start_epoch(0) is None  # the first epoch fills the memory, drops nothing
    doubt.select(vectors, torch.as_tensor(noise.labels), everything)
    judged = doubt.start_epoch(1)
    assert judged is not None
    dropped = np.flatnonzero(judged.left_out)
    assert abs(len(dropped) - len(noise.rows)) <= AUTO_TOLERANCE * len(truth)
    assert abs(judged.estimate.overall - rate) <= AUTO_TOLERANCE
    precision = np.isin(dropped, noise.rows).mean()
    assert precision >= 0.9, precision
    batch = torch.arange(0, len(truth), 3)
    kept, _ = doubt.select(vectors[batch], torch.as_tensor(noise.labels)[batch], batch)
    assert len(kept) == len(batch) - int(judged.left_out[batch.numpy()].sum())
    assert f"estimated noise rate {judged.estimate.overall:.3f}" in judged.words(1)


def test_drop_noisy_auto_on_clean_labels_leaves_out_almost_nothing() -> None:
    rng = np.random.default_rng(6)
    labels = np.repeat(np.arange(6), 30)
    points = rng.normal(size=(6, 8))[labels] + 0.2 * rng.normal(size=(len(labels), 8))
    doubt = label_doubt("auto", labels, 6, 8, torch.device("cpu"))
    assert doubt is not None
    doubt.select(
        torch.as_tensor(points, dtype=torch.float32),
        torch.as_tensor(labels),
        torch.arange(len(labels)),
    )
    judged = doubt.start_epoch(1)
    assert judged is not None and judged.dropped <= 0.02 * len(labels)


@pytest.mark.parametrize("value", ["autox", "-1", "1.5", "nan"])
def test_drop_noisy_refuses_a_bad_value_in_one_line(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    code, _, err = run_cli(
        ["train", str(tmp_path / "imgs"), "--drop-noisy", value, *TINY], monkeypatch, capsys
    )
    assert code == 2
    line = one_error(err)
    assert "--drop-noisy" in line and "below 1, or auto" in line


def test_drop_noisy_auto_says_and_records_its_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two epochs on a tiny set with planted noise: the second epoch's line on stderr, and its
    row of metrics.csv holding the same rate and count; config.json keeps `auto`."""
    make_class_folder(tmp_path / "imgs", classes=8, per_class=6)
    args = ["train", str(tmp_path / "imgs"), "--epochs", "2", "--name", "a", *TINY]
    code, _, err = run_cli(
        [*args, "--label-noise", "0.2", "--drop-noisy", "auto", "--val-classes", "0"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    run = tmp_path / "runs" / "a"
    rows = read_csv(run / "metrics.csv")
    assert [r["noise_rate"] for r in rows[:2]] == ["", ""]  # epoch 0 and the first: none
    last = rows[2]
    said = [line for line in err.splitlines() if "--drop-noisy auto" in line]
    assert said == [
        f"epoch 2: --drop-noisy auto: estimated noise rate {float(last['noise_rate']):.3f}; "
        f"{int(last['dropped'])} of 24 training images left out of its loss"
    ]
    assert json.loads((run / "config.json").read_text())["train_config"]["drop_noisy"] == "auto"
