"""The one start of a run (pactl.verbs.train.start_run): `pactl train` and pactl.train() both
go through it, and the same mistake is the same error line through either door (the CLI naming
an option where the API names its keyword)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import TINY, make_class_folder, run_cli

import pactl
from pactl.config import TRAIN_RULES, option_name
from pactl.errors import PactlError, UsageError
from pactl.recipe import CHOSEN_BY

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


def test_both_doors_call_the_one_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The verb replaced, the CLI and the API each reach it once, with the same source, the
    same settings by field name and the same run options."""
    import pactl.verbs.train as verb

    calls: list[tuple[Any, ...]] = []

    def start_run(source: Any, settings: Any, reporter: Any, **options: Any) -> Any:
        del options["words"]  # how each door names a setting: its own
        options["others"] = list(options.get("others", ()))  # the CLI's own run options
        calls.append((source, dict(settings), options))
        raise UsageError("stopped at the start")

    monkeypatch.setattr(verb, "start_run", start_run)
    args = ["train", "imgs", "--name", "a", "--epochs", "2", "--time-budget", "5m", *TINY]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 2 and "stopped at the start" in err
    with pytest.raises(UsageError, match="stopped at the start"):
        pactl.train("imgs", name="a", epochs=2, time_budget="5m", **SETTINGS)
    assert len(calls) == 2
    assert calls[0] == calls[1]
    assert calls[0][1] == {**SETTINGS, "epochs": 2, "time_budget": "5m"}
    assert calls[0][2] == {"preset": None, "name": "a", "resume": None, "others": []}
    assert not Path("runs").exists()


def as_keywords(line: str) -> str:
    """A CLI error line as the API words it: each option named by its field's keyword."""
    for field in ("time_budget", "epochs", "image_size"):
        line = line.replace(option_name(field), field)
    return line.replace("--resume", "resume=")


# (the CLI's arguments after `pactl train`, pactl.train()'s keywords): one mistake each, or
# two, where the doors used to name different ones first.
BAD = [
    (["imgs", "--preset", "imagenet"], {"source": "imgs", "preset": "imagenet"}),
    (  # a bad preset comes first, before a value the preset's settings would not take
        ["imgs", "--preset", "imagenet", "--image-size", "1"],
        {"source": "imgs", "preset": "imagenet", "image_size": 1},
    ),
    (  # both given comes first, before a budget that is no duration
        ["imgs", "--time-budget", "soon", "--epochs", "3"],
        {"source": "imgs", "time_budget": "soon", "epochs": 3},
    ),
    (["imgs", "--time-budget", "soon"], {"source": "imgs", "time_budget": "soon"}),
    (  # a name that is no folder's, before what a resume refuses
        ["--resume", "runs/t", "--name", "../elsewhere"],
        {"resume": "runs/t", "name": "../elsewhere"},
    ),
    (["photos"], {"source": "photos"}),
    ([], {}),
]


@pytest.mark.parametrize(("args", "keywords"), BAD)
def test_the_same_mistake_is_the_same_line_through_either_door(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    keywords: dict[str, Any],
) -> None:
    make_class_folder(Path("imgs"), classes=6, per_class=5)
    code, out, err = run_cli(["train", *args], monkeypatch, capsys)
    assert code == 2 and out == ""
    cli = " ".join(err.split()).removeprefix("error: ")
    with pytest.raises(PactlError) as caught:
        pactl.train(**keywords)
    assert str(caught.value) == as_keywords(cli)
    assert not Path("runs").exists()  # nothing written by either


def test_what_chooses_best_pt_is_worded_for_every_selection() -> None:
    """One table says it for the recipe and for the run's last line, for each choice."""
    assert set(CHOSEN_BY) == set(TRAIN_RULES["selection"].names)
    assert all(chooser.recipe and chooser.result for chooser in CHOSEN_BY.values())
