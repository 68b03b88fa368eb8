"""`pactl audit` (pactl.verbs.audit, pactl.audit.doubt): the witnesses by hand, a hand-built set
with one wrong label and one outlier, copies across splits, the clean manifest, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_class_folder, one_error, read_csv, run_cli

from pactl.audit import doubt
from pactl.audit.copies import Candidates, copy_pairs, likeliest
from pactl.console import QUIET
from pactl.verbs.audit import AuditConfig, choose_centres, score_rows
from pactl.verbs.audit_inputs import Labelled, row_neighbours

FINGERPRINT = "ab" * 32


def test_class_share_is_the_softmax_share_of_the_own_class() -> None:
    # cosines 0.5 (own) against 0.2 and 0.1 at scale 2: e^1 / (e^1 + e^0.4 + e^0.2)
    want = np.exp(1) / (np.exp(1) + np.exp(0.4) + np.exp(0.2))
    got = doubt.class_share(np.array([0.5]), np.array([[0.2, 0.1]]), scale=2)
    assert got[0] == pytest.approx(want)
    # a missing class (NaN) counts for nothing
    assert doubt.class_share(np.array([0.5]), np.array([[0.2, np.nan]]), 2)[0] == pytest.approx(
        np.exp(1) / (np.exp(1) + np.exp(0.4))
    )


def test_neighbour_share_majority_and_blend_by_hand() -> None:
    labels = np.array([[1, 2, 2, 1], [3, 3, 4, 4], [0, 0, 0, 0]])
    valid = np.array([[True, True, True, True], [True, True, True, True], [False] * 4])
    own = np.array([1, 4, 0])
    assert doubt.neighbour_share(labels, valid, own).tolist() == [0.5, 0.5, 0.5]  # none: 0.5
    assert doubt.majority(labels, valid).tolist() == [1, 3, -1]  # ties: the nearer label
    blended = doubt.blend(np.array([0.2, np.nan]), np.array([0.6, 0.9]), weight=0.25)
    assert blended.tolist() == pytest.approx([0.5, 0.9])  # NaN: the neighbours alone


def test_auroc_counts_pairs_ranked_right() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=60).astype(float)  # many ties
    positive = rng.random(60) < 0.3
    pairs = [
        1.0 if a > b else 0.5 if a == b else 0.0
        for a in scores[positive]
        for b in scores[~positive]
    ]
    assert doubt.auroc(scores, positive) == pytest.approx(np.mean(pairs))


def test_class_mean_leaves_the_item_itself_out() -> None:
    x = doubt.unit_rows(np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]))
    sums, counts = np.array([x[0] + x[1], x[2]]), np.array([2, 1])
    centres = doubt.mean_centres(sums, counts)
    said = doubt.ask_classes(x, np.array([0, 0, 1]), centres, scale=4)
    # item 0's own class without it is item 1 alone: cosine 0.8; item 2's class is itself only
    others = x[0] @ x[2]
    want = np.exp(4 * 0.8) / (np.exp(4 * 0.8) + np.exp(4 * others))
    assert said.share[0] == pytest.approx(want)
    assert np.isnan(said.share[2]) and said.other[2] == 0


def hand_set() -> tuple[np.ndarray, list[str], list[str]]:
    """Three classes of 8 around the axes of 4-D space; row 3 lies among class b but is
    labelled a; row 20 (labelled c) points along the fourth axis, away from everything."""
    rng = np.random.default_rng(1)
    axes = np.eye(4)
    vectors, labels, splits = [], [], []
    for c, name in enumerate("abc"):
        for i in range(8):
            vectors.append(axes[c] + 0.15 * rng.standard_normal(4) * [1, 1, 1, 0])
            labels.append(name)
            splits.append("train" if i < 6 else "test")
    vectors[3] = axes[1] + 0.15 * rng.standard_normal(4) * [1, 1, 1, 0]  # looks like b
    vectors[20] = axes[3] + 0.05 * rng.standard_normal(4)
    return doubt.unit_rows(np.array(vectors)).astype(np.float32), labels, splits


def labelled(vectors: np.ndarray, labels: list[str], splits: list[str]) -> Labelled:
    codes, names = np.unique(labels, return_inverse=True)
    return Labelled(
        paths=[f"/d/{i}.png" for i in range(len(labels))],
        codes=names.astype(np.int64),
        names=codes.tolist(),
        splits=splits,
        vectors=lambda r: vectors[r],
        neighbours=row_neighbours(vectors),
        proxies=None,
    )


@pytest.mark.parametrize("score", ["blend", "classes", "neighbours"])
def test_the_wrong_label_and_the_outlier_rank_first(score: str) -> None:
    data = labelled(*hand_set())
    config = AuditConfig(score=score, neighbours=5, copies=False)
    centres, _ = choose_centres(data, config)
    scores, _, _ = score_rows(data, centres, config, QUIET)
    assert int(np.argmax(scores.doubt)) == 3
    assert data.names[scores.suggested[3]] == "b"
    assert int(np.argmax(scores.outlier)) == 20
    assert scores.doubt[3] > 0.5 > np.delete(scores.doubt, [3, 20]).max()


def test_leaks_and_conflicts_are_found_among_planted_copies() -> None:
    """Rows 22, 23 (test) copy rows 0 and 9 (train): the first keeps its label (a leak), the
    second carries another (a leak and a conflict); no other pair reaches the threshold."""
    vectors, labels, splits = hand_set()
    noise = np.random.default_rng(2).standard_normal((2, 4)) * 1e-3
    copies = doubt.unit_rows(vectors[[0, 9]] + noise).astype(np.float32)
    vectors = np.concatenate([vectors[:22], copies])
    labels, splits = [*labels[:22], "a", "c"], [*splits[:22], "test", "test"]
    data = labelled(vectors, labels, splits)
    found, sims = data.neighbours(np.arange(len(data)), 5)
    near = neighbour_pairs(found, sims)
    pairs = {(c.kind, c.row, c.other) for c in copy_pairs(data, near, 0.999)}
    assert pairs == {("leak", 22, 0), ("leak", 23, 9), ("conflict", 9, 23)}


def neighbour_pairs(
    found: np.ndarray, sims: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low row, high row, score) of each pair among the neighbours `found` (N, k: -1 where
    none) at `sims`, once: the pairs copy_pairs and precise_likeness take."""
    rows = np.repeat(np.arange(len(found)), found.shape[1])
    other, score = found.ravel(), sims.ravel()
    keep = other >= 0
    pair = np.stack([np.minimum(rows, other)[keep], np.maximum(rows, other)[keep]], axis=1)
    pair, first = np.unique(pair, axis=0, return_index=True)
    return pair[:, 0], pair[:, 1], score[keep][first]


