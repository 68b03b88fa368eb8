"""--time-budget: durations, the plan against hand-computed cases, and a budgeted run against a
plain run with the schedule the plan chose."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import TINY, make_class_folder, run_cli

from pactl import budget
from pactl.console import duration_words
from pactl.errors import UsageError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15m", 900), ("900", 900), ("90s", 90), ("1.5h", 5400), ("1h30m", 5400), (" 2 min ", 120)],
)
def test_durations(text: str, seconds: float) -> None:
    assert budget.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "15x", "-5m", "0s", "15m junk", "1e3"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(UsageError):
        budget.parse_duration(text)


def test_plan_by_hand() -> None:
    # 900 s budget, 100 s spent, 20 s kept for the end: 780 s hold 15 epochs of 50 s; the
    # recipe (8 epochs, decay every 4) decays at half the run: round(7.5) = 8.
    chosen = budget.plan(900, 100, 50, 20, 8, 4, 1)
    assert (chosen.epochs, chosen.lr_decay_step, chosen.warmup_epochs) == (15, 8, 1)
    assert chosen.fits and chosen.available == 780
    # 60 s left for 70 s epochs: one epoch anyway, and it trains everything (no warm-up).
    short = budget.plan(200, 120, 70, 20, 8, 4, 1)
    assert (short.epochs, short.lr_decay_step, short.warmup_epochs, short.fits) == (1, 1, 0, False)
    # a tiny set under a long budget stops at MAX_BUDGET_EPOCHS
    assert budget.plan(1e6, 0, 0.01, 0, 8, 4, 0).epochs == budget.MAX_BUDGET_EPOCHS
    # a constant rate (the from-scratch recipe: 12 epochs, decay every 1000) stays constant:
    # 780 s hold 39 epochs of 20 s, and no step falls within them
    constant = budget.plan(900, 100, 20, 20, 12, 1000, 0)
    assert (constant.epochs, constant.lr_decay_step) == (39, 1000)
    # a decay at the recipe's very end (12 of 12) stays at the end of the fitted run
    assert budget.plan(900, 100, 20, 20, 12, 12, 0).lr_decay_step == 39


def test_replan_by_hand() -> None:
    # 3 epochs done in 300 s of a 900 s budget, the last 100 s long, 20 s kept: 580 s hold 5
    # more, 8 in all; the recipe's decay (4 of 8) at half of them.
    again = budget.replan(900, 300, 3, 100, 20, 8, 4, 1)
    assert (again.epochs, again.lr_decay_step, again.warmup_epochs, again.fits) == (8, 4, 1, True)
    # nothing left for one more epoch: the run ends with the epochs it has
    ended = budget.replan(900, 850, 3, 100, 20, 8, 4, 1)
    assert (ended.epochs, ended.fits) == (3, False)
    # a constant rate stays constant; the cap holds
    assert budget.replan(900, 100, 2, 10, 0, 12, 1000, 0).lr_decay_step == 1000
    assert budget.replan(1e6, 0, 2, 0.01, 0, 8, 4, 0).epochs == budget.MAX_BUDGET_EPOCHS


def test_stop_early_by_hand() -> None:
    # 900 s budget: 700 s spent, epochs of 150 s, 20 s reserve: 870 <= 927 goes on; 200 s
    # epochs: 920 <= 927 goes on; 220 s: 940 > 927 stops.
    assert not budget.stop_early(900, 700, 150, 20)
    assert not budget.stop_early(900, 700, 200, 20)
    assert budget.stop_early(900, 700, 220, 20)


def test_durations_at_their_limits() -> None:
    """Guards against a limit moved by one: half a second is a budget, a number too large for
    a float (inf) is not, and the words change unit exactly at 90 s and at 1.5 h."""
    assert budget.parse_duration("0.5s") == 0.5
    with pytest.raises(UsageError, match="above 0"):
        budget.parse_duration("9" * 400)
    words = {s: duration_words(s) for s in (89.4, 90, 5399, 5400, 7381)}
    assert words == {89.4: "89 s", 90: "1.5 min", 5399: "90 min", 5400: "1.5 h", 7381: "2.1 h"}


def test_plan_and_replan_at_their_boundaries() -> None:
    """Guards against off-by-one fits and clamps: exactly one epoch's room fits, a sub-second
    epoch is not rounded up to a second, under a second of room still holds short epochs,
    no room fits nothing, and warm-up leaves exactly one epoch that trains everything."""
    # 100 s left for 100 s epochs: one fits, and the plan keeps the estimate and the room
    one = budget.plan(200, 80, 100, 20, 8, 4, 1)
    assert (one.epochs, one.fits, one.epoch_seconds, one.available) == (1, True, 100, 100)
    again = budget.replan(300, 180, 2, 100, 20, 8, 4, 1)
    assert (again.epochs, again.fits, again.epoch_seconds, again.available) == (3, True, 100, 100)
    # 10 s for epochs of 0.5 s: 20 of them; 0.8 s for epochs of 0.2 s: 4
    assert budget.plan(30, 0, 0.5, 20, 8, 4, 0).epochs == 20
    assert budget.plan(20.8, 0, 0.2, 20, 8, 4, 0).epochs == 4
    # the budget already spent: nothing fits (the run trains one epoch anyway)
    spent = budget.plan(100, 150, 10, 0, 8, 4, 0)
    assert (spent.epochs, spent.fits) == (1, False)
    # 3 epochs fitted, the recipe warms up for 5: 2 warm-up epochs, then 1 of everything
    assert budget.plan(50, 0, 10, 20, 8, 4, 5).warmup_epochs == 2


def test_stop_early_at_exactly_the_slack() -> None:
    """Guards against `>=` for `>`: an epoch that would end exactly at the budget plus SLACK
    (103 s of 100 s) is still run."""
    assert 100 * (1 + budget.SLACK) == 103.0
    assert not budget.stop_early(100, 50, 33, 20)
    assert budget.stop_early(100, 50, 33.5, 20)


def rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]


def train_config(run: Path) -> dict[str, object]:
    return json.loads((run / "config.json").read_bytes())["train_config"]  # type: ignore[no-any-return]


def tiny(tmp_path: Path, monkeypatch, capsys, *extra: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    args = ["train", str(tmp_path / "imgs"), *TINY, "--warmup-epochs", "1", "--quiet", *extra]
    return run_cli(args, monkeypatch, capsys)


def epochs_measured_as(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The second plan sees every epoch so far as `seconds` long (in its elapsed time too)."""
    real = budget.replan

    def replan(total: float, elapsed: float, done: int, _: float, *rest: int) -> budget.Plan:
        return real(total, elapsed + done * seconds, done, seconds, *rest)

    monkeypatch.setattr(budget, "replan", replan)


