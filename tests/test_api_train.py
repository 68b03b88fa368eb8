"""pactl.train() and pactl.evaluate() against `pactl train` and `pactl eval`: the same
settling, the same run, the same numbers; bad input is one PactlError before any work."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY, make_class_folder, run_cli

import pactl
from pactl.errors import PactlError

# TINY's settings by field name, as pactl.train() takes them.
SETTINGS: dict[str, Any] = {
    "backbone": "small",
    "weights": "none",
    "embedding_dim": 16,
    "image_size": 16,
    "batch_size": 8,
    "lr": 1e-3,
    "warmup_epochs": 0,
    "workers": 0,
}


def test_the_settings_are_tinys() -> None:
    """SETTINGS says what TINY says, option by option (--dim is embedding_dim)."""
    options = dict(zip(TINY[::2], TINY[1::2], strict=True))
    fields = {"--dim": "embedding_dim"}
    named = {fields.get(k, k[2:].replace("-", "_")): v for k, v in options.items()}
    assert set(SETTINGS) == set(named)
    assert all(type(value)(named[key]) == value for key, value in SETTINGS.items())


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_train_is_pactl_train(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The same settings given to pactl.train() and to `pactl train` make the same run: the
    same config.json and the same metrics.csv; the Run names its folder, its metrics (as the
    file holds them) and the best.pt of the epoch that file chose."""
    make_class_folder(Path("imgs"), classes=6, per_class=5)
    run = pactl.train("imgs", name="api", epochs=2, seed=3, **SETTINGS)
    args = ["train", "imgs", "--name", "cli", "--epochs", "2", "--seed", "3", *TINY, "-q"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    cli = run.folder.parent / "cli"
    assert run.folder.resolve() == Path("runs", "api").resolve()
    config = json.loads((run.folder / "config.json").read_text())
    theirs = json.loads((cli / "config.json").read_text())
    assert config["model_config"] == theirs["model_config"]
    assert config["train_config"] == theirs["train_config"]
    rows = csv_rows(run.folder / "metrics.csv")
    for mine, its in zip(rows, csv_rows(cli / "metrics.csv"), strict=True):
        assert {k: v for k, v in mine.items() if k != "seconds"} == {
            k: v for k, v in its.items() if k != "seconds"
        }
    frame = run.metrics
    assert frame["epoch"].tolist() == [0, 1, 2]
    assert frame["recall@1"].tolist() == [float(r["recall@1"]) for r in rows]
    assert run.selection == "last" and run.best_epoch == 2  # 3 train classes: none held out
    assert run.best_metrics["recall@1"] == float(rows[2]["recall@1"])
    assert run.checkpoint == run.folder / "best.pt" and run.checkpoint.is_file()


def test_evaluate_is_pactl_eval(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    make_class_folder(Path("imgs"), classes=6, per_class=5)
    run = pactl.train("imgs", name="t", epochs=1, **SETTINGS)
    mine = pactl.evaluate(run.checkpoint)  # the run's own dataset, by default
    args = ["eval", "imgs", "--checkpoint", str(run.checkpoint), "--report", "r.csv", "-q"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    report = csv_rows(Path("r.csv"))[0]
    numbers = {k: float(v) for k, v in report.items() if k not in ("dataset", "checkpoint")}
    assert list(mine) == list(numbers)  # recall@1,2,4,8, map@r, r_precision, nmi, mean_cos
    assert mine == pytest.approx(numbers, rel=1e-5)
    two = pactl.evaluate(run.checkpoint, "imgs", ks=[1, 2])
    assert [k for k in two if k.startswith("recall@")] == ["recall@1", "recall@2"]


def test_resume_continues_with_the_runs_own_settings() -> None:
    make_class_folder(Path("imgs"), classes=6, per_class=5)
    pactl.train("imgs", name="t", epochs=1, **SETTINGS)
    with pytest.raises(PactlError, match=r"not lr \(start a new run"):
        pactl.train(resume="runs/t", lr=0.1)
    run = pactl.train(resume="runs/t", epochs=2)
    assert run.metrics["epoch"].tolist() == [0, 1, 2]


BAD_TRAIN = [
    ({"colour": "red"}, "colour is not a setting of pactl train"),
    ({"batch_sise": 8}, r"batch_sise is not a setting .* \(did you mean batch_size\?\)"),
    ({"batch_size": "8"}, r"batch_size must be an integer from 2 to .* \(got '8'\)"),
    ({"epochs": 2.5}, r"epochs must be an integer .* \(got 2.5\)"),
    ({"image_size": "big"}, r"image_size must be an integer .* \(got 'big'\)"),
    ({"lr": None}, r"lr must be a number .* \(got None\)"),
    ({"loss": "arcface"}, r"loss must be one of proxy_anchor, .* \(got 'arcface'\)"),
    ({"device": 0}, r"device must be auto, cpu, .* \(got 0\)"),
    ({"time_budget": "soon"}, "time_budget 'soon' is not a duration"),
    ({"time_budget": "5m", "epochs": 2}, "give epochs or time_budget, not both"),
    ({"name": "../elsewhere"}, "must be one plain folder name"),
    ({"preset": "imagenet"}, "unknown preset 'imagenet'"),
]


@pytest.mark.parametrize(("settings", "message"), BAD_TRAIN)
def test_bad_settings_are_one_pactl_error_before_any_work(
    settings: dict[str, Any], message: str
) -> None:
    make_class_folder(Path("imgs"), classes=6, per_class=5)
    with pytest.raises(PactlError, match=message) as caught:
        pactl.train("imgs", **{**SETTINGS, **settings})
    assert "\n" not in str(caught.value)
    assert not Path("runs").exists()  # nothing written


def test_a_source_that_is_not_there_is_one_pactl_error() -> None:
    with pytest.raises(PactlError, match="'photos' is neither a known dataset"):
        pactl.train("photos", **SETTINGS)
    with pytest.raises(PactlError, match="give a dataset name, folder or CSV"):
        pactl.train(**SETTINGS)
    assert not Path("runs").exists()


def test_bad_evaluate_input_is_one_pactl_error() -> None:
    make_class_folder(Path("imgs"), classes=6, per_class=5)
    run = pactl.train("imgs", name="t", epochs=1, **SETTINGS)
    cases = [
        (lambda: pactl.evaluate("missing.pt", "imgs"), "checkpoint missing.pt not found"),
        (lambda: pactl.evaluate(run.checkpoint, "photos"), "'photos' is neither"),
        (
            lambda: pactl.evaluate(run.checkpoint, ks=4),
            r"ks must be a list of integers.* 4 \(int\)",
        ),
        (lambda: pactl.evaluate(run.checkpoint, ks=[0]), r"ks must be .* \(got \(0,\)\)"),
        (lambda: pactl.evaluate(run.checkpoint, device="gpu"), "device must be auto"),
        (lambda: pactl.evaluate(run.checkpoint, workers=-1), "workers must be an integer"),
    ]
    for call, message in cases:
        with pytest.raises(PactlError, match=message):
            call()
    Path("elsewhere").mkdir()
    (Path("elsewhere") / "best.pt").write_bytes(run.checkpoint.read_bytes())
    with pytest.raises(PactlError, match="give the dataset, folder or CSV to evaluate on"):
        pactl.evaluate("elsewhere/best.pt")  # no run folder around it to name its dataset


DOCS = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def section_blocks(title: str) -> list[str]:
    """The ```python blocks of one `## title` section of docs/api.md."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)


def test_the_train_and_loss_sections_of_docs_api_print_what_they_say(capsys) -> None:
    """Those two sections' blocks, on their own, in a folder with photos/ as the page's test
    makes it (4 classes of 4 images): the run they print is the one on disk, evaluate's numbers
    are its last epoch's, the misspelt setting is named, the proxies stay float32."""
    make_class_folder(Path("photos"), classes=4, per_class=4)
    namespace: dict[str, Any] = {}
    for title in ("Train and evaluate", "The loss in your own loop"):
        for block in section_blocks(title):
            exec(compile(block, str(DOCS), "exec"), namespace)  # noqa: S102
    lines = capsys.readouterr().out.splitlines()
    folder = Path("runs", "mine").resolve()
    assert lines[0] == f"{folder} 1 {folder / 'best.pt'}"
    rows = csv_rows(folder / "metrics.csv")
    assert lines[1].split() == ["epoch", "recall@1", "map@r"]
    assert [line.split()[1] for line in lines[2:4]] == ["0", "1"]
    recall, map_r = (float(v) for v in lines[4].split())
    assert recall == pytest.approx(float(rows[1]["recall@1"]), abs=1e-6)
    assert map_r == pytest.approx(float(rows[1]["map@r"]), abs=1e-6)
    assert lines[5] == "batch_sise is not a setting of pactl train (did you mean batch_size?)"
    assert re.fullmatch(r"loss \d+\.\d{3} torch\.float32", lines[6])
    assert lines[7:] == []
