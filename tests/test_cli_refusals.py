"""Silent surprises turned into refusals: an --add with a checkpoint that is not the bundle's,
and writes to a read-only bundle (one line, exit 1, no lock file left, reads still work)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_class_folder, one_error, run_cli
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
