"""`pactl dedup`, `query --same-item` and `eval --calibrate` from the command line."""

from __future__ import annotations

import csv
import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import make_class_folder, one_error, run_cli
from PIL import Image

MODEL = ["--backbone", "small", "--weights", "none", "--image-size", "16"]


def folder_with_copies(root: Path) -> dict[str, Path]:
    """Class images plus copies of two of them: one identical (newer), one re-saved bigger."""
    imgs = make_class_folder(root / "imgs", classes=4, per_class=3)
    a, b = imgs / "class_0" / "0.png", imgs / "class_1" / "0.png"
    shutil.copyfile(a, imgs / "class_0" / "copy.png")
    os.utime(imgs / "class_0" / "copy.png", ns=(2 * 10**18, 2 * 10**18))
    Image.open(b).save(imgs / "class_1" / "big.png", compress_level=0)  # same pixels, larger
    return {
        "a": a,
        "b": b,
        "copy": imgs / "class_0" / "copy.png",
        "big": imgs / "class_1" / "big.png",
    }


def brute_groups(folder: Path, t: float) -> list[set[str]]:
    import csv as csvlib

    x = np.load(folder / "vectors.npy").astype(np.float64)
    with open(folder / "items.csv", newline="") as f:
        paths = [row["path"] for row in csvlib.DictReader(f)]
    same = x @ x.T >= t
    label = list(range(len(x)))
    for i, j in zip(*np.nonzero(same), strict=True):
        ri, rj = label[i], label[j]
        for k in range(len(label)):
            if label[k] == max(ri, rj):
                label[k] = min(ri, rj)
    groups: dict[int, set[str]] = {}
    for i, r in enumerate(label):
        groups.setdefault(r, set()).add(paths[i])
    return [g for g in groups.values() if len(g) > 1]


def test_dedup_groups_keep_and_nul_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    files = folder_with_copies(tmp_path)
    assert run_cli(["embed", "imgs", *MODEL, "--out", "vec", "-q"], monkeypatch, capsys)[0] == 0
    code, out, err = run_cli(
        ["dedup", "vec", "--threshold", "0.9999", "-f", "csv"], monkeypatch, capsys
    )
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["group", "id", "path", "score"]
    found: dict[str, set[str]] = {}
    for row in rows:
        found.setdefault(row["group"], set()).add(row["path"])
    expected = brute_groups(tmp_path / "vec", 0.9999)
    assert sorted(map(sorted, found.values())) == sorted(map(sorted, expected))
    assert any({str(files["a"]), str(files["copy"])} <= g for g in expected)  # the planted pair
    assert "group" in err and "holding" in err
    # --keep: every member but one per group; -0 for xargs.
    for keep, kept in (("largest", "big"), ("newest", "copy"), ("first", "a")):
        code, out, err = run_cli(
            ["dedup", "vec", "--threshold", "0.9999", "--keep", keep, "--paths-only", "-0", "-q"],
            monkeypatch,
            capsys,
        )
        assert code == 0, err
        listed = out.split("\0")
        assert listed[-1] == ""
        assert len(listed) - 1 == sum(len(g) - 1 for g in expected)
        assert str(files[kept]) not in listed
    assert files["copy"].exists() and files["big"].exists()  # nothing deleted


def test_dedup_without_calibration_asks_for_a_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=2, per_class=2)
    assert run_cli(["embed", "imgs", *MODEL, "--out", "vec", "-q"], monkeypatch, capsys)[0] == 0
    code, _, err = run_cli(["dedup", "vec"], monkeypatch, capsys)
    assert code == 2
    assert "no same-item calibration" in one_error(err) and "--threshold" in err
    code, _, err = run_cli(["dedup", "vec", "--threshold", "0.5", "-0"], monkeypatch, capsys)
    assert code == 2 and "--paths-only" in one_error(err)


def test_single_image_has_no_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "one").mkdir()
    Image.new("RGB", (16, 16), "red").save(tmp_path / "one" / "a.png")
    assert run_cli(["embed", "one", *MODEL, "--out", "vec", "-q"], monkeypatch, capsys)[0] == 0
    code, out, err = run_cli(
        ["dedup", "vec", "--threshold", "0.5", "-f", "csv"], monkeypatch, capsys
    )
    assert code == 0, err
    assert out == "group,id,path,score\n" or out == ""
    assert "1 image: 0 groups" in err


def test_query_same_item_keeps_hits_at_or_above_the_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    files = folder_with_copies(tmp_path)
    assert run_cli(["index", "imgs", *MODEL, "--out", "b", "-q"], monkeypatch, capsys)[0] == 0
    args = ["query", str(files["a"]), "--index", "b", "--k", "8", "-f", "csv", "-q"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    everything = list(csv.DictReader(io.StringIO(out)))
    scores = sorted({float(r["score"]) for r in everything})
    t = (scores[-3] + scores[-4]) / 2  # between the third and fourth best (rounded) scores
    code, out, err = run_cli([*args, "--same-item", "--threshold", str(t)], monkeypatch, capsys)
    assert code == 0, err
    kept = list(csv.DictReader(io.StringIO(out)))
    assert [r["path"] for r in kept] == [r["path"] for r in everything if float(r["score"]) >= t]
    code, _, err = run_cli([*args, "--same-item"], monkeypatch, capsys)
    assert code == 2 and "no same-item calibration" in one_error(err)
    code, _, err = run_cli([*args, "--threshold", "0.5"], monkeypatch, capsys)
    assert code == 2 and "give --same-item too" in one_error(err)


def test_eval_calibrate_of_a_backbone_prints_the_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=3)
    args = ["eval", "imgs", *MODEL, "--calibrate", "--precision", "0.5"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    lines = dict(line.split() for line in out.splitlines())
    assert set(lines) == {"threshold", "precision", "recall", "pairs"}
    assert float(lines["precision"]) >= 0.5 and "not stored" in err
