"""`--time-budget`: a training run's schedule fitted to a wall-clock budget.

The plan is made after epoch 0 (the evaluation before the first step), from what this run
measured: the seconds spent so far (header checks, building the network, epoch 0), one timed
training step with its decoding (pactl.training.timing.estimate_epoch) and epoch 0's evaluation
time. It keeps one evaluation's time in reserve for the end of the run (curves, the calibration
of best.pt) and fits as many epochs as the rest holds. The recipe's shape is kept: the learning
rate decays at the same fractions of the run (a recipe of 8 epochs decaying every 4 decays at
half of the fitted run), and head-only warm-up epochs stay as many as the recipe has, leaving at
least one epoch that trains everything.

A plan from one step can be off either way (a step timed while other work shared the cores, a
machine that gets busier, an epoch slower than its step), so it is made once more (`replan`)
after the first epoch that trains everything (the first after the head-only warm-up), from that
whole epoch's measured duration: the run grows or shrinks to what the budget holds, and its decay
step moves to the same fraction of the new length. After each epoch the run still stops early
when the next epoch, at the last one's measured duration, would end past the budget; the run's
config.json then says how many epochs it trained.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pactl.errors import UsageError

MAX_BUDGET_EPOCHS = 1000  # a budget far beyond a small set's epochs still ends
SLACK = 0.03  # an epoch may end this share of the budget late before the run stops early
_UNITS = {None: 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_PART = r"(\d+(?:\.\d+)?)\s*(min|s|m|h)?"
_WHOLE = re.compile(r"\s*(?:\d+(?:\.\d+)?\s*(?:min|s|m|h)?\s*)+")


def parse_duration(text: str) -> float:
    """`15m` -> 900.0; `90s`, `90` (seconds), `1.5h`, `1h30m`, `2 min` also; above 0."""
    cleaned = text.lower()
    if not _WHOLE.fullmatch(cleaned):
        raise UsageError(f"{text!r} is not a duration: give e.g. 15m, 900s, 1.5h or 1h30m")
    seconds = sum(float(n) * _UNITS[unit or None] for n, unit in re.findall(_PART, cleaned))
    if not 0 < seconds < math.inf:
        raise UsageError(f"{text!r}: a time budget must be above 0")
    return seconds


@dataclass(frozen=True)
class Plan:
    epochs: int
    lr_decay_step: int
    warmup_epochs: int
    epoch_seconds: float  # the estimate the plan was made from
    available: float  # seconds left for epochs when the plan was made
    fits: bool  # whether even one epoch fits (else the run trains one anyway)


def plan(
    budget: float,
    elapsed: float,
    epoch_seconds: float,
    reserve: float,
    recipe_epochs: int,
    recipe_decay_step: int,
    recipe_warmup: int,
) -> Plan:
    """As many epochs as `budget` holds after `elapsed` and `reserve`, the decay step and
    warm-up scaled from the recipe's."""
    available = budget - elapsed - reserve
    fitted = _epochs_in(available, epoch_seconds)
    epochs = min(max(fitted, 1), MAX_BUDGET_EPOCHS)
    decay = _decay_step(epochs, recipe_epochs, recipe_decay_step)
    warmup = min(recipe_warmup, max(epochs - 1, 0))
    return Plan(epochs, decay, warmup, epoch_seconds, available, fitted >= 1)


def replan(
    budget: float,
    elapsed: float,
    done: int,
    epoch_seconds: float,
    reserve: float,
    recipe_epochs: int,
    recipe_decay_step: int,
    warmup: int,
) -> Plan:
    """The plan made again after `done` epochs, the last of which took `epoch_seconds` (the
    first that trained everything): `done` plus as many epochs as the rest of the budget holds
    (none: the run ends now), the decay step scaled from the recipe's to the new length."""
    available = budget - elapsed - reserve
    fitted = _epochs_in(available, epoch_seconds)
    epochs = max(done, min(done + fitted, MAX_BUDGET_EPOCHS))
    decay = _decay_step(epochs, recipe_epochs, recipe_decay_step)
    return Plan(epochs, decay, warmup, epoch_seconds, available, fitted >= 1)


def _epochs_in(available: float, epoch_seconds: float) -> int:
    return math.floor(available / max(epoch_seconds, 1e-6)) if available > 0 else 0


def _decay_step(epochs: int, recipe_epochs: int, recipe_decay_step: int) -> int:
    """The recipe's decay step at the same fraction of a run of `epochs`."""
    if recipe_decay_step >= recipe_epochs:  # a constant rate stays constant
        return max(recipe_decay_step, epochs)
    return max(1, round(epochs * recipe_decay_step / max(recipe_epochs, 1)))


def stop_early(budget: float, elapsed: float, last_epoch_seconds: float, reserve: float) -> bool:
    """Whether one more epoch as long as the last would end past the budget (with SLACK)."""
    return elapsed + last_epoch_seconds + reserve > budget * (1 + SLACK)
