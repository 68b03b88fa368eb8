"""Manifests from the digits set, class folders and CSVs; bad manifests get clear errors."""

from __future__ import annotations

import codecs
import concurrent.futures
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from conftest import make_class_folder
from rich.console import Console

from pactl.console import QUIET, Reporter
from pactl.datasets import list_images, load_source, manifest_from_folder, read_manifest
from pactl.errors import PactlError

T = TypeVar("T")


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
    assert len(train_classes) == len(test_classes) == 3 and not train_classes & test_classes
    assert manifest_from_folder(tmp_path / "imgs").splits == m.splits  # every reading alike


def test_default_split_does_not_follow_the_order_of_names(tmp_path: Path) -> None:
    """Sorted names put every `man-*` class in train and every `woman-*` class in test; the
    seeded draw gives each family about half its classes on each side."""
    names = [f"{family}-{i:02d}" for family in ("man", "woman") for i in range(30)]
    rows = [f"{name}/0.png,{name}" for name in names for _ in range(1)]
    (tmp_path / "a.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    m = read_manifest(tmp_path / "a.csv")
    train = {name for name, split in zip(m.class_names, m.splits, strict=True) if split == "train"}
    assert len(train) == 30
    men = sum(name.startswith("man-") for name in train)
    assert 8 <= men <= 22  # sorted order gave 30 (a fair draw: 15 +- 2.7)
    reversed_rows = "path,label\n" + "\n".join(reversed(rows)) + "\n"
    (tmp_path / "b.csv").write_text(reversed_rows)
    again = read_manifest(tmp_path / "b.csv")
    assert {
        n for n, s in zip(again.class_names, again.splits, strict=True) if s == "train"
    } == train


def test_default_split_is_stratified_by_a_group_column(tmp_path: Path) -> None:
    rows = [
        f"{g}{c}/{n}.png,{g}{c},{g}" for g in ("p", "q", "r") for c in range(10) for n in range(2)
    ]
    (tmp_path / "a.csv").write_text("path,label,group\n" + "\n".join(rows) + "\n")
    m = read_manifest(tmp_path / "a.csv")
    for group in ("p", "q", "r"):
        sides = {s for n, s in zip(m.class_names, m.splits, strict=True) if n[0] == group}
        train = {
            n
            for n, s in zip(m.class_names, m.splits, strict=True)
            if n[0] == group and s == "train"
        }
        assert sides == {"train", "test"} and len(train) == 5
    (tmp_path / "b.csv").write_text("path,label,group\na/0.png,a,x\na/1.png,a,y\n")
    with pytest.raises(PactlError, match="give each class one group"):
        read_manifest(tmp_path / "b.csv")


def test_csv_with_and_without_split(tmp_path: Path) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    rows = [f"imgs/class_{c}/{n}.png,{c * 10}" for c in range(4) for n in range(2)]
    (tmp_path / "a.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    m = read_manifest(tmp_path / "a.csv")
    assert list(m.labels) == [0, 0, 1, 1, 2, 2, 3, 3]  # 0,10,20,30 in numeric order
    assert sorted(m.splits) == ["test"] * 4 + ["train"] * 4
    assert len({(label, split) for label, split in zip(m.labels, m.splits, strict=True)}) == 4
    with_split = [r + f",{'query' if i % 2 else 'gallery'}" for i, r in enumerate(rows)]
    (tmp_path / "b.csv").write_text("path,label,split\n" + "\n".join(with_split) + "\n")
    assert read_manifest(tmp_path / "b.csv").eval_splits() == ("query", "gallery")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("file,label\na.png,1\n", r"lacks the column\(s\) path"),
        ("path,label,split\na.png,1,validation\n", "unknown split"),
        ("path,label\n../outside.png,1\n", "leaves the manifest's folder"),
        ("path,label\nimgs/../../outside.png,1\n", "leaves the manifest's folder"),
        ("path,label\n", "no rows"),
        ("path,label\na.png,\n", "empty label"),
        ("path,label\na.png,1\nb.png,2\na.png,3\n", r"line 4: a.png again, with label '3'"),
        ("path,label\na.png,1\nb.png,2\n", "only 2 classes: a class-disjoint"),
    ],
)
def test_bad_csv_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(PactlError, match=message):
        read_manifest(tmp_path / "bad.csv")


