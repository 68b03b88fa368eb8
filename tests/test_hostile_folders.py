"""Hostile embed folders and bundles: tampered files, odd names, misuse of the output options.
Each must end in one line on stderr (or work exactly), never a traceback or a wrong answer."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_class_folder, one_error, run_cli

from pactl.config import IndexConfig
from pactl.console import QUIET
from pactl.embed import read_embedded
from pactl.errors import PactlError
from pactl.index import check_factory, load_bundle
from pactl.store.generations import current_dir
from pactl.verbs.index import index_vectors

MODEL = ["--backbone", "small", "--weights", "none", "--image-size", "16"]


def ok(args: list[str], monkeypatch: Any, capsys: Any) -> str:
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    return out


def refused(args: list[str], monkeypatch: Any, capsys: Any, match: str, code: int = 1) -> str:
    got, _, err = run_cli(args, monkeypatch, capsys)
    assert got == code and err.count("\n") == 1, err  # not even a warning
    assert match in one_error(err), err
    return err


@pytest.fixture
def vec(tmp_path: Path, monkeypatch: Any, capsys: Any) -> Path:
    imgs = make_class_folder(tmp_path / "imgs", classes=2, per_class=3)
    ok(["embed", str(imgs), *MODEL, "--out", str(tmp_path / "vec")], monkeypatch, capsys)
    return tmp_path / "vec"


def edit_meta(folder: Path, **changes: Any) -> None:
    path = current_dir(folder) / "meta.json"
    meta = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            meta.pop(key)
        else:
            meta[key] = value
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"count": "6"}, "field 'count' should be int, not str"),
        ({"count": 10**15}, "field 'count' is 1000000000000000, outside"),
        ({"dimension": 0}, "field 'dimension' is 0, outside [1, 65536]"),
        ({"dimension": True}, "field 'dimension' should be int, not bool"),
        ({"fingerprint": 7}, "field 'fingerprint' should be str"),
        ({"fingerprint": ...}, "lacks the field 'fingerprint'"),
        ({"model_config": ...}, "lacks the field 'model_config'"),
        ({"version": 99}, "written by a newer pactl"),
        ({"files": {"vectors.npy": 1}}, "vectors.npy is truncated or corrupt, or from another"),
    ],
)
def test_tampered_vectors_meta_is_one_line(
    changes: dict[str, Any], match: str, vec: Path, monkeypatch: Any, capsys: Any
) -> None:
    edit_meta(vec, **changes)
    err = refused(["index", str(vec)], monkeypatch, capsys, match)
    assert str(vec / "meta.json") in err or str(vec) in err


@pytest.mark.parametrize(
    "content",
    [
        b"garbage, not an array",
        b"\x93NUMPY\x01\x00",  # a truncated header
        "object",  # an object array: pickled Python objects
        "float64",
        "3d",
    ],
)
def test_bad_vectors_file_is_one_line(
    content: Any, vec: Path, monkeypatch: Any, capsys: Any
) -> None:
    path = current_dir(vec) / "vectors.npy"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "object":
        np.save(path, np.array([{"a": 1}] * 6, dtype=object), allow_pickle=True)
    elif content == "float64":
        np.save(path, np.zeros((6, 128)))
    else:
        np.save(path, np.zeros((6, 128, 1), dtype=np.float32))
    edit_meta(vec, files=None)  # as written by an older pactl: the sizes are not recorded
    refused(["index", str(vec)], monkeypatch, capsys, "vectors.npy")


def test_non_utf8_and_crlf_names_round_trip(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    """File names are bytes: one that is not UTF-8, or that holds a CR or a newline, is embedded,
    indexed and found, and items.csv gives back its exact bytes."""
    imgs = make_class_folder(tmp_path / "imgs", classes=2, per_class=3)
    odd = [b"caf\xe9.png", b"car\rriage.png", b"new\nline.png", b'a,"quoted".png']
    for name, source in zip(odd, sorted((imgs / "class_0").iterdir()), strict=False):
        os.rename(source, os.path.join(os.fsencode(imgs / "class_0"), name))
    ok(["index", str(imgs), *MODEL, "--out", str(tmp_path / "b")], monkeypatch, capsys)
    bundle = load_bundle(tmp_path / "b")
    names = {os.fsencode(p).rsplit(b"/", 1)[1] for p in bundle.items.paths.tolist()}
    assert set(odd[:3]) <= names and len(bundle.items) == 6
    vectors, items, _ = read_embedded(tmp_path / "b" / "vectors")
    assert len(items) == len(vectors) == 6
    query = os.path.join(os.fsencode(imgs / "class_0"), odd[0])
    done = subprocess.run(
        [sys.executable, "-m", "pactl", "query", query, "--index", str(tmp_path / "b")]
        + ["--k", "1", "-0", "--paths-only"],
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == query + b"\0"  # the hit is the query itself, its bytes exact


def test_files_honour_the_umask(vec: Path, tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    old = os.umask(0o027)
    try:
        ok(["index", str(vec), "--out", str(tmp_path / "b")], monkeypatch, capsys)
    finally:
        os.umask(old)
    for path in current_dir(tmp_path / "b").iterdir():
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o066 == 0o040, (path, oct(mode))  # group may read, others nothing
    # Files replaced atomically (checkpoints, reports) start as 0600 temporaries: not kept.
    from pactl.store.generations import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "report.csv", "a\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "report.csv").stat().st_mode) == 0o644


@pytest.mark.parametrize("shard", ["1", "a/b", "4/4", "-1/4", "0/0", "0/100000", "1/2/3"])
def test_shard_mistakes_are_usage_errors(
    shard: str, vec: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    args = ["embed", str(tmp_path / "imgs"), *MODEL, "--out", str(tmp_path / "s"), "--shard", shard]
    refused(args, monkeypatch, capsys, "--shard", code=2)
    assert not (tmp_path / "s").exists()


def test_shard_auto_with_a_bad_rank(
    vec: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.setenv("RANK", "x")
    args = [
        "embed",
        str(tmp_path / "imgs"),
        *MODEL,
        "--out",
        str(tmp_path / "s"),
        "--shard",
        "auto",
    ]
    refused(args, monkeypatch, capsys, "--shard", code=2)


@pytest.mark.parametrize("out", [".", "shards/x"])
def test_a_bundle_never_overwrites_its_own_vectors(
    out: str, vec: Path, monkeypatch: Any, capsys: Any
) -> None:
    before = read_embedded(vec)[1].paths.tolist()
    refused(["index", str(vec), "--out", str(vec / out)], monkeypatch, capsys, "its own input", 2)
    with pytest.raises(PactlError, match="its own input"):  # the library refuses it too
        index_vectors(vec, vec / out, IndexConfig(), QUIET)
    assert read_embedded(vec)[1].paths.tolist() == before


@pytest.mark.parametrize(
    "factory",
    ["HNSW0", "HNSW1", "IVF0,Flat", "PQ4x0", "NSG2", "RR0,Flat", "IVF99999999999,Flat", "Flat;rm"],
)
def test_factories_that_would_abort_are_refused_first(
    factory: str, vec: Path, monkeypatch: Any, capsys: Any
) -> None:
    with pytest.raises(PactlError):
        check_factory(factory)
    refused(["index", str(vec), "--factory", factory], monkeypatch, capsys, factory, code=2)


def test_search_params_are_checked(
    vec: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    ok(
        ["index", str(vec), "--out", str(tmp_path / "b"), "--factory", "HNSW32"],
        monkeypatch,
        capsys,
    )
    for bad in ("efSearch=0", "efSearch=-3", "efSearch=1e9", "x"):
        edit_meta(tmp_path / "b", search_params=bad)
        with pytest.raises(PactlError, match="search_params"):
            load_bundle(tmp_path / "b")


def test_a_symlinked_copy_and_a_flat_copy_both_load(
    vec: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """Copied with links kept (cp -a) or followed (scp -r): both read the same."""
    import shutil

    ok(["index", str(vec), "--out", str(tmp_path / "b")], monkeypatch, capsys)
    shutil.copytree(tmp_path / "b", tmp_path / "kept", symlinks=True)
    shutil.copytree(tmp_path / "b", tmp_path / "followed", symlinks=False)
    want = load_bundle(tmp_path / "b").items.paths.tolist()
    for copy in ("kept", "followed"):
        assert load_bundle(tmp_path / copy).items.paths.tolist() == want
    # and a write into the followed copy makes it a linked folder again
    ok(["index", str(vec), "--out", str(tmp_path / "followed")], monkeypatch, capsys)
    assert (tmp_path / "followed" / ".pactl-current").is_symlink()
    assert load_bundle(tmp_path / "followed").items.paths.tolist() == want


def test_a_filesystem_without_links_is_one_line(
    vec: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    import errno

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "symlink", refuse)  # as on FAT or some network shares
    args = ["index", str(vec), "--out", str(tmp_path / "b"), "--quiet"]
    refused(args, monkeypatch, capsys, "symbolic links")
    assert not (tmp_path / "b").exists()  # the first write failed: no folder left


def test_a_run_moved_with_its_bundle_still_answers(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    import shutil

    from conftest import train_tiny

    run = train_tiny(tmp_path, monkeypatch, capsys)
    ok(
        [
            "index",
            str(tmp_path / "imgs"),
            "--checkpoint",
            str(run / "best.pt"),
            "--out",
            str(run / "index"),
        ],
        monkeypatch,
        capsys,
    )
    query = ["query", str(tmp_path / "imgs" / "class_0" / "0.png"), "--k", "1", "--format", "csv"]
    moved = tmp_path / "elsewhere" / "t"
    moved.parent.mkdir()
    shutil.move(run, moved)  # runs/<run>/index moved together with its best.pt
    assert "class_0" in ok([*query, "--index", str(moved / "index")], monkeypatch, capsys)
    ok(
        ["index", str(tmp_path / "imgs" / "class_1"), "--add", str(moved / "index")],
        monkeypatch,
        capsys,
    )
    alone = tmp_path / "alone"
    shutil.move(moved / "index", alone)  # the bundle without its run
    refused([*query, "--index", str(alone)], monkeypatch, capsys, "--checkpoint PATH")
    with_checkpoint = [*query, "--index", str(alone), "--checkpoint", str(moved / "best.pt")]
    assert "class_0" in ok(with_checkpoint, monkeypatch, capsys)


def test_missing_shards_are_named(vec: Path, tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    for shard in ("0/4", "2/4"):
        args = [
            "embed",
            str(tmp_path / "imgs"),
            *MODEL,
            "--out",
            str(tmp_path / "s"),
            "--shard",
            shard,
        ]
        ok(args, monkeypatch, capsys)
    refused(["index", str(tmp_path / "s")], monkeypatch, capsys, "missing: 1/4, 3/4")


def test_an_output_folder_holding_something_else_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out names a folder that holds what the command would write over: a manifest called
    items.csv, a bundle where vectors go, vectors where a bundle goes. Refused in one line,
    the folder as it was; a folder of the same kind is rewritten as before."""
    imgs = make_class_folder(tmp_path / "imgs", classes=2, per_class=3)
    monkeypatch.chdir(tmp_path)
    rows = [f"{p.relative_to(imgs)},{p.parent.name}" for p in sorted(imgs.rglob("*.png"))]
    manifest = imgs / "items.csv"
    manifest.write_text("path,label\n" + "\n".join(rows) + "\n")
    before = manifest.read_bytes()

    def refused(args: list[str], held: str) -> None:
        code, out, err = run_cli(args, monkeypatch, capsys)
        assert (code, out) == (1, ""), err
        assert one_error(err).startswith(f"error: {args[args.index('--out') + 1]} holds {held}")

    refused(["embed", str(manifest), *MODEL, "--out", str(imgs)], "items.csv, which pactl did")
    assert manifest.read_bytes() == before and not (imgs / "vectors.npy").exists()
    for args in (["embed", "imgs", *MODEL, "--out", "vec"], ["index", "vec", "--out", "b"]):
        assert run_cli(args, monkeypatch, capsys)[0] == 0
    assert run_cli(["embed", "imgs", *MODEL, "--out", "vec2"], monkeypatch, capsys)[0] == 0
    bundle_files = sorted(os.listdir("b"))
    refused(["embed", "imgs", *MODEL, "--out", "b"], "an index bundle; writing embedded vectors")
    refused(["index", "vec", "--out", "vec2"], "embedded vectors; writing an index bundle")
    refused(["index", "imgs", *MODEL, "--out", "vec2"], "embedded vectors; writing an index")
    assert sorted(os.listdir("b")) == bundle_files and load_bundle(Path("b")).live_count == 6
    assert (
        read_embedded(Path("vec2"))[1].paths.tolist()
        == read_embedded(Path("vec"))[1].paths.tolist()
    )
    # the same kinds again: an embed goes on, a rebuild replaces
    assert run_cli(["embed", "imgs", *MODEL, "--out", "vec"], monkeypatch, capsys)[0] == 0
    assert run_cli(["index", "vec", "--out", "b"], monkeypatch, capsys)[0] == 0
