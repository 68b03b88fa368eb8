"""A binary bundle under the kill and tamper tests a float one passes: a kill between any two
steps of a build, --add, --delete or --compact leaves the old bundle or the new one, never a mix
of codes and float vectors; a byte changed in its rotation or float vectors is found by
--verify and named; a truncated or mismatched file is refused on open in one line."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_class_folder, one_error, run_cli, unit
from test_bundle_integrity import flip
from test_crash_points import MODEL, Zygote, change, each_crash_point, embed, no_leftovers
from test_faults import environment, kill_at_random, pactl
from test_ondisk import write_vectors_folder

from pactl.errors import PactlError
from pactl.index import load_bundle, verify_bundle
from pactl.index.search import search


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def consistent(folder: Path) -> list[str]:
    """The bundle's live paths, after checking that its codes, float vectors and items agree
    and that each live item's float vector finds itself (or a copy) first."""
    bundle = load_bundle(folder)
    index = bundle.index
    assert index.ntotal == len(bundle.items) == index.floats.shape[0]
    live = np.flatnonzero(~bundle.is_deleted(bundle.items.ids))
    queries = np.ascontiguousarray(index.floats[live])
    scores, found = search(bundle, queries, 1, rescore=50)  # its own code is among them
    assert (scores[:, 0] > 1 - 1e-5).all() and (found[:, 0] >= 0).all()
    return sorted(bundle.items.paths.take(live).tolist())


def test_binary_index_and_add_killed_at_every_step(
    zygote: Zygote,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=3, per_class=3, seed=1)
    bundle = tmp_path / "bundle"
    args = ["index", str(imgs), *MODEL, "--binary", "--bits", "64", "--out", str(bundle)]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    start = consistent(bundle)
    change(imgs, tmp_path)
    embed(imgs, tmp_path / "vec", monkeypatch, capsys)

    def setup(folder: Path) -> None:
        shutil.copytree(bundle, folder, symlinks=True)

    rebuild = ["index", str(tmp_path / "vec"), "--binary", "--bits", "64", "--overwrite"]
    left = each_crash_point(zygote, setup, lambda f: [*rebuild, "--out", str(f)], tmp_path / "i")
    assert len(left) >= 3
    want = sorted(str(p) for p in imgs.rglob("*.png"))
    for folder in left:
        assert consistent(folder) in (start, want), folder.name
        assert run_cli([*rebuild, "--out", str(folder)], monkeypatch, capsys)[0] == 0
        assert consistent(folder) == want
        no_leftovers(folder)

    (tmp_path / "a").mkdir()
    left = each_crash_point(
        zygote, setup, lambda f: ["index", str(imgs), "--add", str(f)], tmp_path / "a"
    )
    assert len(left) >= 5
    for folder in left:
        assert consistent(folder) in (start, want), folder.name
        code, _, err = run_cli(["index", str(imgs), "--add", str(folder)], monkeypatch, capsys)
        assert code == 0, err
        assert consistent(folder) == want and len(load_bundle(folder).deleted) == 1
        no_leftovers(folder)


def vectors_bundle(root: Path, n: int = 60) -> Path:
    """root/b: a binary bundle (BFlat, 32 bits) of n clustered vectors in root/v."""
    rng = np.random.default_rng(4)
    centres = unit(rng.standard_normal((6, 32)))
    vectors = unit(centres[rng.integers(0, 6, n)] + 0.3 * rng.standard_normal((n, 32)))
    write_vectors_folder(root / "v", vectors.astype(np.float32), np.arange(n))
    args = ["index", str(root / "v"), "--binary", "--bits", "32", "--rescore", "4", "--quiet"]
    code = pactl([*args, "--out", str(root / "b")], environment(root)).wait(timeout=300)
    assert code == 0
    return root / "b"


