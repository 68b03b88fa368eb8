"""The one way bench/ measures: timing, peak memory, the machine, and the result it records.

Timing: untimed warm-up calls first (they page in memory-mapped files, fill caches, compile),
then timed repeats; a figure is the median of the repeats, its spread the median absolute
deviation from that median (robust to the one run a neighbour's job slowed down), and the
fastest run beside them. Several steps compared with one another run interleaved, one call of
each per round in a shuffled order, so that a change in the machine's load falls on all alike.

Peak memory: the high-water mark of resident memory (VmHWM in /proc/<pid>/status) of a fresh
process that runs only the measured work, read by that process itself as it ends. A fresh
process, because a process's peak includes everything it ever held; read by itself, because
ru_maxrss of a child counts its parent's size when it was forked (vfork and fork alike), and
RUSAGE_CHILDREN is the largest of all children waited for. `run_fresh` starts such a process;
`own_peak_bytes` is the same reading from inside one a benchmark started itself.

Results: `result()` is the JSON record of one run (machine, git commit, parameters, figures),
`write_result()` puts it under bench/results/.
"""

from __future__ import annotations

import json
import os
import platform
import random
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FORMAT = "pactl-bench-result/1"
PEAK_FILE_ENV = "PACTL_BENCH_PEAK_FILE"  # where a fresh process writes its own peak
Key = TypeVar("Key", bound=Hashable)
PACKAGES = ("numpy", "torch", "torchvision", "faiss-cpu", "faiss-gpu", "faiss", "timm")


# ---- timing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed repeat (warm-up calls excluded), wall and CPU of this process."""

    wall: tuple[float, ...]
    cpu: tuple[float, ...] = ()

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def spread(self) -> float:
        """Median absolute deviation of the repeats from their median, in seconds."""
        middle = self.median
        return statistics.median(abs(t - middle) for t in self.wall)

    @property
    def fastest(self) -> float:
        return min(self.wall)

    @property
    def cpu_median(self) -> float | None:
        return statistics.median(self.cpu) if self.cpu else None

    def as_dict(self) -> dict[str, Any]:
        return {"median_s": self.median, "spread_s": self.spread, "fastest_s": self.fastest,
                "cpu_median_s": self.cpu_median, "repeats": len(self.wall),
                "wall_s": list(self.wall), "cpu_s": list(self.cpu)}  # fmt: skip


def timed(run: Callable[[], Any], *, repeats: int, warmup: int = 1) -> tuple[Timing, Any]:
    """`run` called `warmup` times untimed, then `repeats` times timed; the timing and the last
    call's result."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    result = None
    for _ in range(warmup):
        result = run()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = run()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return Timing(tuple(wall), tuple(cpu)), result


def interleaved(
    steps: dict[Key, Callable[[], Any]],
    *,
    rounds: int,
    warmup: int = 1,
    seed: int = 0,
    sync: Callable[[], None] | None = None,
    on_round: Callable[[int, dict[Key, Timing]], None] | None = None,
) -> dict[Key, Timing]:
    """Each step called once per round in an order shuffled by `seed`; `warmup` rounds untimed.
    `sync` runs before each clock reading (e.g. torch.cuda.synchronize, so that a GPU's queued
    work is counted where it was issued); `on_round` sees the timings after each timed round."""
    order = random.Random(seed)
    names = list(steps)
    wall: dict[Key, list[float]] = {name: [] for name in names}
    cpu: dict[Key, list[float]] = {name: [] for name in names}
    for round_index in range(warmup + rounds):
        order.shuffle(names)
        for name in names:
            if sync is not None:
                sync()
            start, start_cpu = time.perf_counter(), time.process_time()
            steps[name]()
            if sync is not None:
                sync()
            if round_index >= warmup:
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
        if round_index >= warmup and on_round is not None:
            on_round(round_index - warmup + 1, _timings(steps, wall, cpu))
    return _timings(steps, wall, cpu)


def _timings(
    steps: dict[Key, Any], wall: dict[Key, list[float]], cpu: dict[Key, list[float]]
) -> dict[Key, Timing]:
    return {name: Timing(tuple(wall[name]), tuple(cpu[name])) for name in steps}


# ---- peak memory -------------------------------------------------------------------------------


def status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A kB field of /proc/<pid>/status (VmHWM, VmRSS, RssAnon...) in bytes; None where the
    process is gone or the kernel has no such field."""
    return _kb_field(f"/proc/{pid}/status", field)


