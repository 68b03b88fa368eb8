"""bench/bench_audit_quality.py's own logic, offline: which runs it trains, the mean row over
seeds and each target's verdict, against figures worked by hand (no training, no cleanlab)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    """bench.bench_audit_quality from the checkout (bench/ is run from the root, not installed)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("bench.bench_audit_quality")


quality = _load()


def measured(seed: int, ours: tuple[float, float], theirs: tuple[float, float]) -> object:
    figures = {"pactl": ours, "pactl_rows": (0.5, 0.5), "cleanlab": theirs}
    return quality.Measured("glyphs", "0.2", seed, 515, figures)


def test_plan_trains_the_light_noise_at_every_seed_and_the_rest_at_the_first() -> None:
    args = quality.parse_args(["--sets", "fashion,fonts28", "--seeds", "2,5", "--once", "0.45"])
    assert quality.plan(args) == [
        ("fashion", "0.2", 2), ("fashion", "0.2", 5), ("fashion", "0.45", 2),
        ("fonts28", "0.2", 2), ("fonts28", "0.2", 5), ("fonts28", "0.45", 2),
    ]  # fmt: skip
    assert quality.plan(
        quality.parse_args(["--seeds", "0", "--once", "", "--sets", "fonts28"])
    ) == [("fonts28", "0.2", 0)]


def test_an_unknown_set_is_refused() -> None:
    with pytest.raises(SystemExit):
        quality.parse_args(["--sets", "fonts28,cub"])


def test_the_mean_row_and_verdicts_over_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    runs = [
        measured(0, (0.96, 0.80), (0.95, 0.79)),
        measured(1, (0.98, 0.86), (0.95, 0.80)),
        measured(2, (0.99, 0.91), (0.96, 0.84)),
    ]
    judged = quality.print_table(runs)
    # by hand: AUROC (0.96 + 0.98 + 0.99) / 3 = 0.9767, p@K 2.57 / 3 = 0.8567;
    # cleanlab 0.9533 and 0.81: ahead by 0.0233 and 0.0467
    assert len(judged) == 1 and judged[0].seed == -1
    assert judged[0].figures["pactl"] == pytest.approx((0.97667, 0.85667), abs=1e-5)
    quality.targets(judged, "0.2")
    out = capsys.readouterr().out
    assert "| glyphs | 20% symmetric | **mean of 3** | 515 | 0.9767 | 0.8567 |" in out
    assert out.count("| glyphs | 20% symmetric |") == 4
    assert "AUROC >= 0.97: met (0.9767, +0.0067)" in out
    assert "p@K ahead of cleanlab by 0.03: met (0.0467, +0.0167)" in out


def test_a_missed_target_is_named_with_its_shortfall(capsys: pytest.CaptureFixture[str]) -> None:
    heavy = quality.Measured(
        "Fashion-MNIST", "0.5:small_cluster", 0, 750,
        {"pactl": (0.8812, 0.6), "pactl_rows": (0.9, 0.6), "cleanlab": (0.9, 0.7)},
    )  # fmt: skip
    quality.targets(quality.print_table([heavy]), "0.2")
    out = capsys.readouterr().out
    assert (
        "Fashion-MNIST, 50% small cluster (seed 0): AUROC >= 0.90: MISSED (0.8812, -0.0188)" in out
    )
    assert "p@K" not in out.split("\n\n")[1]  # heavy noise is judged by AUROC alone