def test_a_csv_of_few_classes_is_read_unsplit_where_no_split_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Embedding and indexing use no split: a CSV of two classes, without a split column, is
    embedded as a folder of them is (training still needs four classes for its split)."""
    from conftest import run_cli

    imgs = make_class_folder(tmp_path / "imgs", classes=2, per_class=2)
    rows = [f"{p.relative_to(tmp_path)},{p.parent.name}" for p in sorted(imgs.rglob("*.png"))]
    (tmp_path / "two.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    manifest = read_manifest(tmp_path / "two.csv", splits=False)
    assert len(manifest) == 4 and set(manifest.splits) == {""}
    monkeypatch.chdir(tmp_path)
    model = ["--backbone", "small", "--weights", "none", "--image-size", "16"]
    code, _, err = run_cli(["embed", "two.csv", *model, "--out", "v", "-q"], monkeypatch, capsys)
    assert code == 0, err
    code, _, err = run_cli(["train", "two.csv", *model, "--epochs", "1"], monkeypatch, capsys)
    assert code == 1 and "only 2 classes" in err


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


# ---- hostile folders and manifests ------------------------------------------------------------


def _recording() -> tuple[Reporter, io.StringIO]:
    """A quiet reporter whose warnings land in a buffer."""
    buffer = io.StringIO()
    return Reporter(Console(file=buffer, width=300), quiet=True), buffer


def _with_deadline(call: Callable[[], T], seconds: float = 20.0) -> T:
    """`call()` in a thread; still running at the deadline (a hang) fails the test."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(call)
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            pool.shutdown(wait=False, cancel_futures=True)
            pytest.fail(f"still running after {seconds} s")


def _names(folder: Path, files: list[Path]) -> list[str]:
    return [f.relative_to(folder).as_posix() for f in files]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_listing_takes_regular_files_only(tmp_path: Path) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    os.mkfifo(imgs / "class_0" / "x.jpg")
    (imgs / "class_1" / "null.jpg").symlink_to(os.devnull)
    reporter, warnings = _recording()
    files = _with_deadline(lambda: list_images(imgs, follow_links=True, reporter=reporter))
    assert len(files) == 8 and all(f.suffix == ".png" for f in files)
    assert "skipped 2 entries named like an image but not a regular file" in warnings.getvalue()
    assert "class_0/x.jpg, a FIFO" in warnings.getvalue()
    assert len(manifest_from_folder(imgs)) == 8


def _outside(tmp_path: Path) -> Path:
    """A folder of images beside `imgs`, that links inside `imgs` lead to."""
    return make_class_folder(tmp_path / "elsewhere", classes=2, per_class=2, seed=1)


def test_links_leading_outside_a_folder_are_skipped_and_reported(tmp_path: Path) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    outside = _outside(tmp_path)
    (imgs / "class_0" / "out.png").symlink_to(outside / "class_0" / "0.png")
    (imgs / "class_9").symlink_to(outside / "class_1", target_is_directory=True)
    (imgs / "class_1" / "in.png").symlink_to(imgs / "class_2" / "0.png")  # stays inside
    reporter, warnings = _recording()
    files = list_images(imgs, reporter=reporter)
    assert "class_0/out.png" not in _names(imgs, files) and len(files) == 9
    assert "class_1/in.png" in _names(imgs, files)
    assert "skipped 2 links leading outside it" in warnings.getvalue()
    assert len(manifest_from_folder(imgs)) == 9
    assert len(load_source(str(imgs), reporter)) == 9
    # Allowed on request: the linked file and the linked class folder.
    followed = list_images(imgs, follow_links=True)
    assert {"class_0/out.png", "class_9/0.png", "class_9/1.png"} <= set(_names(imgs, followed))
    assert len(load_source(str(imgs), QUIET, follow_links=True)) == 12


def test_a_loop_of_folder_links_ends(tmp_path: Path) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    (imgs / "class_0" / "up").symlink_to("..", target_is_directory=True)
    (imgs / "class_1" / "self").symlink_to(".", target_is_directory=True)
    (imgs / "class_2" / "a").symlink_to("b", target_is_directory=True)
    (imgs / "class_2" / "b").symlink_to("a", target_is_directory=True)  # a loop of two links
    for follow in (False, True):
        files = _with_deadline(lambda f=follow: list_images(imgs, follow_links=f))
        assert len(files) == 8  # each folder entered once


