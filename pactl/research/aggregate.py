"""Runs of one recipe folded into groups, and each group's numbers: the mean and the sample
standard deviation (n - 1) over its seeds (what `pactl compare` shows and draws).

Runs whose configs differ only by seed (and by settings that do not change a recipe: device,
workers) are one group. A run still training (fewer rows than its epochs) gives the epochs it
has; a run with no epoch yet gives no numbers.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pactl.errors import PactlError

if TYPE_CHECKING:
    import pandas as pd

# Settings that never make two runs different recipes (where or how fast they ran), and the seed,
# which makes them repeats of one recipe.
NOT_RECIPE = {
    "train.device",
    "train.workers",
    "train.follow_links",
    "train.channels_last",
    "model.dimension",
}
SEED = "train.seed"
SEED_SUFFIX = re.compile(r"-s\d+$")
INSTALL = "pip install 'pactl[research]'"


@dataclass
class Run:
    """One run folder as compare reads it."""

    path: Path
    dataset: str
    settings: dict[str, Any]  # model.* and train.* from config.json
    metrics: pd.DataFrame  # metrics.csv, numbers only (NaN where a cell is empty)
    selection: str  # val | test | last: what chose best.pt
    epochs_done: int = 0
    best: int | None = None  # the epoch best.pt holds

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def status(self) -> str:
        planned = int(self.settings.get("train.epochs", 0))
        if not self.epochs_done and self.metrics.empty:
            return "no epoch yet"
        return "done" if self.epochs_done >= planned else f"{self.epochs_done}/{planned} epochs"


@dataclass
class Group:
    """Runs of one recipe (differing only by seed)."""

    runs: list[Run]
    differs: dict[str, Any] = field(default_factory=dict)  # the settings that set it apart

    @property
    def name(self) -> str:
        names = {SEED_SUFFIX.sub("", r.name) for r in self.runs}
        return names.pop() if len(names) == 1 else self.runs[0].name


def pandas() -> Any:
    """pandas, or one line naming the extra that installs it."""
    try:
        import pandas as pd
    except ImportError:
        raise PactlError(f"pactl compare needs pandas: {INSTALL}") from None
    return pd


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs with the same dataset and settings but the seed, in the order first seen; each group
    with the settings whose values differ between groups."""
    groups: dict[str, Group] = {}
    for run in runs:
        key = json.dumps(
            [run.dataset, {k: v for k, v in run.settings.items() if k not in {SEED, *NOT_RECIPE}}],
            sort_keys=True,
            default=str,
        )
        groups.setdefault(key, Group([])).runs.append(run)
    found = list(groups.values())
    names = sorted({k for g in found for k in g.runs[0].settings} - {SEED, *NOT_RECIPE})
    shown = {"train.loss", "model.backbone"}  # columns of their own
    varying = [
        k
        for k in names
        if k not in shown and len({_key(g.runs[0].settings.get(k)) for g in found}) > 1
    ]
    for g in found:
        g.differs = {k: g.runs[0].settings.get(k) for k in varying}
    return found


def _key(value: Any) -> str:
    return json.dumps(value, default=str)


def run_numbers(run: Run, ks: list[int], at: tuple[int, ...] = ()) -> dict[str, float]:
    """Best (the epoch best.pt holds) and last Recall@K and MAP@R on the test classes, Recall@1
    and MAP@R after each epoch of `at` (NaN where the run has not reached or evaluated it), the
    best epoch, epochs done and seconds spent (every epoch's, epoch 0's evaluation included)."""
    frame = run.metrics
    numbers: dict[str, float] = {"epochs done": float(run.epochs_done)}
    if frame.empty:
        return numbers
    last = frame.loc[frame["epoch"].idxmax()]
    best = frame.loc[frame["epoch"] == run.best].iloc[0] if run.best is not None else None
    for column in [f"recall@{k}" for k in ks] + ["map@r"]:
        numbers[f"best {column}"] = _get(best, column) if best is not None else math.nan
        numbers[f"last {column}"] = _get(last, column)
    for epoch in at:
        row = frame.loc[frame["epoch"] == epoch]
        for column in ("recall@1", "map@r"):
            numbers[f"{column} at {epoch}"] = _get(row.iloc[0], column) if len(row) else math.nan
    numbers["best epoch"] = float(run.best) if run.best is not None else math.nan
    numbers["seconds"] = float(frame["seconds"].sum()) if "seconds" in frame else math.nan
    return numbers


def _get(row: Any, column: str) -> float:
    value = row.get(column) if row is not None else None
    return float(value) if value is not None and not isnan(value) else math.nan


def isnan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def recall_ks(runs: list[Run]) -> list[int]:
    """The K of every test recall@K column any run has, in order."""
    ks = {
        int(c.split("@")[1])
        for r in runs
        for c in r.metrics.columns
        if c.startswith("recall@") and c.split("@")[1].isdigit()
    }
    return sorted(ks)


def summary(groups: list[Group], at: tuple[int, ...] = ()) -> pd.DataFrame:
    """One row per group: its name, runs, status, loss, backbone, differing settings, then
    each number's mean and standard deviation over the group's runs (`<name> mean`,
    `<name> std`; std is NaN for a group of one). A mean over runs of which some lack the
    number (an epoch not reached) is over the runs that have it."""
    pd = pandas()
    runs = [r for g in groups for r in g.runs]
    ks = recall_ks(runs)
    rows = []
    for g in groups:
        numbers = pd.DataFrame([run_numbers(r, ks, at) for r in g.runs])
        row: dict[str, Any] = {
            "run": g.name,
            "runs": len(g.runs),
            "seeds": ",".join(str(r.settings.get(SEED)) for r in g.runs),
            "status": ", ".join(sorted({r.status for r in g.runs})),
            "dataset": g.runs[0].dataset,
            "loss": g.runs[0].settings.get("train.loss"),
            "backbone": g.runs[0].settings.get("model.backbone"),
            "chosen by": g.runs[0].selection,
            **{k.split(".", 1)[1]: v for k, v in g.differs.items()},
        }
        for column in numbers.columns:
            row[f"{column} mean"] = float(numbers[column].mean())
            row[f"{column} std"] = float(numbers[column].std()) if len(numbers) > 1 else math.nan
        rows.append(row)
    return pd.DataFrame(rows)
