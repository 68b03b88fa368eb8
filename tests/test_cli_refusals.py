"""Silent surprises turned into refusals: an --add with a checkpoint that is not the bundle's,
and writes to a read-only bundle (one line, exit 1, no lock file left, reads still work)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import make_class_folder, one_error, read_only_mount, run_cli
from test_hostile_cli import tiny_bundle

from pactl import checkpoint as ckpt


def other_weights(source: Path, target: Path) -> None:
    """`source`'s checkpoint with one weight changed: another network of the same shape."""
    payload = ckpt.load(source)
    name = next(k for k, v in payload["model"].items() if v.is_floating_point())
    payload["model"][name] = payload["model"][name] + torch.ones_like(payload["model"][name])
    payload["fingerprint"] = ckpt.fingerprint(payload["model"])
    ckpt.save(target, payload)


def test_add_refuses_a_checkpoint_that_is_not_the_bundles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tiny_bundle(tmp_path, monkeypatch, capsys)
    other_weights(tmp_path / "best.pt", tmp_path / "other.pt")
    make_class_folder(tmp_path / "new", classes=2, per_class=2, seed=7)
    before = json.loads((bundle / "meta.json").read_text())["generation"]
    add = ["index", str(tmp_path / "new"), "--add", str(bundle), "--quiet"]
    code, out, err = run_cli(
        [*add, "--checkpoint", str(tmp_path / "other.pt")], monkeypatch, capsys
    )
    assert code == 1 and out == ""
    assert f"{tmp_path / 'other.pt'} is not the network of {bundle}" in one_error(err)
    assert json.loads((bundle / "meta.json").read_text())["generation"] == before
    code, out, err = run_cli([*add, "--checkpoint", str(tmp_path / "best.pt")], monkeypatch, capsys)
    assert code == 0 and out.startswith("added 4 items"), err


@pytest.fixture
def read_only_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Path]:
    """tmp_path/served/bundle: a bundle seen through a read-only bind mount, so writes fail
    with EROFS for root too (root ignores chmod, and the suite runs as root)."""
    bundle = tiny_bundle(tmp_path, monkeypatch, capsys)
    (bundle / ".pactl-lock").unlink()  # the build's writer left it; a read must not make one
    seen = tmp_path / "served" / "bundle"
    seen.mkdir(parents=True)
    with read_only_mount(["--bind", "-o", "ro", str(bundle)], seen, "bind-mount read-only"):
        yield seen


def test_writes_to_a_read_only_bundle_are_one_line(
    read_only_bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bundle = read_only_bundle
    assert not os.access(bundle, os.W_OK)  # the mount, not the mode bits, says no
    make_class_folder(tmp_path / "new", classes=2, per_class=2, seed=7)
    for args in (
        ["index", str(bundle), "--delete", "0"],
        ["index", str(bundle), "--compact"],
        ["index", str(tmp_path / "new"), "--add", str(bundle)],
    ):
        code, out, err = run_cli([*args, "--quiet"], monkeypatch, capsys)
        assert code == 1 and out == "", args
        assert f"{bundle} is read-only" in one_error(err), args
    image = str(tmp_path / "imgs" / "class_0" / "0.png")
    code, out, err = run_cli(
        ["query", image, "--index", str(bundle), "--k", "3", "--format", "jsonl"],
        monkeypatch,
        capsys,
    )
    assert code == 0 and len(out.splitlines()) == 3, err
    code, out, err = run_cli(["index", "--verify", str(bundle)], monkeypatch, capsys)
    assert code == 0 and out.startswith("verified"), err
    assert not (bundle / ".pactl-lock").exists()


def test_serve_answers_from_a_read_only_bundle(read_only_bundle: Path, tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from test_serve import start_service, stop_service

    service = start_service(read_only_bundle.parent)
    try:
        image = tmp_path / "imgs" / "class_0" / "0.png"
        with service.client() as client:
            files = [("files", (image.name, image.read_bytes(), "image/png"))]
            answer = client.post("/query?k=2", files=files)
    finally:
        stop_service(service)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["results"][0]["hits"]) == 2
    assert not (read_only_bundle / ".pactl-lock").exists()


def test_sweep_under_torchrun_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every torchrun process would take points of its own and wait in fit()'s first collective
    for the others: a hang. One line instead, naming the way that works."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("PACTL_RUNS", str(tmp_path / "runs"))
    code, out, err = run_cli(
        ["sweep", "digits", "--param", "alpha=16,32", "--name", "s"], monkeypatch, capsys
    )
    assert code == 2 and out == ""
    assert "does not run under torchrun" in one_error(err)
    assert "CUDA_VISIBLE_DEVICES" in one_error(err)
    assert not (tmp_path / "runs").exists()
