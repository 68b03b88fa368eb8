"""pactl sweep: settings parsed by type, and resume (a finished point never rerun, a killed
point resumed from its checkpoint) on a tiny network with 2 epochs a point."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_class_folder, run_cli

from pactl.errors import UsageError
from pactl.research.sweep import SweepConfig, grid, parse_setting, point_name

SETTINGS = [
    "backbone=small", "weights=none", "dim=16", "image_size=16", "batch_size=8", "lr=1e-3",
    "workers=0", "epochs=2", "val_classes=0",
]  # fmt: skip
# The first epoch 1 recorded ends the process as a kill would: no cleanup, the trial RUNNING.
KILLED = """
import os, sys
import pactl.training.loop as train
recorded = train.record_epoch
def record_then_die(t, run_dir, row, *args, **kwargs):
    best = recorded(t, run_dir, row, *args, **kwargs)
    if row["epoch"] == 1:
        os._exit(9)
    return best
train.record_epoch = record_then_die
sys.argv = ["pactl", *sys.argv[1:]]
from pactl.cli import main
main()
"""


def test_settings_are_parsed_by_their_type() -> None:
    assert parse_setting("alpha=4,8", many=True) == ("alpha", (4.0, 8.0))
    assert parse_setting("dim=32,64", many=True) == ("embedding_dim", (32, 64))
    assert parse_setting("pooling=avg,max", many=True) == ("pooling", ("avg", "max"))
    assert parse_setting("freeze_bn=true", many=False) == ("freeze_bn", True)
    for bad in ("alpha", "nosuch=1", "epochs=x", "alpha=4,4"):
        with pytest.raises(UsageError):
            parse_setting(bad, many=True)
    config = SweepConfig("digits", (("alpha", (4.0, 8.0)), ("embedding_dim", (32, 64))))
    assert (
        len(grid(config)) == 4 and point_name(grid(config)[1], 0) == "alpha=4_embedding_dim=64-s0"
    )


def metrics(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]


def test_a_killed_sweep_resumes_and_a_finished_point_is_never_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import optuna

    import pactl.training.loop

    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    folder = tmp_path / "runs" / "sw"
    args = ["sweep", str(tmp_path / "imgs"), "--param", "alpha=16,32", "--name", "sw", "-q"]
    args += [a for s in SETTINGS for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run([sys.executable, "-c", KILLED, *args], env=env, cwd=tmp_path)
    assert killed.returncode == 9
    (first,) = [p for p in (folder / "points").iterdir() if (p / "checkpoint.pt").is_file()]
    before = metrics(first)
    assert [r["epoch"] for r in before] == ["0", "1"]

    calls: list[tuple[str, bool]] = []
    fit = pactl.training.loop.fit

    def counted_fit(source, manifest, model_cfg, cfg, run_dir, reporter, resume=False, **rest):  # type: ignore[no-untyped-def]
        calls.append((run_dir.name, resume))
        return fit(source, manifest, model_cfg, cfg, run_dir, reporter, resume=resume, **rest)

    monkeypatch.setattr(pactl.training.loop, "fit", counted_fit)
    code, out, err = run_cli(
        ["sweep", "--resume", str(folder), "--format", "csv"], monkeypatch, capsys
    )
    assert code == 0, err
    other = ({"alpha=16-s0", "alpha=32-s0"} - {first.name}).pop()
    assert sorted(calls) == sorted([(first.name, True), (other, False)])
    after = metrics(first)
    assert after[:2] == before and [r["epoch"] for r in after] == ["0", "1", "2"]
    assert sorted(r["alpha"] for r in csv.DictReader(out.splitlines())) == ["16", "32"]
    study = optuna.load_study(
        study_name="sweep",
        storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(folder / "journal.log"))
        ),
    )
    states = sorted(t.state.name for t in study.trials)
    assert states == ["COMPLETE", "COMPLETE", "FAIL"]  # the killed trial failed, then redone

    calls.clear()
    code, _, err = run_cli(["sweep", "--resume", str(folder)], monkeypatch, capsys)
    assert code == 0, err
    assert calls == []  # every point finished: nothing trained again
    assert len(study.trials) == 3  # nor a trial added
    assert (folder / "sweep.png").stat().st_size > 0
    assert json.loads((folder / "sweep.json").read_text())["format"] == "pactl.sweep"


@pytest.mark.parametrize(
    ("preset", "swept", "options"),
    [
        (None, {"weights": "none"}, ["--weights", "none"]),
        (
            None,
            {"weights": "none", "warmup_epochs": 2},
            ["--weights", "none", "--warmup-epochs", "2"],
        ),
        ("cub200", {"val_classes": 0.3}, ["--val-classes", "0.3"]),
        ("cub200", {"lr": 1e-3}, ["--lr", "1e-3"]),
    ],
)
def test_a_point_settles_its_settings_as_train_does(
    preset: str | None,
    swept: dict[str, object],
    options: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A swept setting implies what the same train option implies (random weights: BatchNorm
    trains, no warm-up unless asked; held-out classes choose best.pt instead of the paper
    preset's test classes), as train's --print-config shows it."""
    import dataclasses

    from pactl.recipe import resolve_train_config
    from pactl.research.sweep import sweep_point_configs

    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    config = SweepConfig(
        source=str(tmp_path / "imgs"),
        params=tuple((k, (v,)) for k, v in swept.items()),
        fixed=(("epochs", 2),),
        preset=preset,
    )
    model, train = sweep_point_configs(config, "cpu", swept, 0)
    train = resolve_train_config(model, train, False)
    chosen = ["--preset", preset] if preset else []
    code, out, err = run_cli(
        ["train", str(tmp_path / "imgs"), "--epochs", "2", "--device", "cpu", *chosen, *options,
         "--print-config"],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0, err
    shown = json.loads(out)
    assert dataclasses.asdict(model) == shown["model"]  # the same preset: from scratch, its own
    for key in (
        "freeze_bn", "warmup_epochs", "val_classes", "selection", "epochs", "lr", "augment",
        "lr_decay_step", "batch_size",
    ):  # fmt: skip
        assert dataclasses.asdict(train)[key] == shown["train"][key], key
    if preset:  # the paper's preset chooses on the test classes unless classes are held out
        assert train.selection == ("val" if "val_classes" in swept else "test")
    else:  # random weights
        assert train.freeze_bn is False
        assert train.warmup_epochs == swept.get("warmup_epochs", 0)


def test_an_explicit_selection_stays(tmp_path: Path) -> None:
    from pactl.research.sweep import sweep_point_configs

    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    config = SweepConfig(
        source=str(tmp_path / "imgs"),
        params=(("val_classes", (0.3,)),),
        fixed=(("selection", "last"),),
        preset="cub200",
    )
    _, train = sweep_point_configs(config, "cpu", {"val_classes": 0.3}, 0)
    assert train.selection == "last"


def test_a_point_that_fails_ends_the_sweep_with_one_error_line(tmp_path: Path) -> None:
    """A point refused by training (a batch larger than its train split) ends the sweep with
    pactl's one-line error: no traceback from the trial's failure on stderr."""
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    args = ["sweep", str(tmp_path / "imgs"), "--param", "alpha=16,32", "--name", "bad"]
    args += [a for s in [*SETTINGS, "batch_size=64"] for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PACTL_RUNS": "runs"}
    done = subprocess.run(
        [sys.executable, "-m", "pactl", *args], env=env, cwd=tmp_path, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "File " not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--batch-size 64 is larger than the train split" in errors[0]


def test_a_finished_point_the_journal_does_not_mark_complete_is_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Guards against a sweep that never reads a finished point back: a point of two seeds
    whose seed 0 finished and whose seed 1 failed at its start leaves its trial FAILED in
    Optuna's journal, so the resumed sweep runs the trial again, and only the read-back of each
    seed's run folder keeps seed 0 from being trained a second time."""
    import optuna

    import pactl.training.loop
    from pactl.errors import PactlError

    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    folder = tmp_path / "runs" / "sw"
    args = ["sweep", str(tmp_path / "imgs"), "--param", "alpha=16", "--seeds", "0,1"]
    args += ["--name", "sw", "-q", *(a for s in SETTINGS for a in ("--set", s))]
    calls: list[tuple[str, bool]] = []
    fit = pactl.training.loop.fit

    def counted_fit(source, manifest, model_cfg, cfg, run_dir, reporter, resume=False, **rest):  # type: ignore[no-untyped-def]
        calls.append((run_dir.name, resume))
        if run_dir.name.endswith("-s1") and len(calls) == 2:
            raise PactlError("the disk is full (a failure planted by the test)")
        return fit(source, manifest, model_cfg, cfg, run_dir, reporter, resume=resume, **rest)

    monkeypatch.setattr(pactl.training.loop, "fit", counted_fit)
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 1 and "planted by the test" in err
    assert calls == [("alpha=16-s0", False), ("alpha=16-s1", False)]
    done = folder / "points" / "alpha=16-s0"
    before = (done / "metrics.csv").read_bytes()
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(folder / "journal.log"))
    )
    study = optuna.load_study(study_name="sweep", storage=storage)
    assert [t.state.name for t in study.trials] == ["FAIL"]  # not complete: seed 1 failed

    calls.clear()
    code, _, err = run_cli(["sweep", "--resume", str(folder)], monkeypatch, capsys)
    assert code == 0, err
    assert calls == [("alpha=16-s1", False)]  # seed 0 read back, never trained again
    assert "alpha=16-s0: finished before, read back" in err
    assert (done / "metrics.csv").read_bytes() == before
    study = optuna.load_study(study_name="sweep", storage=storage)
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
    with open(done / "metrics.csv", newline="") as f:
        seed0 = float(list(csv.DictReader(f))[-1]["recall@1"])  # selection: the last epoch
    assert study.trials[1].user_attrs["scores"][0] == pytest.approx(seed0)


def write_point(points: Path, name: str, recalls: list[float] | None, epochs: int = 2) -> None:
    """A point's run folder as training leaves it: config.json, metrics.csv (Recall@1 after
    each epoch; None: no epoch yet), best.pt (its content is not read)."""
    run = points / name
    run.mkdir(parents=True)
    info = {"format": "pactl.run", "train_config": {"epochs": epochs, "selection": "last"}}
    (run / "config.json").write_text(json.dumps(info))
    if recalls is None:
        return
    rows = "".join(f"{e},{r},1.0\n" for e, r in enumerate(recalls))
    (run / "metrics.csv").write_text("epoch,recall@1,seconds\n" + rows)
    (run / "best.pt").write_bytes(b"")


def test_the_sweep_figure_draws_a_dot_per_finished_point_and_seed(tmp_path: Path) -> None:
    """Guards against a sweep figure that plots no point (or the wrong ones): 2 x 2 points and
    two seeds, seven finished and one still training; each axis has a dot at the Recall@1 of
    each finished point and seed (best.pt's epoch, here the last), at its value's position, and
    a line through each value's mean."""
    from pactl.research.sweep import sweep_figure

    config = SweepConfig("digits", (("alpha", (16.0, 32.0)), ("lr", (0.001, 0.01))), seeds=(0, 1))
    points = tmp_path / "points"
    recall = {  # (alpha, lr, seed): Recall@1 after the last epoch
        (16.0, 0.001, 0): 0.1, (16.0, 0.001, 1): 0.2, (16.0, 0.01, 0): 0.3, (16.0, 0.01, 1): 0.4,
        (32.0, 0.001, 0): 0.5, (32.0, 0.001, 1): 0.6, (32.0, 0.01, 0): 0.7,
    }  # fmt: skip
    for (alpha, lr, seed), r in recall.items():
        write_point(points, point_name({"alpha": alpha, "lr": lr}, seed), [0.0, 0.05, r])
    write_point(points, point_name({"alpha": 32.0, "lr": 0.01}, 1), [0.0, 0.9], epochs=2 + 1)
    fig = sweep_figure(points, config)
    assert len(fig.axes) == 2
    for position, (ax, (_, values)) in enumerate(zip(fig.axes, config.params, strict=True)):
        dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
        drawn = sorted((float(x), float(y)) for d in dots for x, y in d.get_xydata())
        want = sorted((float(values.index(k[position])), r) for k, r in recall.items())
        assert len(drawn) == 7  # a dot per finished point and seed; none for the unfinished
        np.testing.assert_allclose(drawn, want)
        (mean,) = [line for line in ax.get_lines() if line.get_gid() == "sweep-mean"]
        means = [np.mean([r for x, r in want if x == i]) for i in range(len(values))]
        np.testing.assert_allclose(mean.get_ydata(), means)
