"""Names Linux allows, read one way by every verb: a file or folder name is bytes 1-255 but `/`
(a backslash, a colon, quotes, a newline, a leading dash or space, bytes that are not UTF-8),
and `pactl train`'s manifest, `pactl audit` and `pactl embed` each read every such image."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from PIL import Image
from test_hostile_cli import tiny_checkpoint

from pactl.datasets import manifest_from_folder, read_manifest

ALLOWED = [b for b in range(1, 256) if b != ord("/")]  # what a Linux name may hold
CLASSES = [b"10:30", b"a\\b", b"-dash", b" space", b"q'\"", b"new\nline", b"\xff\xfe", b"plain"]


def hostile_folder(root: Path) -> list[str]:
    """root/<class>/<name>.png for each class of CLASSES (each a name a Windows reading would
    break) and one image per allowed byte, spread over them: the images' paths, as str."""
    rng = np.random.default_rng(0)
    paths = []
    for n, byte in enumerate(ALLOWED):
        folder = os.fsencode(root) + b"/" + CLASSES[n % len(CLASSES)]
        os.makedirs(folder, exist_ok=True)
        name = folder + b"/" + bytes([byte]) + b"x.png"  # every byte, first in a name too
        pixels = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.fsdecode(name), format="PNG")
        paths.append(os.fsdecode(name))
    return sorted(paths)


def test_a_folder_of_every_allowed_byte_is_read_whole_into_a_manifest(tmp_path: Path) -> None:
    paths = hostile_folder(tmp_path / "imgs")
    manifest = manifest_from_folder(tmp_path / "imgs")
    assert sorted(str(tmp_path / "imgs" / p) for p in manifest.paths) == paths
    assert set(manifest.class_names) == {os.fsdecode(c) for c in CLASSES}


@pytest.mark.parametrize("name", ["a\\b.png", "10:30/a.png", "C:\\data\\a.png", "c:d/e.png"])
def test_a_csv_row_is_one_linux_name(tmp_path: Path, name: str) -> None:
    """A backslash or a colon is part of a name, never a separator or a drive."""
    rows = [name, *(f"c{c}/{n}.png" for c in range(1, 4) for n in range(2))]
    text = "path,label\n" + "".join(f"{p},{p.split('/')[0]}\n" for p in rows)
    (tmp_path / "m.csv").write_text(text)
    assert read_manifest(tmp_path / "m.csv").paths[0] == name


def test_train_audit_and_embed_read_every_allowed_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = hostile_folder(tmp_path / "imgs")
    tiny_checkpoint(tmp_path / "best.pt")
    best = str(tmp_path / "best.pt")
    code, _, err = run_cli(
        ["embed", "imgs", "--checkpoint", best, "--out", "v", "-q"], monkeypatch, capsys
    )
    assert code == 0, err
    assert len(np.load(tmp_path / "v" / "vectors.npy")) == len(paths)
    code, _, err = run_cli(["index", "v", "--out", "b", "-q"], monkeypatch, capsys)
    assert code == 0, err
    args = ["audit", "b", "--source", "imgs", "--no-copies", "--top", "0", "-f", "jsonl"]
    code, out, err = run_cli([*args, "--neighbours", "3"], monkeypatch, capsys)
    assert code == 0, err
    assert f"{len(paths)} items" in err, err
    assert "not found" not in err and "leaves" not in err, err


def test_audits_manifest_of_every_allowed_byte_is_read_back_as_train_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--write-manifest writes a name that is not UTF-8 as its bytes; the manifest reader
    (train's, through load_source) reads those rows back, each naming its file, while a byte
    that is not UTF-8 in a row naming no such file is still the "not UTF-8 text" line."""
    from pactl.console import QUIET
    from pactl.datasets import load_source
    from pactl.errors import PactlError

    paths = hostile_folder(tmp_path / "imgs")
    tiny_checkpoint(tmp_path / "best.pt")
    embed = ["embed", "imgs", "--checkpoint", str(tmp_path / "best.pt"), "--out", "v", "-q"]
    assert run_cli(embed, monkeypatch, capsys)[0] == 0
    assert run_cli(["index", "v", "--out", "b", "-q"], monkeypatch, capsys)[0] == 0
    args = ["audit", "b", "--source", "imgs", "--no-copies", "--drop-top", "1", "-f", "jsonl"]
    code, _, err = run_cli([*args, "--write-manifest", "clean.csv", "-q"], monkeypatch, capsys)
    assert code == 0, err
    assert b"\xff\xfe/" in (tmp_path / "clean.csv").read_bytes()  # the bytes as they are
    manifest = load_source(str(tmp_path / "clean.csv"), QUIET)
    assert len(manifest) == len(paths) - 1 and set(manifest.paths) < set(paths)
    assert os.fsdecode(b"\xff\xfe") in manifest.class_names
    assert all(os.path.isfile(f) for f in manifest.files())
    text = (tmp_path / "clean.csv").read_bytes()
    gone = text.replace(b"\xff\xfe/", b"\xff\xfd/", 1)  # a name no file has
    (tmp_path / "gone.csv").write_bytes(gone)
    offset = gone.index(b"\xff\xfd/")  # the row's first byte that is not UTF-8
    line = gone.count(b"\n", 0, offset) + 1
    message = f"gone.csv is not UTF-8 text: byte 0xff at offset {offset:,} \\(line {line}\\)"
    with pytest.raises(PactlError, match=message):
        load_source(str(tmp_path / "gone.csv"), QUIET)
