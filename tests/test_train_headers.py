"""`pactl train` reads every image's header before training: unreadable images are reported
once (one warning, runs/<run>/skipped.csv) and left out, and a batch larger than the readable
training images is refused saying so."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY, make_class_folder, read_csv, run_cli

from pactl.console import QUIET
from pactl.images import unreadable_images


def break_images(root: Path) -> dict[str, str]:
    """Three ways an image cannot be read, by path: what each file is now."""
    broken = {
        root / "class_0" / "0.png": b"not an image at all",
        root / "class_0" / "1.png": b"",
        root / "class_2" / "2.png": (root / "class_2" / "2.png").read_bytes()[:60],  # cut short
    }
    for path, data in broken.items():
        path.write_bytes(data)
    return {str(p): "garbage" if d else "empty" for p, d in broken.items()}


def test_unreadable_images_against_the_broken_ones(tmp_path: Path) -> None:
    make_class_folder(tmp_path / "imgs", classes=3, per_class=4)
    broken = break_images(tmp_path / "imgs")
    files = sorted((tmp_path / "imgs").rglob("*.png"))
    found = unreadable_images(files, QUIET, threads=3)
    assert [p for p, _ in found] == sorted(broken)  # input order, every broken one, no other
    assert dict(found)[str(tmp_path / "imgs" / "class_0" / "1.png")] == "file is empty (0 bytes)"


def test_train_reports_unreadable_images_once_and_leaves_them_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=5)
    broken = break_images(tmp_path / "imgs")
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "2", "--name", "t"]
    code, _, err = run_cli(args, monkeypatch, capsys)  # not quiet: no line per epoch either
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "unreadable image" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: 3 unreadable images"), err
    listed = read_csv(tmp_path / "runs" / "t" / "skipped.csv")
    assert sorted(r["path"] for r in listed) == sorted(broken)


def test_a_batch_larger_than_the_readable_images_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=3)  # 6 train images, batch 8
    args = ["train", str(tmp_path / "imgs"), *TINY, "--batch-size", "4", "--m", "2"]
    from pactl.datasets import manifest_from_folder

    m = manifest_from_folder(tmp_path / "imgs")  # the train classes, as the default split draws
    first, second = sorted(
        {n for n, s in zip(m.class_names, m.splits, strict=True) if s == "train"}
    )
    (tmp_path / "imgs" / first / "0.png").write_bytes(b"")
    (tmp_path / "imgs" / second / "0.png").write_bytes(b"")
    (tmp_path / "imgs" / first / "1.png").write_bytes(b"")
    code, _, err = run_cli([*args, "--val-classes", "0", "--quiet"], monkeypatch, capsys)
    assert code == 1
    assert "larger than the train split (3 readable images, 3 unreadable images left out)" in err
