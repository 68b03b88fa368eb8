"""A real full filesystem (a 4 MiB tmpfs): every verb that writes says so in one line, keeps the
previous output and leaves no temporary file behind."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from conftest import fill, make_class_folder, run_cli

from pactl.embed import read_embedded
from pactl.index import load_bundle

MODEL = ["--backbone", "small", "--weights", "none", "--image-size", "16"]


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (links by target, files by content hash)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            rel = str(path.relative_to(folder))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def one_line_no_space(code: int, err: str) -> None:
    assert code == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: no space left on the device"), err
    assert err.endswith(errors[0] + "\n") and "Traceback" not in err


def test_embed_index_and_add_on_a_full_disk(
    full_disk: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=3, per_class=4, size=16)
    vec, bundle = full_disk / "vec", full_disk / "bundle"
    for args in (
        ["embed", str(imgs), *MODEL, "--out", str(vec)],
        ["index", str(vec), "--out", str(bundle)],
    ):
        code, _, err = run_cli(args, monkeypatch, capsys)
        assert code == 0, err
    before = snapshot(full_disk)
    vectors_before = read_embedded(vec)[0].copy()
    more = make_class_folder(tmp_path / "more", classes=2, per_class=40, size=64, seed=3)
    shutil.copytree(more, imgs / "more")
    fill(full_disk)
    after_fill = snapshot(full_disk)

    for args in (
        ["embed", str(imgs), *MODEL, "--out", str(vec)],  # a new generation of vectors
        ["index", str(vec), "--out", str(full_disk / "other")],  # a new bundle folder
        ["index", str(vec), "--out", str(bundle)],  # a new generation of a bundle
        ["index", str(imgs / "more"), "--add", str(bundle)],  # scratch vectors, then the add
    ):
        code, _, err = run_cli(args, monkeypatch, capsys)
        one_line_no_space(code, err)
        assert snapshot(full_disk) == after_fill, args  # nothing left, nothing lost

    assert {k: v for k, v in after_fill.items() if k != ".filler"} == before
    assert (read_embedded(vec)[0] == vectors_before).all()
    assert len(load_bundle(bundle).items) == 12
    (full_disk / ".filler").unlink()  # with room again, the same commands succeed
    code, _, err = run_cli(["index", str(imgs / "more"), "--add", str(bundle)], monkeypatch, capsys)
    assert code == 0, err
    assert len(load_bundle(bundle).items) == 92


def test_grid_and_report_on_a_full_disk(
    full_disk: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=4, size=16)
    code, _, err = run_cli(
        ["index", str(imgs), *MODEL, "--out", str(tmp_path / "b")], monkeypatch, capsys
    )
    assert code == 0, err
    (full_disk / "grid.png").write_bytes(b"the previous grid")
    fill(full_disk)
    before = snapshot(full_disk)
    query = ["query", str(imgs / "class_0" / "0.png"), "--index", str(tmp_path / "b"), "--quiet"]
    grid = ["--grid", str(full_disk / "grid.png"), "--overwrite"]  # the previous one: replaced
    code, _, err = run_cli([*query, *grid], monkeypatch, capsys)
    one_line_no_space(code, err)
    evaluate = ["eval", str(imgs), *MODEL, "--quiet", "--report", str(full_disk / "eval.csv")]
    code, _, err = run_cli(evaluate, monkeypatch, capsys)
    one_line_no_space(code, err)
    assert snapshot(full_disk) == before