def test_binary_delete_and_compact_killed_at_every_step(
    zygote: Zygote,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bundle = vectors_bundle(tmp_path, n=40)

    def state(folder: Path) -> tuple[list[str], list[int]]:
        return consistent(folder), load_bundle(folder).deleted.tolist()

    def walk(args: list[str], old: Any, new: Any) -> None:
        def setup(folder: Path) -> None:
            shutil.copytree(bundle, folder, symlinks=True)

        place = tmp_path / args[0].strip("-")
        left = each_crash_point(zygote, setup, lambda f: ["index", str(f), *args], place)
        assert len(left) >= 3
        seen = set()
        for folder in left:
            now = state(folder)
            assert now in (old, new), folder.name
            seen.add("new" if now == new else "old")
            assert run_cli(["index", str(folder), *args], monkeypatch, capsys)[0] == 0
            assert state(folder) == new
            no_leftovers(folder)
        assert seen == {"old", "new"}

    paths = [f"s/{i}" for i in range(40)]
    without = sorted(set(paths) - {"s/3", "s/7"})
    walk(["--delete", "3", "--delete", "s/7"], (sorted(paths), []), (without, [3, 7]))
    assert run_cli(["index", str(bundle), "--delete", "3", "--delete", "7"], *[
        monkeypatch, capsys
    ])[0] == 0  # fmt: skip
    walk(["--compact"], (without, [3, 7]), (without, []))


def test_a_binary_build_killed_at_random_is_whole_after_the_rerun(tmp_path: Path) -> None:
    bundle = vectors_bundle(tmp_path, n=3000)
    env = environment(tmp_path)
    rng = random.Random(11)
    args = ["index", str(tmp_path / "v"), "--binary", "--bits", "32", "--overwrite", "--quiet"]
    args += ["--rotation", "itq"]
    for _ in range(2):
        kill_at_random([*args, "--out", str(bundle)], env, rng, 0.5, 3.0)
        consistent(bundle)  # whatever is there is a whole bundle: the old one or the new
    assert pactl([*args, "--out", str(bundle)], env).wait(timeout=300) == 0
    assert len(consistent(bundle)) == 3000
    assert not [p for p in bundle.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("name", ["floats.npy", "rotation.npy", "index.faiss"])
def test_same_size_tampering_is_found_by_verify_and_named(tmp_path: Path, name: str) -> None:
    bundle = vectors_bundle(tmp_path)
    file = bundle / name
    flip(file, file.stat().st_size - 5)
    with pytest.raises(PactlError, match=f"{name} is damaged"):
        verify_bundle(bundle)


@pytest.mark.parametrize("name", ["floats.npy", "rotation.npy"])
def test_a_truncated_file_is_refused_on_open_in_one_line(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = vectors_bundle(tmp_path)
    file = bundle / name
    file.write_bytes(file.read_bytes()[:-64])
    with pytest.raises(PactlError, match=f"{name} is truncated or corrupt"):
        load_bundle(bundle)
    code, out, err = run_cli(["dedup", str(bundle), "--threshold", "0.9"], monkeypatch, capsys)
    assert code == 1 and out == "" and name in one_error(err)


def test_files_that_do_not_fit_their_meta_are_refused(tmp_path: Path) -> None:
    bundle = vectors_bundle(tmp_path)
    meta_file = bundle / "meta.json"
    meta = json.loads(meta_file.read_text())
    for record, says in (
        ({**meta["binary"], "bits": 64}, "do not fit meta.json"),
        ({**meta["binary"], "bits": 12}, "not whole bytes"),
        ({**meta["binary"], "rotation": "pca"}, "unknown rotation"),
        (None, "lacks the field 'binary'"),
    ):
        changed = {**meta, "binary": record} if record is not None else {
            k: v for k, v in meta.items() if k != "binary"
        }  # fmt: skip
        meta_file.write_text(json.dumps(changed))
        with pytest.raises(PactlError, match=says):
            load_bundle(bundle)
    meta_file.write_text(json.dumps(meta))
    np.save(bundle / "rotation.npy", np.zeros((33, 32), dtype=np.float64))  # not float32
    with pytest.raises(PactlError):
        load_bundle(bundle)