def test_likeliest_keeps_each_pair_once_at_its_best_and_each_copys_k_best() -> None:
    """Found by hand: copy 1 of original 0 through two boxes (0.9 and 0.95: kept once, box 2),
    copy 1 of 2 at 0.8 and of 3 at 0.85 (k = 2: 3 kept, 2 not), a row with itself, a missing
    hit (-1) and a blank row (4) left out."""
    found = [
        (np.array([[0, 2]]), np.array([[1, 1]]), np.array([[0.9, 0.8]]), np.array([[0, 0]])),
        (
            np.array([[0, 3, 1, -1, 4]]),
            np.array([[1, 1, 1, 1, 0]]),
            np.array([[0.95, 0.85, 1.0, 0.99, 0.99]]),
            np.full((1, 5), 2),
        ),
    ]
    blank = np.array([False, False, False, False, True])
    got = likeliest(found, blank, 2)
    assert isinstance(got, Candidates)
    rows = sorted(
        zip(
            got.copy.tolist(),
            got.original.tolist(),
            np.round(got.cosine.astype(np.float64), 4).tolist(),
            got.box.tolist(),
            strict=True,
        )
    )
    assert rows == [(1, 0, 0.95, 2), (1, 3, 0.85, 2)]


def write_vectors(folder: Path, vectors: np.ndarray, labels: list[str]) -> None:
    """A vectors folder as `pactl embed` writes it, with the given labels."""
    folder.mkdir(parents=True)
    np.save(folder / "vectors.npy", vectors)
    rows = [f"{i},/d/{i}.png,{label},0,0" for i, label in enumerate(labels)]
    (folder / "items.csv").write_text("id,path,label,size,mtime_ns\n" + "\n".join(rows) + "\n")
    meta = {
        "format": "pactl.vectors", "version": 1, "dimension": vectors.shape[1],
        "count": len(vectors), "metric": "ip", "checkpoint": str(folder / "none.pt"),
        "fingerprint": FINGERPRINT, "model_config": {},
    }  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(meta))