def test_manifest_row_through_a_link_leading_outside_is_refused(tmp_path: Path) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=1)
    outside = _outside(tmp_path)
    (imgs / "out.png").symlink_to(outside / "class_0" / "0.png")
    (imgs / "outdir").symlink_to(outside / "class_1", target_is_directory=True)
    (imgs / "null.png").symlink_to(os.devnull)
    (imgs / "in.png").symlink_to(imgs / "class_1" / "0.png")
    rows = [f"class_{c}/0.png,{c}" for c in range(4)]
    for n, extra in enumerate(["out.png,1", "outdir/0.png,1", "null.png,1"]):
        csv_path = imgs / f"bad{n}.csv"
        csv_path.write_text("path,label\n" + "\n".join([*rows, extra]) + "\n")
        with pytest.raises(PactlError, match="line 6: path .* is a link leading outside"):
            load_source(str(csv_path), QUIET)
        assert len(read_manifest(csv_path, follow_links=True)) == 5
    (imgs / "ok.csv").write_text("path,label\n" + "\n".join([*rows, "in.png,1"]) + "\n")
    assert len(read_manifest(imgs / "ok.csv")) == 5  # a link that stays inside is kept


def test_absolute_paths_are_read_wherever_they_point(tmp_path: Path) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=1)
    outside = _outside(tmp_path)
    (imgs / "out.png").symlink_to(outside / "class_0" / "0.png")
    rows = [
        f"{imgs / 'class_0' / '0.png'},0",  # inside the CSV's folder
        f"{outside / 'class_1' / '0.png'},1",  # outside it
        f"{imgs / 'out.png'},2",  # a link leading outside: the absolute path is the choice
        "class_3/0.png,3",  # relative rows mix with absolute ones
    ]
    (imgs / "abs.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    for follow in (False, True):
        manifest = read_manifest(imgs / "abs.csv", follow_links=follow)
        assert manifest.files() == [
            imgs / "class_0" / "0.png",
            outside / "class_1" / "0.png",
            imgs / "out.png",
            imgs / "class_3" / "0.png",
        ]
        assert all(f.is_file() for f in manifest.files())
    assert len(load_source(str(imgs / "abs.csv"), QUIET)) == 4


def test_relative_rows_still_may_not_leave_the_csv_folder(tmp_path: Path) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=1)
    outside = _outside(tmp_path)
    (imgs / "out.png").symlink_to(outside / "class_0" / "0.png")
    rows = [f"{outside / 'class_1' / '0.png'},0", "class_1/0.png,1", "class_2/0.png,2"]
    for bad, message in [("../elsewhere/class_0/0.png", "leaves the manifest's folder"),
                         ("out.png", "is a link leading outside")]:  # fmt: skip
        # An absolute row before it does not open the door for relative ones.
        (imgs / "bad.csv").write_text("path,label\n" + "\n".join([*rows, f"{bad},3"]) + "\n")
        with pytest.raises(PactlError, match=f"line 5: path .*{message}"):
            read_manifest(imgs / "bad.csv")
    assert len(read_manifest(imgs / "bad.csv", follow_links=True)) == 4


def test_csv_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    rows = "path,label\r\n" + "".join(f"{c}.png,{c}\r\n" for c in range(4))
    (tmp_path / "excel.csv").write_bytes(codecs.BOM_UTF8 + rows.encode("utf-8"))
    assert read_manifest(tmp_path / "excel.csv").paths == ("0.png", "1.png", "2.png", "3.png")


def test_csv_that_is_not_utf8_is_one_clear_error(tmp_path: Path) -> None:
    text = "path,label\na.png,1\nb.png,2\ncaf\xe9.png,3\n"
    (tmp_path / "latin1.csv").write_bytes(text.encode("latin-1"))
    offset = text.index("\xe9")
    message = f"latin1.csv is not UTF-8 text: byte 0xe9 at offset {offset} \\(line 4\\)"
    with pytest.raises(PactlError, match=message):
        read_manifest(tmp_path / "latin1.csv")
    (tmp_path / "bom.csv").write_bytes(codecs.BOM_UTF8 + text.encode("latin-1"))
    with pytest.raises(PactlError, match=f"at offset {offset + 3} \\(line 4\\)"):
        read_manifest(tmp_path / "bom.csv")


def test_file_names_that_are_not_utf8_are_listed(tmp_path: Path) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=1)
    raw = os.fsencode(imgs / "class_0") + b"/caf\xe9.png"
    try:
        with open(raw, "wb") as f:
            f.write((imgs / "class_0" / "0.png").read_bytes())
    except OSError as e:
        pytest.skip(f"this filesystem refuses the name ({e})")
    files = list_images(imgs)
    assert raw in [os.fsencode(f) for f in files] and len(files) == 5
    manifest = manifest_from_folder(imgs)
    assert len(manifest) == 5 and raw in [os.fsencode(f) for f in manifest.files()]
