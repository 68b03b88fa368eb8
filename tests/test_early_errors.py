"""A missing image is one error line before anything heavy starts: every verb that reads images
checks that its files are there before it builds or loads a network (which takes seconds on
a real backbone), so the mistake is said at once, not after the network has loaded. (`dedup`
reads no image: `--keep` uses the sizes and times its bundle recorded.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TINY, make_class_folder, one_error, run_cli


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of the TINY network on a CSV, and its index bundle: root/runs/t, root/bundle."""
    root = tmp_path_factory.mktemp("early")
    make_class_folder(root / "imgs", classes=6, per_class=4)
    rows = [f"imgs/class_{c}/{n}.png,{c}" for c in range(6) for n in range(4)]
    (root / "data.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PACTL_HOME", str(root / "home"))
        mp.chdir(root)
        from pactl.cli import main

        for args in (
            ["train", "data.csv", "--epochs", "1", "--name", "t", *TINY, "--quiet"],
            ["index", "data.csv", "--checkpoint", "runs/t/best.pt", "--out", "bundle", "-q"],
        ):
            mp.setattr("sys.argv", ["pactl", *args])
            with pytest.raises(SystemExit) as done:
                main()
            assert done.value.code in (0, None)
    return root


class NetworkBuilt(Exception):
    """Raised where a network would be built or loaded."""


def refuse_networks(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, building or loading a network raises NetworkBuilt."""

    def refused(*args: object, **kwargs: object) -> None:
        raise NetworkBuilt

    monkeypatch.setattr("pactl.model.build_model", refused)
    monkeypatch.setattr("pactl.backbones.build_backbone", refused)


VERBS = {
    "train": ["train", "{csv}", *TINY, "--epochs", "1", "--name", "u"],
    "embed": ["embed", "{csv}", "--checkpoint", "{run}/best.pt", "--out", "vec"],
    "eval": ["eval", "{csv}", "--checkpoint", "{run}/best.pt"],
    "index": ["index", "{csv}", "--checkpoint", "{run}/best.pt", "--out", "b2"],
    "query": ["query", "{missing}", "--index", "{bundle}"],
    "audit": ["audit", "{run}", "--source", "{csv}"],
    "plot": ["plot", "{run}"],
}


def lose_an_image(trained: Path, tmp_path: Path) -> dict[str, str]:
    """A copy of the run's images, CSV and run folder with one image deleted (the run's
    config.json pointing at the copy): the fields of VERBS's arguments."""
    import shutil

    shutil.copytree(trained / "imgs", tmp_path / "imgs")
    shutil.copy(trained / "data.csv", tmp_path / "data.csv")
    shutil.copytree(trained / "runs", tmp_path / "runs")
    config = tmp_path / "runs" / "t" / "config.json"
    config.write_text(config.read_text().replace(str(trained), str(tmp_path)))
    return {
        "csv": str(tmp_path / "data.csv"),
        "run": str(tmp_path / "runs" / "t"),
        "bundle": str(trained / "bundle"),
        "missing": str(tmp_path / "imgs" / "class_4" / "2.png"),
    }


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_missing_image_is_one_error_before_any_network_is_built(
    verb: str,
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fields = lose_an_image(trained, tmp_path)
    Path(fields["missing"]).unlink()
    refuse_networks(monkeypatch)
    args = [a.format(**fields) for a in VERBS[verb]]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code != 0, err
    line = one_error(err)
    assert "class_4/2.png" in line and "not found" in line
