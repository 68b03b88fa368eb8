"""Manifests from the digits set, class folders and CSVs; bad manifests get clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import make_class_folder

from pactl.console import QUIET
from pactl.datasets import load_source, manifest_from_folder, read_manifest
from pactl.errors import PactlError


def test_digits_written_as_pngs_with_class_disjoint_split() -> None:
    from PIL import Image
    from sklearn.datasets import load_digits

    manifest = load_source("digits", QUIET)
    digits = load_digits()
    assert len(manifest) == len(digits.target) == 1797
    train = manifest.select("train")
    test = manifest.select("test")
    assert set(np.unique(train.labels)) == {0, 1, 2, 3, 4}
    assert set(np.unique(test.labels)) == {5, 6, 7, 8, 9}
    # The PNGs hold the scans themselves: 0..16 scaled to 0..255.
    i = 123
    pixels = np.asarray(Image.open(manifest.files()[i]))
    assert pixels.shape == (8, 8)
    expected = np.clip(digits.images[i] * 255 / 16, 0, 255).astype(np.uint8)
    assert np.array_equal(pixels, expected)
    assert manifest.labels[i] == digits.target[i]


def test_folder_of_classes_is_split_by_class(tmp_path: Path) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=3)
    m = manifest_from_folder(tmp_path / "imgs")
    assert len(m) == 18
    train_classes = set(np.array(m.class_names)[np.array(m.splits) == "train"])
    test_classes = set(np.array(m.class_names)[np.array(m.splits) == "test"])
    assert train_classes == {"class_0", "class_1", "class_2"}
    assert test_classes == {"class_3", "class_4", "class_5"}


def test_csv_with_and_without_split(tmp_path: Path) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    rows = [f"imgs/class_{c}/{n}.png,{c * 10}" for c in range(4) for n in range(2)]
    (tmp_path / "a.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    m = read_manifest(tmp_path / "a.csv")
    assert list(m.labels) == [0, 0, 1, 1, 2, 2, 3, 3]  # 0,10,20,30 in numeric order
    assert m.splits == ("train",) * 4 + ("test",) * 4
    with_split = [r + f",{'query' if i % 2 else 'gallery'}" for i, r in enumerate(rows)]
    (tmp_path / "b.csv").write_text("path,label,split\n" + "\n".join(with_split) + "\n")
    assert read_manifest(tmp_path / "b.csv").eval_splits() == ("query", "gallery")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("file,label\na.png,1\n", r"lacks the column\(s\) path"),
        ("path,label,split\na.png,1,validation\n", "unknown split"),
        ("path,label\n../outside.png,1\n", "leaves the manifest's folder"),
        ("path,label\n/etc/passwd,1\n", "leaves the manifest's folder"),
        ("path,label\n", "no rows"),
        ("path,label\na.png,\n", "empty label"),
    ],
)
def test_bad_csv_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(PactlError, match=message):
        read_manifest(tmp_path / "bad.csv")


def test_duplicate_rows_are_counted_once(tmp_path: Path) -> None:
    rows = ["a.png,1", "a.png,1", "b.png,2", "c.png,3", "d.png,4"]
    (tmp_path / "d.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    assert read_manifest(tmp_path / "d.csv").paths == ("a.png", "b.png", "c.png", "d.png")


def test_missing_and_empty_sources(tmp_path: Path) -> None:
    with pytest.raises(PactlError, match="neither a known dataset"):
        load_source(str(tmp_path / "nope"), QUIET)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PactlError, match="no images"):
        load_source(str(tmp_path / "empty"), QUIET)