def budgeted_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    estimate: float,
    measured: float,
) -> str:
    """runs/b under a 1,000,000 s budget (recipe decay 6 of 12), its step estimated at `estimate`
    seconds and its epochs measured as `measured`; returns stderr."""
    import pactl.training.loop
    import pactl.training.start

    monkeypatch.setattr(pactl.training.start, "estimate_epoch", lambda *a: estimate)
    epochs_measured_as(monkeypatch, measured)
    # 40 px images: the from-scratch recipe of 12 epochs (images of 32 px or less get 36)
    make_class_folder(tmp_path / "imgs", classes=6, per_class=6, size=40)
    code, _, err = tiny(
        tmp_path, monkeypatch, capsys, "--time-budget", "1000000s", "--lr-decay-step", "6",
        "--name", "b",
    )  # fmt: skip
    assert code == 0, err
    return err


def test_budget_fits_the_schedule_as_a_plain_run_would_have_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An epoch estimated at 300,000 s under a budget of 1,000,000 s: 3 epochs (whatever the few
    seconds spent), the recipe's decay (6 of its 12 epochs) at half the run (round(1.5) = 2) and
    its warm-up epoch kept. Epochs measured as estimated keep the plan. The run is then the same
    as one asked for those settings."""
    budgeted_run(tmp_path, monkeypatch, capsys, 300_000.0, 300_000.0)
    code, _, err = tiny(
        tmp_path, monkeypatch, capsys, "--epochs", "3", "--lr-decay-step", "2", "--name", "p"
    )
    assert code == 0, err
    runs = tmp_path / "runs"
    planned = train_config(runs / "b")
    assert (planned["epochs"], planned["lr_decay_step"], planned["warmup_epochs"]) == (3, 2, 1)
    assert planned["time_budget"] == 1e6
    assert rows(runs / "b") == rows(runs / "p")
    assert [r["lr"] for r in rows(runs / "b")] == ["", "0.001", "0.001", "0.0005"]


@pytest.mark.parametrize(
    ("estimate", "measured", "planned", "replanned"),
    [
        # a step timed on a busy machine: 3 epochs planned (decay 2); the first full epoch
        # (epoch 2) takes 150,000 s, so 700,000 s hold 4 more: 6, decaying at 3. The rate, which
        # the first plan's step 2 halved after epoch 2, is back to 1e-3 for epoch 3.
        (300_000.0, 150_000.0, (3, 2), (6, 3)),
        # a step timed too fast: 9 epochs planned (decay round(4.5) = 4); epochs of 300,000 s
        # leave room for 1 more: 3, decaying at 2, so epoch 3 runs at the halved rate.
        (100_000.0, 300_000.0, (9, 4), (3, 2)),
    ],
)
def test_the_budget_plans_again_after_the_first_full_epoch(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    estimate: float,
    measured: float,
    planned: tuple[int, int],
    replanned: tuple[int, int],
) -> None:
    """The run the second plan makes is the same as a plain run with its schedule: the epochs,
    the decay step and the learning rate of every epoch."""
    import pactl.training.loop
    import pactl.training.start

    plans: list[tuple[int, int]] = []
    real_fit = pactl.training.loop.fit_to_budget

    def fit_to_budget(t: pactl.training.trainer.Trainer, *args: object) -> None:
        real_fit(t, *args)  # type: ignore[arg-type]
        plans.append((t.cfg.epochs, t.cfg.lr_decay_step))

    monkeypatch.setattr(pactl.training.loop, "fit_to_budget", fit_to_budget)
    budgeted_run(tmp_path, monkeypatch, capsys, estimate, measured)
    epochs, decay = replanned
    code, _, err = tiny(
        tmp_path, monkeypatch, capsys, "--epochs", str(epochs), "--lr-decay-step", str(decay),
        "--name", "p",
    )  # fmt: skip
    assert code == 0, err
    runs = tmp_path / "runs"
    assert plans == [planned]
    fitted = train_config(runs / "b")
    assert (fitted["epochs"], fitted["lr_decay_step"], fitted["warmup_epochs"]) == (*replanned, 1)
    assert rows(runs / "b") == rows(runs / "p")
    assert [r["lr"] for r in rows(runs / "b")][1:] == [
        f"{1e-3 * 0.5 ** (e // decay):g}" for e in range(epochs)
    ]


def test_a_second_plan_with_no_room_left_ends_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """9 epochs planned from the step; the first full epoch (epoch 2) takes 600,000 s, so the
    two epochs so far have spent the budget: the run ends there, its rate never decayed."""
    err = budgeted_run(tmp_path, monkeypatch, capsys, 100_000.0, 600_000.0)
    assert "stopping after epoch 2 of 9" in err
    run = tmp_path / "runs" / "b"
    fitted = train_config(run)
    assert (fitted["epochs"], fitted["lr_decay_step"]) == (2, 4)
    assert [(r["epoch"], r["lr"]) for r in rows(run)] == [("0", ""), ("1", "0.001"), ("2", "0.001")]


def test_a_run_past_its_budget_stops_and_says_how_many_epochs_it_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pactl.training.loop
    import pactl.training.start
    from pactl.research.sweep import finished

    monkeypatch.setattr(pactl.training.start, "estimate_epoch", lambda *a: 300_000.0)
    calls: list[float] = []

    def late(*args: float) -> bool:  # the first epoch's check: the machine got slower
        calls.append(args[2])
        return True

    monkeypatch.setattr(budget, "stop_early", late)
    make_class_folder(tmp_path / "imgs", classes=6, per_class=6)
    code, _, err = tiny(tmp_path, monkeypatch, capsys, "--time-budget", "1000000s", "--name", "b")
    assert code == 0, err
    run = tmp_path / "runs" / "b"
    assert len(calls) == 1 and calls[0] > 0  # checked once, with epoch 1's measured seconds
    assert train_config(run)["epochs"] == 1
    assert [r["epoch"] for r in rows(run)] == ["0", "1"]
    assert finished(run)  # a sweep reads the point back instead of training it again


def test_time_budget_refusals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=2)
    code, _, err = tiny(tmp_path, monkeypatch, capsys, "--time-budget", "5m", "--epochs", "3")
    assert code == 2 and "--epochs or --time-budget" in err
    code, _, err = tiny(tmp_path, monkeypatch, capsys, "--time-budget", "soon")
    assert code == 2 and "--time-budget 'soon' is not a duration" in err


def test_print_config_names_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=2)
    code, out, err = tiny(tmp_path, monkeypatch, capsys, "--time-budget", "15m", "--print-config")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["train"]["time_budget"] == 900
    assert any(line.startswith("time budget 15 min: after epoch 0") for line in shown["why"])


def test_sweep_takes_a_budget_as_train_does() -> None:
    from pactl.research.sweep import parse_setting

    assert parse_setting("time_budget=15m", many=False) == ("time_budget", 900.0)
    assert parse_setting("time-budget=5m,10m", many=True) == ("time_budget", (300.0, 600.0))
