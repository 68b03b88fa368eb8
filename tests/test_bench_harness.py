"""bench/harness.py: the median and spread of timed repeats, peak memory of a fresh process,
and the JSON record of a run (machine, commit, parameters, figures)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _harness() -> ModuleType:
    """bench.harness from the checkout (bench/ is run from the repository root, not installed)."""
    if "bench.harness" in sys.modules:
        return sys.modules["bench.harness"]
    spec = importlib.util.spec_from_file_location("bench.harness", ROOT / "bench" / "harness.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench.harness"] = module
    spec.loader.exec_module(module)
    return module


harness = _harness()


def test_median_and_spread_of_repeats_by_hand() -> None:
    # sorted 1, 2, 3, 4, 10: median 3; deviations 2, 1, 0, 1, 7 -> sorted 0, 1, 1, 2, 7: MAD 1
    timing = harness.Timing(wall=(3.0, 1.0, 10.0, 2.0, 4.0))
    assert timing.median == 3.0
    assert timing.spread == 1.0
    assert timing.fastest == 1.0
    # an even count: median 2.5 of 1..4, deviations 1.5, 0.5, 0.5, 1.5 -> MAD 1.0
    even = harness.Timing(wall=(4.0, 1.0, 3.0, 2.0))
    assert (even.median, even.spread) == (2.5, 1.0)


def test_timed_counts_repeats_after_the_warm_up() -> None:
    calls: list[int] = []
    timing, last = harness.timed(lambda: calls.append(len(calls)) or len(calls), repeats=3,
                                 warmup=2)  # fmt: skip
    assert len(calls) == 5 and len(timing.wall) == 3 and len(timing.cpu) == 3
    assert last == 5


def test_interleaved_calls_each_step_once_a_round_in_a_shuffled_order() -> None:
    order: list[str] = []
    steps = {name: (lambda n=name: order.append(n)) for name in "abc"}
    timings = harness.interleaved(steps, rounds=4, warmup=1, seed=0)
    assert sorted(timings) == ["a", "b", "c"]
    assert all(len(t.wall) == 4 for t in timings.values())
    rounds = [order[i : i + 3] for i in range(0, len(order), 3)]
    assert len(rounds) == 5 and all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # shuffled, not one fixed order


def test_markdown_tables_keep_header_and_rows_without_the_separator() -> None:
    printed = "intro\n| a | b |\n| --- | ---: |\n| 1 | 2.5 |\n| x | y |\nafter\n"
    assert harness.markdown_tables(printed) == [
        {"header": ["a", "b"], "rows": [["1", "2.5"], ["x", "y"]]}
    ]


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="VmHWM is Linux's")
def test_a_fresh_process_reports_its_own_peak_not_its_parents() -> None:
    small = harness.run_fresh(["-c", "pass"])
    big = harness.run_fresh(["-c", "b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096])"])
    assert big.peak_bytes - small.peak_bytes > 150 * 2**20
    assert small.peak_bytes < 150 * 2**20  # the parent (pytest, numpy...) is not counted


def test_a_result_records_machine_commit_params_and_figures(tmp_path: Path) -> None:
    record = harness.result("demo", command="python -m bench demo --n 3", params={"n": 3},
                            figures={"tables": [], "lines": ["ok"]}, quick=True)  # fmt: skip
    path = harness.write_result(record, tmp_path)
    assert path == tmp_path / "demo.quick.json"
    saved = json.loads(path.read_text())
    assert {"machine", "commit", "params", "figures", "command", "when"} <= set(saved)
    assert saved["params"] == {"n": 3} and saved["figures"]["lines"] == ["ok"]
    machine = saved["machine"]
    assert machine["cores"] >= 1 and machine["python"].count(".") == 2
    assert {"cpu", "memory_bytes", "packages"} <= set(machine)
    assert "numpy" in machine["packages"]
    assert set(saved["commit"]) == {"sha", "dirty"}