def test_audit_of_a_bundle_and_the_manifest_without_the_chosen_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    vectors, labels, _ = hand_set()
    write_vectors(tmp_path / "vec", vectors, labels)
    assert run_cli(["index", "vec", "--out", "b", "-q"], monkeypatch, capsys)[0] == 0
    args = ["audit", "b", "--neighbours", "5", "--copy-threshold", "0.999", "-f", "csv"]
    code, out, err = run_cli([*args, "--top", "3"], monkeypatch, capsys)
    assert code == 0, err
    rows = [line.split(",") for line in out.splitlines()[1:]]
    assert rows[0][:4] == ["label", "1", rows[0][2], "/d/3.png"] and rows[0][6] == "b"
    assert [r[3] for r in rows if r[0] == "outlier"][0] == "/d/20.png"
    # the user keeps two of the suspects to drop; --drop-above adds every label doubted > 0.5
    (tmp_path / "picked.csv").write_text("kind,path\nlabel,/d/3.png\nlabel,/d/7.png\n")
    code, _, err = run_cli(
        [*args, "--drop", "picked.csv", "--write-manifest", "clean.csv"], monkeypatch, capsys
    )
    assert code == 0, err
    kept = [r["path"] for r in read_csv(tmp_path / "clean.csv")]
    assert kept == [f"/d/{i}.png" for i in range(24) if i not in (3, 7)]
    _, ranked, _ = run_cli([*args, "--top", "0"], monkeypatch, capsys)
    doubted = {
        r[3] for r in (line.split(",") for line in ranked.splitlines()) if r[0] == "label"
        and float(r[2]) >= 0.5
    }  # fmt: skip
    assert "/d/3.png" in doubted
    run_cli([*args, "--drop-above", "0.5", "--write-manifest", "c2.csv"], monkeypatch, capsys)
    kept = [r["path"] for r in read_csv(tmp_path / "c2.csv")]
    assert kept == [f"/d/{i}.png" for i in range(24) if f"/d/{i}.png" not in doubted]
    first = [r[3] for r in (line.split(",") for line in ranked.splitlines()) if r[0] == "label"]
    run_cli([*args, "--drop-top", "2", "--write-manifest", "c3.csv"], monkeypatch, capsys)
    kept = [r["path"] for r in read_csv(tmp_path / "c3.csv")]
    assert kept == [f"/d/{i}.png" for i in range(24) if f"/d/{i}.png" not in first[:2]]


def test_a_bundle_without_labels_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    vectors, _, _ = hand_set()
    write_vectors(tmp_path / "vec", vectors, [""] * len(vectors))
    assert run_cli(["index", "vec", "--out", "b", "-q"], monkeypatch, capsys)[0] == 0
    code, _, err = run_cli(["audit", "b", "--no-copies"], monkeypatch, capsys)
    assert code == 1 and "holds no labels: give --source" in one_error(err)


def test_a_run_without_proxies_asked_for_them_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import TINY

    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    train = ["train", "imgs", "--epochs", "1", "--name", "ms", "--loss", "multi_similarity"]
    assert run_cli([*train, *TINY, "-q"], monkeypatch, capsys)[0] == 0
    code, _, err = run_cli(
        ["audit", "runs/ms", "--centres", "proxies", "--no-copies"], monkeypatch, capsys
    )
    assert code == 2 and "has no proxies" in one_error(err)
    code, out, err = run_cli(["audit", "runs/ms", "--no-copies", "-f", "csv"], monkeypatch, capsys)
    assert code == 0, err  # the class means, the default, need no proxies
    assert out.count("\nlabel,") == 16