def _kb_field(path: str, field: str) -> int | None:
    """The `field: N kB` line of a /proc file in bytes; None where it or the file is missing."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def own_peak_bytes() -> int:
    """This process's peak resident memory so far (VmHWM); meaningful in a fresh process."""
    peak = status_bytes("VmHWM")
    if peak is None:
        raise RuntimeError("no VmHWM in /proc/self/status: peak memory is measured on Linux")
    return peak


@dataclass(frozen=True)
class FreshRun:
    """A fresh process's wall seconds, its own peak resident memory and what it printed."""

    seconds: float
    peak_bytes: int
    returncode: int
    stdout: str
    stderr: str


def run_fresh(
    python_args: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
    python: str | None = None, check: bool = True,
) -> FreshRun:  # fmt: skip
    """Run `python [python_args]` (`-m module ...`, `-c code ...` or `script ...`) in a fresh
    process started through this module, which reads its VmHWM as it ends. `python` may name
    another interpreter (one with bench/ importable from `cwd` or PYTHONPATH)."""
    with tempfile.TemporaryDirectory(prefix="pactl-bench-peak-") as scratch:
        peak_file = Path(scratch) / "peak"
        child_env = {**(env if env is not None else os.environ), PEAK_FILE_ENV: str(peak_file)}
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO), child_env.get("PYTHONPATH", "")) if p
        )  # bench/ importable from any cwd, as from the repository root
        command = [python or sys.executable, "-m", "bench.harness", *python_args]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=child_env, cwd=cwd)
        seconds = time.perf_counter() - start
        if check and done.returncode != 0:
            tail = done.stderr[-2000:]
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {tail}")
        peak = int(peak_file.read_text()) if peak_file.is_file() else -1
    return FreshRun(seconds, peak, done.returncode, done.stdout, done.stderr)


def _run_as_fresh_process(args: list[str]) -> None:
    """`python -m bench.harness ARGS`: run ARGS as `python ARGS` would, then write this
    process's VmHWM to $PACTL_BENCH_PEAK_FILE, however the work ended."""
    try:
        if args[:1] == ["-m"] and len(args) >= 2:
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[:1] == ["-c"] and len(args) >= 2:
            sys.argv = ["-c", *args[2:]]
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
        elif args:
            sys.argv = list(args)
            runpy.run_path(args[0], run_name="__main__")
        else:
            raise SystemExit("usage: python -m bench.harness (-m MODULE | -c CODE | SCRIPT) ARGS")
    finally:
        target = os.environ.get(PEAK_FILE_ENV)
        if target:
            Path(target).write_text(str(own_peak_bytes()))


# ---- the machine, the commit, the result -------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU, cores (and those this process may use), memory,
    load, OS, and the versions of Python and the numeric packages (read without importing them)."""
    memory = status_meminfo("MemTotal")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_bytes": memory,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": {p: v for p in ("pactl", *PACKAGES) if (v := _version(p)) is not None},
    }


def status_meminfo(field: str) -> int | None:
    """A kB field of /proc/meminfo in bytes."""
    return _kb_field("/proc/meminfo", field)


def commit() -> dict[str, Any]:
    """The checkout's commit and whether the working tree differed from it."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO)
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def result(
    name: str, *, command: str, params: dict[str, Any], figures: dict[str, Any], quick: bool
) -> dict[str, Any]:
    """The JSON record of one benchmark run."""
    return {
        "format": FORMAT,
        "benchmark": name,
        "quick": quick,
        "command": command,
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "commit": commit(),
        "params": params,
        "figures": figures,
    }


def result_path(name: str, quick: bool, folder: Path = RESULTS) -> Path:
    return folder / (f"{name}.quick.json" if quick else f"{name}.json")


def write_result(record: dict[str, Any], folder: Path = RESULTS) -> Path:
    """Write `record` to bench/results/NAME[.quick].json (the previous one is replaced)."""
    path = result_path(record["benchmark"], record["quick"], folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(record, indent=1, default=str) + "\n")
    temporary.replace(path)
    return path


def markdown_tables(text: str) -> list[dict[str, Any]]:
    """The markdown tables a benchmark printed, as header and rows of cells (the separator row
    dropped): the figures it reported, in the words it reported them."""
    tables: list[dict[str, Any]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        stripped = line.strip()
        if stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1:
            current.append([cell.strip() for cell in stripped[1:-1].split("|")])
            continue
        if current:
            body = [row for row in current[1:] if not all(set(c) <= set("-: ") for c in row)]
            tables.append({"header": current[0], "rows": body})
            current = []
    return tables


if __name__ == "__main__":
    _run_as_fresh_process(sys.argv[1:])
