"""`pactl audit`'s rows and views: the evidence in each row (CSV and JSON Lines against the
vectors themselves), --classes, the contact sheet's notes, and the label-free audit of a folder
(pactl.verbs.audit_folder)."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import make_class_folder, one_error, read_csv, run_cli
from test_audit import hand_set, write_vectors
from test_checks import photo


def bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[np.ndarray, list[str]]:
    """hand_set's vectors as a bundle `b` under tmp_path (the working folder); the vectors."""
    vectors, labels, _ = hand_set()
    write_vectors(tmp_path / "vec", vectors, labels)
    assert run_cli(["index", "vec", "--out", "b", "-q"], monkeypatch, capsys)[0] == 0
    return vectors, labels


def test_every_row_carries_its_evidence_in_csv_and_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The suspected label's row: both shares, its 5 nearest (ids, labels, cosines) as the
    vectors give them by brute force; the old ten columns first, unchanged."""
    vectors, labels = bundle(tmp_path, monkeypatch, capsys)
    args = ["audit", "b", "--neighbours", "5", "--no-copies", "--no-checks", "--top", "1"]
    code, out, err = run_cli([*args, "-f", "jsonl"], monkeypatch, capsys)
    assert code == 0, err
    row = next(json.loads(line) for line in out.splitlines() if '"label"' in line.split(",")[0])
    assert row["id"] == 3 and row["path"] == "/d/3.png" and row["suggested"] == "b"
    cosines = vectors.astype(np.float64) @ vectors[3].astype(np.float64)
    cosines[3] = -np.inf
    nearest = np.argsort(-cosines)[:5]
    assert [n["id"] for n in row["neighbours"]] == nearest.tolist()
    assert [n["label"] for n in row["neighbours"]] == [labels[j] for j in nearest]
    assert [n["cosine"] for n in row["neighbours"]] == pytest.approx(cosines[nearest], abs=1e-5)
    carrying = sum(labels[j] == "a" for j in nearest) / 5
    assert row["neighbour_share"] == pytest.approx(carrying)
    assert 0 <= row["class_share"] < 0.5 and "class share" in row["reason"]
    code, out, _ = run_cli([*args, "-f", "csv"], monkeypatch, capsys)
    table = list(csv.reader(io.StringIO(out)))
    assert table[0][:10] == [
        "kind", "rank", "score", "path", "split", "label", "suggested", "other", "other_split",
        "other_label",
    ]  # fmt: skip
    cell = dict(zip(table[0], table[1], strict=True))["neighbours"]
    parts = [p.split(":", 2) for p in cell.split(";")]
    assert [(int(i), lab) for i, _, lab in parts] == [(j, labels[j]) for j in nearest]
    assert [float(c) for _, c, _ in parts] == pytest.approx(cosines[nearest], abs=1e-4)


def test_classes_file_and_its_overwrite_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle(tmp_path, monkeypatch, capsys)
    monkeypatch.chdir(tmp_path)
    args = ["audit", "b", "--neighbours", "5", "--no-copies", "--no-checks", "--classes", "c.csv"]
    code, _, err = run_cli([*args, "-f", "csv"], monkeypatch, capsys)
    assert code == 0, err
    got = read_csv(tmp_path / "c.csv")
    assert sorted((r["class"], r["items"]) for r in got if r["kind"] == "class") == [
        ("a", "8"), ("b", "8"), ("c", "8"),
    ]  # fmt: skip
    assert any(r["kind"] == "pair" and {r["class"], r["other"]} == {"a", "b"} for r in got)
    assert "classes: 3" in err and "most confused: a↔b" in err
    code, _, err = run_cli([*args, "-f", "csv"], monkeypatch, capsys)
    assert code == 1 and "pass --overwrite" in one_error(err)
    assert run_cli([*args, "-f", "csv", "--overwrite"], monkeypatch, capsys)[0] == 0
    code, _, err = run_cli(["audit", "b", "--no-labels"], monkeypatch, capsys)
    assert code == 2 and "--no-labels audits a FOLDER" in one_error(err)


def unlabelled_folder(folder: Path) -> dict[str, str]:
    """24 seeded photos, a resized and a JPEG copy of two of them, and a dark one."""
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(24):
        photo(rng).save(folder / f"{i:02d}.png")
    Image.open(folder / "03.png").resize((80, 60), Image.Resampling.BICUBIC).save(folder / "r.png")
    Image.open(folder / "11.png").save(folder / "j.jpg", quality=60)
    dark = (np.asarray(photo(rng), dtype=np.float64) * 0.1).astype(np.uint8)
    Image.fromarray(dark).save(folder / "dark.png")
    return {"r.png": "03.png", "j.jpg": "11.png"}


def test_a_folder_without_labels_gets_its_copies_outliers_and_image_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    planted = unlabelled_folder(tmp_path / "photos")
    code, out, err = run_cli(["audit", "photos", "--top", "0", "-f", "csv"], monkeypatch, capsys)
    assert code == 0, err
    found = list(csv.DictReader(io.StringIO(out)))
    pairs = {
        frozenset((Path(r["path"]).name, Path(r["other"]).name))
        for r in found
        if r["kind"] == "copy"
    }
    assert pairs == {frozenset(p) for p in planted.items()}
    copy = next(r for r in found if r["kind"] == "copy")
    assert copy["box_in"] in ("path", "other") and len(copy["box"].split()) == 4
    assert [Path(r["path"]).name for r in found if r["kind"] == "dark"] == ["dark.png"]
    assert sum(r["kind"] == "outlier" for r in found) == 27
    assert "without labels: no suspected labels" in err
    assert not any(r["kind"] == "label" for r in found)


def test_a_folder_of_class_folders_needs_no_labels_or_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=2, per_class=3)
    code, _, err = run_cli(["audit", "imgs", "--no-copies"], monkeypatch, capsys)
    assert code == 2 and "--no-labels" in one_error(err)
    code, out, err = run_cli(
        ["audit", "imgs", "--no-labels", "--no-copies", "-f", "csv"], monkeypatch, capsys
    )
    assert code == 0, err
    assert out.startswith("kind,rank,score,path")
    shutil.rmtree(tmp_path / "imgs")
    (tmp_path / "imgs").mkdir()
    code, _, err = run_cli(["audit", "imgs", "--sheet", "s.png"], monkeypatch, capsys)
    assert code == 2 and "--sheet need labels" in one_error(err)


def test_the_sheet_writes_each_suspects_evidence_across_its_tile(tmp_path: Path) -> None:
    from PIL import Image

    from pactl.report import suspect_sheet

    Image.new("RGB", (20, 20), (0, 0, 0)).save(tmp_path / "x.png")
    rows = [((str(tmp_path / "x.png"), "a→b", 0.9), [], [])]
    suspect_sheet(rows, tmp_path / "plain.png")
    suspect_sheet(rows, tmp_path / "noted.png", notes=["class .10 nb .40"])
    plain = np.asarray(Image.open(tmp_path / "plain.png"))
    noted = np.asarray(Image.open(tmp_path / "noted.png"))
    changed = np.argwhere((plain != noted).any(axis=2))
    assert len(changed) and plain.shape == noted.shape
    assert changed[:, 0].min() >= 5 and changed[:, 0].max() <= 5 + 13  # a band atop the tile
    assert changed[:, 1].max() < 5 + 96  # inside the suspect's tile


def test_without_labels_the_picture_unlike_the_others_is_the_first_outlier(
    tmp_path: Path,
) -> None:
    """20 takes of one scene (each with its own grain and a shift of a few pixels) and one
    other picture: the other ranks first by its thumbnail's distance to its nearest."""
    from PIL import Image

    from pactl.console import QUIET
    from pactl.verbs.audit import AuditConfig
    from pactl.verbs.audit_folder import audit_folder

    rng = np.random.default_rng(2)
    scene = np.asarray(photo(rng, (140, 110)), dtype=np.float64)
    (tmp_path / "p").mkdir()
    for i in range(20):
        x, y = rng.integers(0, 20, size=2)
        take = scene[y : y + 90, x : x + 120] + rng.normal(0, 8, (90, 120, 3))
        Image.fromarray(np.clip(take, 0, 255).astype(np.uint8)).save(tmp_path / "p" / f"{i}.png")
    photo(rng).save(tmp_path / "p" / "other.png")
    result = audit_folder(tmp_path / "p", AuditConfig(copies=False), False, QUIET)
    first = int(np.nanargmax(result.outlier))
    assert Path(result.data.paths[first]).name == "other.png"