def test_manifest_options_need_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "b").mkdir()
    code, _, err = run_cli(["audit", "b", "--write-manifest", "x.csv"], monkeypatch, capsys)
    assert code == 2 and "--drop FILE, --drop-above DOUBT or --drop-top N" in one_error(err)
    code, _, err = run_cli(["audit", "b", "--drop-above", "0.5"], monkeypatch, capsys)
    assert code == 2 and "give it too" in one_error(err)


def test_copies_of_training_images_in_the_test_split_are_found_as_leaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two training images copied byte for byte into the test split, one under its own label
    and one under a test class's: both leaks at the calibrated threshold, the second a conflict
    too; the contact sheet has a row per suspect and 1 + 2 x 3 tiles a row."""
    import shutil

    from conftest import TINY
    from PIL import Image

    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    rows = ["path,label,split"]
    for c in range(4):
        rows += [f"imgs/class_{c}/{n}.png,c{c},{'train' if c < 2 else 'test'}" for n in range(4)]
    shutil.copyfile(imgs / "class_0" / "1.png", tmp_path / "leak.png")
    shutil.copyfile(imgs / "class_1" / "2.png", tmp_path / "relabelled.png")
    (tmp_path / "planted.csv").write_text(
        "\n".join([*rows, "leak.png,c0,test", "relabelled.png,c3,test"]) + "\n"
    )
    train = ["train", "planted.csv", "--epochs", "1", "--name", "t", "--val-classes", "0"]
    assert run_cli([*train, *TINY, "-q"], monkeypatch, capsys)[0] == 0
    args = ["audit", "runs/t", "-f", "csv", "--sheet", "s.png", "--top", "3"]  # cosine 1 first
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    found = {
        (r["kind"], Path(r["path"]).name, Path(r["other"]).name)
        for r in read_csv_text(out)
        if r["kind"] in ("leak", "conflict")
    }
    assert ("leak", "leak.png", "1.png") in found and ("leak", "relabelled.png", "2.png") in found
    assert any(k == "conflict" and "relabelled.png" in (a, b) for k, a, b in found)
    cell = 96 + 2 * 5
    assert Image.open(tmp_path / "s.png").size == (7 * cell, 3 * (cell + 14))


def read_csv_text(text: str) -> list[dict[str, str]]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(text)))


def test_a_run_with_planted_noise_is_audited_on_the_labels_it_trained_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import TINY

    make_class_folder(tmp_path / "imgs", classes=6, per_class=5)
    train = ["train", "imgs", "--epochs", "1", "--name", "n", "--label-noise", "0.4"]
    assert run_cli([*train, "--val-classes", "0", *TINY, "-q"], monkeypatch, capsys)[0] == 0
    noisy = {r["path"]: r["noisy_label"] for r in read_csv(tmp_path / "runs" / "n" / "noise.csv")}
    code, out, err = run_cli(["audit", "runs/n", "--top", "0", "--no-copies"], monkeypatch, capsys)
    assert code == 0, err
    audited = {
        str(Path(r["path"]).relative_to(tmp_path / "imgs")): r["label"]
        for r in read_csv_text(out)
        if r["kind"] == "label"
    }
    assert len(noisy) == 6 and all(audited[p] == label for p, label in noisy.items())
    assert "the 6 labels --label-noise changed, among the 15 training rows: AUROC" in err


def test_the_thumbnail_of_a_step_matches_a_float64_blur_and_cell_mean() -> None:
    """A 64 x 64 step (black left, white right) is already the base's size: the thumbnail is the
    step blurred by a Gaussian of 64 x 1.5/28 px, averaged over 12 cells of 5 or 6 px (edges at
    round(64 i / 12)), its mean taken off."""
    from PIL import Image
    from scipy.ndimage import gaussian_filter1d

    from pactl.audit.thumbnails import SIDE, thumbnail

    step = np.zeros((64, 64), dtype=np.uint8)
    step[:, 32:] = 255
    got = thumbnail(Image.fromarray(step)).reshape(SIDE, SIDE)
    profile = gaussian_filter1d(step[0].astype(np.float64), 64 * 1.5 / 28, mode="nearest")
    cuts = [round(64 * i / 12) for i in range(13)]
    want = np.array([profile[a:b].mean() for a, b in zip(cuts, cuts[1:], strict=False)])
    want -= want.mean()
    assert np.abs(got - want[None, :]).max() < 3.0  # PIL's blur is three box passes
    assert np.allclose(got, got[:1]) and np.allclose(got[0], -got[0, ::-1], atol=1.0)


def test_box_thumbnails_are_the_cell_means_of_the_box_by_brute_force() -> None:
    """Each box's thumbnail against float64 means of the base's pixels in each cell (edges:
    the box's sides in base pixels, split in 12 and rounded), for boxes of BOXES and a thin
    one whose cells are forced a pixel apart."""
    from pactl.audit.thumbnails import BOXES, GRID, SIDE, box_thumbnails

    bases = np.random.default_rng(5).integers(0, 256, size=(3, GRID, GRID)).astype(np.uint8)
    for box in (*BOXES[:: len(BOXES) // 7], (0.5, 0.25, 0.6, 0.5)):
        cols = np.round(np.linspace(box[0] * GRID, box[2] * GRID, SIDE + 1)).astype(int)
        rows = np.round(np.linspace(box[1] * GRID, box[3] * GRID, SIDE + 1)).astype(int)
        cols = np.maximum.accumulate(cols - np.arange(SIDE + 1)) + np.arange(SIDE + 1)
        cols -= max(0, cols[-1] - GRID)
        want = np.array(
            [[[b[rows[i]:rows[i + 1], cols[j]:cols[j + 1]].astype(np.float64).mean()
               for j in range(SIDE)] for i in range(SIDE)] for b in bases]
        ).reshape(3, -1)  # fmt: skip
        want -= want.mean(axis=1, keepdims=True)
        assert np.abs(box_thumbnails(bases, box) - want).max() < 1e-3, box


def test_the_crop_boxes_cover_every_crop_of_80_to_100_percent_within_a_step() -> None:
    """Every box lies inside the image; any crop keeping 80 to 100% of each side, wherever it
    lies, has a box whose four edges are each within 5% of the side of the crop's (2,000 random
    crops; sizes are 5% apart and centres 5% apart)."""
    from pactl.audit.thumbnails import BOXES, WHOLE

    boxes = np.array(BOXES)
    assert BOXES[0] == WHOLE and len(set(BOXES)) == len(BOXES)
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2:] <= 1 + 1e-9).all()
    rng = np.random.default_rng(0)
    for _ in range(2_000):
        keep = rng.uniform(0.8, 1.0, size=2)
        start = rng.uniform(0, 1 - keep)
        crop = np.r_[start, start + keep]
        assert np.abs(boxes - crop).max(axis=1).min() <= 0.05


def test_whitening_weighs_each_axis_by_its_spread_by_hand() -> None:
    """Thumbnails +-3 e1 and +-1 e2: spreads sqrt(4.5) and sqrt(0.5). The query 3 e1 + e2 is
    whitened to (sqrt 2, sqrt 2): cosine 1/sqrt 2 to the first thumbnail, where raw cosine says
    3/sqrt 10."""
    from pactl.audit.thumbnails import fit_whitening

    thumbs = np.zeros((4, 5))
    thumbs[:, 0] = [3, -3, 0, 0]
    thumbs[:, 1] = [0, 0, 1, -1]
    whiten = fit_whitening(thumbs, np.random.default_rng(0), dims=2)
    assert sorted(whiten.spread.tolist()) == pytest.approx(
        [np.sqrt(0.5) + 1e-3 * np.sqrt(4.5), np.sqrt(4.5) * 1.001]
    )
    got = whiten(np.array([[3.0, 1, 0, 0, 0], thumbs[0]]))
    assert float(got[0] @ got[1]) == pytest.approx(1 / np.sqrt(2), abs=2e-3)
    assert whiten(np.zeros((1, 5))).tolist() == [[0.0, 0.0]]  # unread: matches nothing


def smooth_image(rng: np.random.Generator, side: int = 48) -> Any:
    """A seeded picture of blobs: 6 x 6 random colours, smoothly enlarged."""
    from PIL import Image

    small = rng.integers(0, 256, size=(6, 6, 3)).astype(np.uint8)
    return Image.fromarray(small).resize((side, side), Image.Resampling.BICUBIC)


def smooth_files(folder: Path, n: int, seed: int) -> list[str]:
    """n seeded smooth_image pictures saved as folder/0.png, 1.png, ...: their paths."""
    rng = np.random.default_rng(seed)
    paths = [str(folder / f"{i}.png") for i in range(n)]
    for path in paths:
        smooth_image(rng).save(path)
    return paths


def planted_set(tmp_path: Path) -> Labelled:
    """48 training pictures of 8 classes, 24 distinct test pictures; in the test split also a
    resized (row 72), a cropped (73) and a JPEG (74, under another label) copy of training
    pictures 0, 7 and 14, and a distinct picture of class c0 (75)."""
    from PIL import Image

    rng = np.random.default_rng(3)
    rows: list[tuple[str, str, str]] = []
    for i in range(72):
        path = tmp_path / f"{i}.png"
        smooth_image(rng).save(path)
        rows.append((str(path), f"c{i // 6}", "train" if i < 48 else "test"))
    original = [Image.open(rows[i][0]) for i in (0, 7, 14)]
    original[0].resize((29, 29), Image.Resampling.BICUBIC).save(tmp_path / "resized.png")
    original[1].crop((2, 1, 46, 45)).save(tmp_path / "cropped.png")
    original[2].save(tmp_path / "jpeg.jpg", quality=40)
    smooth_image(rng).save(tmp_path / "mate.png")
    rows += [
        (str(tmp_path / "resized.png"), "c0", "test"),
        (str(tmp_path / "cropped.png"), "c1", "test"),
        (str(tmp_path / "jpeg.jpg"), "c11", "test"),
        (str(tmp_path / "mate.png"), "c0", "test"),
    ]
    paths, labels, splits = (list(x) for x in zip(*rows, strict=True))
    data = labelled(np.eye(len(rows), 4, dtype=np.float32), labels, splits)
    data.paths = paths
    return data


def test_resized_cropped_and_recompressed_copies_across_splits_are_found(tmp_path: Path) -> None:
    """48 training pictures of 8 classes, 24 distinct test pictures; the test split also holds
    a resized, a cropped and a JPEG copy of three training pictures (the last under another
    label) and a distinct picture of a training class: at the calibrated threshold the three
    copies are found, the class-mate is not, and nothing else is reported."""
    from pactl.audit.copies import find_copies

    data = planted_set(tmp_path)
    copies, threshold = find_copies(data, 5, None, 16, QUIET)
    found = {(c.kind, c.row, c.other) for c in copies}
    assert found == {("leak", 72, 0), ("leak", 73, 7), ("leak", 74, 14), ("conflict", 14, 74)}
    assert "copies made of" in threshold.how  # calibrated, not given


def test_the_precise_likeness_counts_pairs_within_splits_as_the_false_ones_by_hand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows 0-3 train, 4-7 test: 16 pairs cross splits, 12 lie within them (x4/3). Within:
    (0, 1) at 0.9, (4, 5) at 0.5 and the identical (2, 3), set aside; across: 0.99, 0.95, 0.7.
    At 1% false, no pair within a split may reach the threshold: just above 0.9. At 50%, 0.7
    holds: 4/3 x 1 pair within at or above it against 0.5 x 3 pairs across."""
    from pactl.audit import copies

    found = np.array([[1, 4], [5, 0], [6, 3], [2, -1], [0, 5], [4, 1], [2, -1], [-1, -1]])
    sims = np.array(
        [[0.9, 0.99], [0.95, 0.9], [0.7, 1.0], [1.0, -np.inf], [0.99, 0.5], [0.5, 0.95],
         [0.7, -np.inf], [-np.inf, -np.inf]],
        dtype=np.float32,
    )  # fmt: skip
    data = labelled(np.eye(8, 4, dtype=np.float32), list("aabbccdd"), ["train"] * 4 + ["test"] * 4)
    pairs = neighbour_pairs(found, sims)
    likeness, words = copies.precise_likeness(data, pairs)
    assert likeness == np.nextafter(np.float32(0.9), np.float32(np.inf)) and "x1.33" in words
    monkeypatch.setattr(copies, "COPY_FALSE", 0.5)
    assert copies.precise_likeness(data, pairs)[0] == pytest.approx(0.7)


