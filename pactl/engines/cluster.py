"""Joining a Ray cluster (or starting one on this machine), the options of shard tasks, and
waiting for them: each finished shard logged, a shard that failed after its retries said in one
line. Ray is an optional extra (`pip install 'pactl[ray]'`), imported only here and only when
`--engine ray` is asked for."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pactl.config import EngineConfig
from pactl.console import Reporter
from pactl.errors import PactlError

RAY_MISSING = "--engine ray needs Ray, which is not installed: pip install 'pactl[ray]'"
CONNECT_SECONDS = 5.0  # an address that answers nothing within this is refused at once
LOCAL_OBJECT_STORE = 256 * 2**20  # shards travel as files; the store holds small things only
TASK_RETRIES = 2  # tries after the first, for a task that raised or lost its worker
ITEMS_PER_SHARD = 50_000  # the default cut: at least one shard per this many items
FAULT_ENV = "PACTL_RAY_FAULT"  # tests: KIND:SHARD[:FILE], a fault the task of SHARD meets


def need_ray(engine: EngineConfig) -> None:
    """Refuse `--engine ray` at once where Ray is missing or the cluster at --ray-address does
    not answer, before any listing or reading."""
    if engine.engine != "ray":
        if engine.ray_address is not None or engine.shards:
            given = "--ray-address" if engine.ray_address is not None else "--shards"
            raise PactlError(f"{given} is for --engine ray (by hand: --shard i/n)")
        return
    if importlib.util.find_spec("ray") is None:
        raise PactlError(RAY_MISSING)
    if engine.ray_address:
        check_reachable(engine.ray_address)


def check_reachable(address: str) -> None:
    """A host:port that accepts a TCP connection within CONNECT_SECONDS; other forms (auto,
    ray://) are Ray's to resolve. Ray itself would retry an address that answers nothing for
    minutes."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PactlError(f"--ray-address takes host:port of the cluster's head (got {address!r})")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS):
            pass
    except OSError as e:
        raise PactlError(
            f"no Ray cluster answers at {address} ({e.strerror or e}): start one with `ray start "
            "--head` there, or leave --ray-address out to run Ray on this machine"
        ) from None


@contextlib.contextmanager
def connected(engine: EngineConfig, reporter: Reporter) -> Iterator[Any]:
    """The ray module, joined to --ray-address or to a Ray started on this machine for the
    block (its CPUs, a small object store, no dashboard). A Ray already initialised in this
    process (the Python API's caller's) is used as it is and left running. What Ray prints on
    stdout goes to stderr meanwhile."""
    import ray

    # Ray prints what its raylets report (a worker lost, a task retried) on sys.stdout, where
    # results go: on stderr for the block, with the log lines.
    with contextlib.redirect_stdout(sys.stderr):
        if ray.is_initialized():
            yield ray
        else:
            yield from _started(engine, reporter)


def _started(engine: EngineConfig, reporter: Reporter) -> Iterator[Any]:
    """connected's Ray of its own: joined or started, shut down at the end."""
    import ray

    quiet: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.ERROR,
    }
    started = time.perf_counter()
    if engine.ray_address:
        ray.init(address=engine.ray_address, **quiet)
    else:
        ray.init(num_cpus=os.cpu_count() or 1, object_store_memory=LOCAL_OBJECT_STORE, **quiet)
    where = engine.ray_address or "a Ray started on this machine"
    resources = ray.cluster_resources()
    reporter.log(
        f"on {where}: {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs "
        f"({time.perf_counter() - started:.1f} s to connect)"
    )
    try:
        yield ray
    finally:
        ray.shutdown()


def slots(ray: Any, gpus: bool) -> int:
    """Tasks the cluster runs at once: its GPUs where `gpus` and it has some, else its CPUs."""
    resources = ray.cluster_resources()
    found = resources.get("GPU", 0) if gpus else 0
    return max(1, int(found or resources.get("CPU", 1)))


def task_options(ray: Any, gpus: bool) -> dict[str, Any]:
    """One GPU a task where `gpus` and the cluster reports GPUs, else one CPU; retried after an
    exception or a lost worker (a shard's output is one generation: a retry starts it clean)."""
    on_gpus = gpus and ray.cluster_resources().get("GPU", 0) > 0
    place = {"num_gpus": 1, "num_cpus": 1} if on_gpus else {"num_cpus": 1}
    return {**place, "max_retries": TASK_RETRIES, "retry_exceptions": True}


def wait_all(
    ray: Any,
    refs: Sequence[Any],
    names: Sequence[str],
    reporter: Reporter,
    done: Callable[[int, Any], None],
) -> list[Any]:
    """The results of `refs` in order, calling `done(i, result)` as each arrives; the first
    that failed after its retries cancels the rest and is raised as one line naming it."""
    where = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        i = where[ready[0]]
        try:
            results[i] = ray.get(ready[0])
        except Exception as e:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise PactlError(failure_words(names[i], e)) from None
        done(i, results[i])
    return results


def failure_words(name: str, error: Exception) -> str:
    """One line for a task that failed after its retries: its own error's words, or the
    worker or node the cluster lost."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, PactlError):
        return f"{name}: {cause}"
    kind = type(error).__name__
    if kind in ("WorkerCrashedError", "NodeDiedError", "ObjectLostError", "OwnerDiedError"):
        why = "the cluster lost its worker"
    else:
        text = str(cause if cause is not None else error).strip().splitlines()
        why = " ".join(text[-1:])[:200] or kind
    return (
        f"{name} failed after {1 + TASK_RETRIES} tries ({why}); the shards done are kept: run "
        "the same command again to go on"
    )


@dataclass(frozen=True)
class Fault:
    """A fault a shard task meets, for the tests of retries and resumes ($PACTL_RAY_FAULT =
    KIND:SHARD[:FILE]): raise (an exception), exit (the worker dies) or hang, in the task of
    shard SHARD; with FILE, only while FILE does not exist (the first fault makes it)."""

    kind: str
    shard: int
    once: str | None

    @classmethod
    def from_env(cls) -> Fault | None:
        text = os.environ.get(FAULT_ENV)
        if not text:
            return None
        kind, shard, *once = text.split(":", 2)
        return cls(kind, int(shard), once[0] if once else None)

    def strike(self, shard: int) -> None:
        if shard != self.shard:
            return
        if self.once is not None:
            if Path(self.once).exists():
                return
            Path(self.once).touch()
        if self.kind == "raise":
            raise RuntimeError(f"injected fault in shard {shard}")
        if self.kind == "exit":
            os._exit(1)
        if self.kind == "hang":
            time.sleep(3600)