def test_at_most_align_most_candidate_pairs_are_aligned_the_likeliest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four candidate pairs reach the floor and ALIGN_MOST is 2: the two of the highest cosine
    are aligned, stderr says how many reached it, and a pair under the floor is never aligned."""
    import io

    from rich.console import Console

    from pactl.audit import copies
    from pactl.console import Reporter

    paths = smooth_files(tmp_path, 5, seed=0)
    data = labelled(np.eye(5, 4, dtype=np.float32), list("abcde"), ["train"] * 5)
    data.paths = paths
    candidates = copies.Candidates(
        original=np.array([0, 1, 2, 3, 0]),
        copy=np.array([1, 2, 3, 4, 4]),
        cosine=np.array([0.9, 0.95, 0.6, 0.99, 0.1], dtype=np.float32),
        box=np.zeros(5, dtype=np.int64),
    )
    monkeypatch.setattr(copies, "ALIGN_MOST", 2)
    said = io.StringIO()
    low, high, _ = copies.aligned_pairs(data, candidates, 0.5, Reporter(Console(file=said)))
    assert sorted(zip(low.tolist(), high.tolist(), strict=True)) == [(1, 2), (3, 4)]
    assert "4 candidate pairs reach cosine 0.5000; the 2 likeliest are aligned" in said.getvalue()


def test_audit_reads_a_benchmark_manifest_as_download_prepares_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """CUB-200-2011 in its published layout (4 classes x 2 images, a local archive), prepared
    as `pactl download` does; one test image replaced by a training image's bytes: `pactl audit
    RUN --source` the prepared folder reports that pair as a leak and a conflict, by the
    manifest's paths, splits and class names."""
    from conftest import TINY
    from test_benchmarks import _local_spec, _prepare, build_cub

    archives, _ = build_cub(tmp_path)
    folder, _ = _prepare(_local_spec("cub200", archives, None), tmp_path, tmp_path)
    rows = read_csv(folder / "manifest.csv")
    train = next(r for r in rows if r["split"] == "train")
    test = next(r for r in rows if r["split"] == "test")
    (folder / test["path"]).write_bytes((folder / train["path"]).read_bytes())
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    monkeypatch.chdir(tmp_path)
    assert (
        run_cli(
            ["train", "imgs", "--epochs", "1", "--name", "t", *TINY, "-q"], monkeypatch, capsys
        )[0]
        == 0
    )
    code, out, err = run_cli(
        ["audit", "runs/t", "--source", str(folder), "-f", "csv", "--top", "0"], monkeypatch, capsys
    )
    assert code == 0, err
    found = {
        (
            r["kind"],
            Path(r["path"]).name,
            r["split"],
            r["label"],
            Path(r["other"]).name,
            r["other_split"],
        )
        for r in read_csv_text(out)
        if r["kind"] in ("leak", "conflict")
    }
    leak = (
        "leak",
        Path(test["path"]).name,
        "test",
        test["class_name"],
        Path(train["path"]).name,
        "train",
    )
    assert leak in found
    assert any(k == "conflict" for k, *_ in found)


def test_thumbnails_read_by_processes_are_those_read_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seven pictures and an unreadable file, read in chunks of 3 by 2 processes: the same
    thumbnails, read flags and bases as read in this process."""
    from pactl.audit import thumbnails

    paths = smooth_files(tmp_path, 7, seed=4)
    (tmp_path / "bad.png").write_bytes(b"no")
    paths.insert(3, str(tmp_path / "bad.png"))
    monkeypatch.setattr(thumbnails, "READ_CHUNK", 3)
    monkeypatch.setattr(thumbnails, "READ_PARALLEL_FROM", 1)
    here = thumbnails.read_pictures(paths, keep_bases=True)
    apart = thumbnails.read_pictures(paths, keep_bases=True, workers=2)
    assert here.read.tolist() == apart.read.tolist() == [True] * 3 + [False] + [True] * 4
    assert np.array_equal(here.thumbs, apart.thumbs) and np.array_equal(here.bases, apart.bases)


def test_without_crop_boxes_whole_copies_are_still_found_and_the_floor_ignores_crops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set of the test above with crop boxes off (as above CROP_ITEMS images): the resized
    and the JPEG copies are found; the floor candidates must reach is the 1st percentile of
    the resized and recompressed copies made, not lowered by the crops' whole-image cosines."""
    from pactl.audit import copies

    data = planted_set(tmp_path)
    monkeypatch.setattr(copies, "CROP_ITEMS", 0)
    floors: list[float] = []
    real = copies.proposal_floor

    def spy(made: Any, crops: bool) -> float:
        floors.append(real(made, crops))
        whole = ~np.isin(made.changes, ("crop", "all"))
        assert not crops and floors[-1] == np.quantile(made.cosines[whole], 0.01, method="lower")
        assert floors[-1] > np.quantile(made.cosines, 0.01, method="lower")
        return floors[-1]

    monkeypatch.setattr(copies, "proposal_floor", spy)
    found = {(c.kind, c.row, c.other) for c in copies.find_copies(data, 5, None, 16, QUIET)[0]}
    assert {("leak", 72, 0), ("leak", 74, 14)} <= found and floors


def test_the_sheet_shows_the_given_labels_nearest_even_when_none_is_among_the_k_nearest() -> None:
    """A suspect is one because its nearest carry another label: the sheet's "given label"
    column still shows the nearest images of its own class (searched within the class, cosines
    brute-force), not an empty column."""
    from pactl.verbs.audit import AuditResult, Scores, sheet_rows
    from pactl.verbs.audit_inputs import Labelled

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(9, 4))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    codes = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1])  # row 0, labelled 0, is the suspect
    data = Labelled(
        paths=[f"/p/{i}.png" for i in range(9)],
        codes=codes,
        names=["cat", "dog"],
        splits=[""] * 9,
        vectors=lambda r: vectors[r],
        neighbours=row_neighbours(vectors),
        proxies=None,
    )
    found = np.array([[4, 5, 6]] + [[-1, -1, -1]] * 8)  # its k nearest: all dogs
    doubt = np.array([0.9] + [0.0] * 8)
    scores = Scores(doubt, doubt, doubt, np.array([1] + [-1] * 8), doubt)
    result = AuditResult(data, scores, [], None, "", found, np.zeros((9, 3)))
    [(suspect, given, suggested)] = sheet_rows(result, top=1, shown=2)
    assert suspect == ("/p/0.png", "cat→dog", 0.9)
    cosines = vectors[1:4] @ vectors[0]
    best = np.argsort(-cosines)[:2] + 1
    assert [t[0] for t in given] == [f"/p/{j}.png" for j in best]
    assert [t[2] for t in given] == pytest.approx(np.sort(cosines)[::-1][:2])
    assert {t[1] for t in given} == {"cat"} and {t[1] for t in suggested} == {"dog"}
    dog = vectors[4:] @ vectors[0]
    assert [t[2] for t in suggested] == pytest.approx(np.sort(dog)[::-1][:2])
