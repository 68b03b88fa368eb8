"""A kill between every pair of steps of a folder write leaves the old output or the new one.

Each command runs in a child process with $PACTL_CRASH_AT=N, which SIGKILLs it at its Nth crash
point (pactl.store.generations.crash_point: after each rename, link switch and removal); N walks up
from 1 until the command finishes without reaching it. After each kill the folder must read as the
old output or as the new one, never a mix, and running the command again must finish it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FORKING_PACTL, make_class_folder, run_cli, unit

from pactl.config import IndexConfig
from pactl.console import QUIET
from pactl.embed import read_embedded
from pactl.errors import PactlError
from pactl.index import add_to_bundle, build_index, delete_items, load_bundle, save_bundle
from pactl.store.generations import CRASH_ENV, GENERATION_PREFIX, writer_lock

MODEL = ["--backbone", "small", "--weights", "none", "--image-size", "16"]


# After FORKING_PACTL: per line of stdin, fork a child for each job of the
# line at once, then print their exit codes (-9: killed at the crash point).
ZYGOTE = r"""
for line in sys.stdin:
    jobs, pids = json.loads(line), []
    for job in jobs:
        pid = os.fork()
        if pid == 0:
            run_pactl(job)
        pids.append(pid)
    print(json.dumps([exit_code(os.waitpid(pid, 0)[1]) for pid in pids]), flush=True)
"""


class Zygote:
    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", FORKING_PACTL + ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def run(self, runs: list[tuple[list[str], int]], logs: Path) -> list[int]:
        """Run each `(args, crash_at)` at once in its own forked child; their exit codes
        (-9: killed at its crash point)."""
        keep = ("PACTL_HOME", "PACTL_RUNS")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        jobs = [
            {
                "args": [*args, "--quiet"],
                "env": {**env, CRASH_ENV: str(n)},
                "cwd": os.getcwd(),
                "log": str(logs / f"{n}.log"),
            }
            for args, n in runs
        ]
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(jobs) + "\n")
        self.process.stdin.flush()
        codes: list[int] = json.loads(self.process.stdout.readline())
        for (_, n), code in zip(runs, codes, strict=True):
            if code not in (0, -signal.SIGKILL):
                raise AssertionError((logs / f"{n}.log").read_text()[-2000:])
        return codes

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def each_crash_point(
    zygote: Zygote,
    setup: Callable[[Path], None],
    args: Callable[[Path], list[str]],
    tmp_path: Path,
) -> list[Path]:
    """Folders left by killing the command at crash point 1, 2, ... (two at a time), up to the
    first run that finished; each folder is prepared by `setup` from the same starting state."""
    left: list[Path] = []
    batch, n = 2, 1
    tmp_path.mkdir(exist_ok=True)
    while True:
        folders = [tmp_path / f"crash-{n + i}" for i in range(batch)]
        for folder in folders:
            setup(folder)
        codes = zygote.run([(args(f), n + i) for i, f in enumerate(folders)], tmp_path)
        left += [f for f, code in zip(folders, codes, strict=True) if code != 0]
        if 0 in codes:
            assert codes[codes.index(0) :] == [0] * (batch - codes.index(0))
            return left
        n += batch
        assert n < 40, "more crash points than any command has"


def contents(folder: Path) -> tuple[list[str], np.ndarray]:
    vectors, items, _ = read_embedded(folder)
    return items.paths.tolist(), np.asarray(vectors)


def same(a: tuple[list[str], np.ndarray], b: tuple[list[str], np.ndarray]) -> bool:
    return a[0] == b[0] and np.allclose(a[1], b[1], atol=1e-6)


def no_leftovers(folder: Path) -> None:
    """Exactly one generation, no scratch: what killed runs left was removed by the rerun."""
    hidden = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    gens = [h for h in hidden if h.startswith(GENERATION_PREFIX)]
    assert len(gens) == 1 and set(hidden) - set(gens) == {".pactl-current", ".pactl-lock"}, hidden


def change(imgs: Path, tmp_path: Path) -> None:
    """Two images more (a new class) and one replaced."""
    make_class_folder(tmp_path / "more", classes=1, per_class=2, seed=5)
    shutil.copytree(tmp_path / "more" / "class_0", imgs / "class_9")
    (imgs / "class_1" / "0.png").write_bytes((tmp_path / "more" / "class_0" / "0.png").read_bytes())


def embed(imgs: Path, out: Path, monkeypatch: Any, capsys: Any) -> None:
    code, _, err = run_cli(["embed", str(imgs), *MODEL, "--out", str(out)], monkeypatch, capsys)
    assert code == 0, err


def test_embed_killed_at_every_step(
    zygote: Zygote,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=3, per_class=3, seed=1)
    start = tmp_path / "start"
    embed(imgs, start, monkeypatch, capsys)
    old = contents(start)
    change(imgs, tmp_path)
    embed(imgs, tmp_path / "want", monkeypatch, capsys)
    want = contents(tmp_path / "want")
    assert not same(old, want)

    def setup(folder: Path) -> None:
        shutil.copytree(start, folder, symlinks=True)

    left = each_crash_point(
        zygote, setup, lambda f: ["embed", str(imgs), *MODEL, "--out", str(f)], tmp_path
    )
    assert len(left) >= 3  # before the switch, after it, after removing the old generation
    seen = set()
    for folder in left:
        now = contents(folder)
        assert same(now, old) or same(now, want), folder.name
        seen.add("new" if same(now, want) else "old")
        embed(imgs, folder, monkeypatch, capsys)  # the rerun finishes the job
        assert same(contents(folder), want)
        no_leftovers(folder)
    assert seen == {"old", "new"}  # kills fell on both sides of the switch


def test_index_and_add_killed_at_every_step(
    zygote: Zygote,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    imgs = make_class_folder(tmp_path / "imgs", classes=3, per_class=3, seed=1)
    vec, bundle = tmp_path / "vec", tmp_path / "bundle"
    code, _, err = run_cli(["index", str(imgs), *MODEL, "--out", str(bundle)], monkeypatch, capsys)
    assert code == 0, err
    start = load_bundle(bundle).items.paths.tolist()
    change(imgs, tmp_path)
    embed(imgs, vec, monkeypatch, capsys)
    want = read_embedded(vec)[1].paths.tolist()

    def setup(folder: Path) -> None:
        shutil.copytree(bundle, folder, symlinks=True)

    # A rebuild of the bundle from other vectors.
    left = each_crash_point(
        zygote, setup, lambda f: ["index", str(vec), "--out", str(f)], tmp_path / "i"
    )
    assert len(left) >= 3
    for folder in left:
        paths = load_bundle(folder).items.paths.tolist()
        assert paths in (start, want), folder.name
        assert run_cli(["index", str(vec), "--out", str(folder)], monkeypatch, capsys)[0] == 0
        assert load_bundle(folder).items.paths.tolist() == want
        no_leftovers(folder)

    # An --add: the new images are embedded into a scratch folder, then appended.
    (tmp_path / "a").mkdir()
    left = each_crash_point(
        zygote, setup, lambda f: ["index", str(imgs), "--add", str(f)], tmp_path / "a"
    )
    assert len(left) >= 5
    added = sorted(set(want) - set(start))
    replaced = str(imgs / "class_1" / "0.png")  # change() rewrote it: --add replaces its vector
    for folder in left:
        paths = load_bundle(folder).items.paths.tolist()
        assert paths == start or paths == start + sorted([*added, replaced]), folder.name
        code, _, err = run_cli(["index", str(imgs), "--add", str(folder)], monkeypatch, capsys)
        assert code == 0, err
        done = load_bundle(folder)
        live = done.items.take(~done.is_deleted(done.items.ids)).paths.tolist()
        assert sorted(live) == sorted(start + added) and len(done.deleted) == 1
        no_leftovers(folder)


def test_delete_and_compact_killed_at_every_step(
    zygote: Zygote,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = np.random.default_rng(2)
    bundle = tmp_path / "bundle"
    vectors = unit(rng.normal(size=(40, 8))).astype(np.float32)
    index, record = build_index(vectors, IndexConfig(factory="Flat"), QUIET)
    rows = [(i, f"/x/{i}.png", "") for i in range(40)]
    save_bundle(bundle, index, rows, {"fingerprint": "f", **record})

    def setup(folder: Path) -> None:
        shutil.copytree(bundle, folder, symlinks=True)

    def state(folder: Path) -> tuple[list[int], list[int]]:
        loaded = load_bundle(folder)
        return loaded.items.ids.tolist(), loaded.deleted.tolist()

    def rerun(folder: Path, args: list[str]) -> None:
        code, _, err = run_cli(["index", str(folder), *args], monkeypatch, capsys)
        assert code == 0, err

    def walk(args: list[str], old: Any, new: Any) -> None:
        left = each_crash_point(
            zygote, setup, lambda f: ["index", str(f), *args], tmp_path / args[0].strip("-")
        )
        assert len(left) >= 3
        seen = set()
        for folder in left:
            now = state(folder)
            assert now in (old, new), folder.name
            seen.add("new" if now == new else "old")
            rerun(folder, args)  # the rerun finishes the job
            assert state(folder) == new
            no_leftovers(folder)
        assert seen == {"old", "new"}

    start, deleted = state(bundle), (list(range(40)), [3, 7])
    walk(["--delete", "3", "--delete", "/x/7.png"], start, deleted)
    delete_items(bundle, ids=[3, 7])
    walk(["--compact"], deleted, ([i for i in range(40) if i not in (3, 7)], []))


def test_a_second_writer_is_refused_and_readers_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    bundle = tmp_path / "bundle"
    index, record = build_index(
        unit(rng.normal(size=(50, 8))).astype(np.float32), IndexConfig(), QUIET
    )
    rows = [(i, f"/x/{i}.png", "") for i in range(50)]
    save_bundle(bundle, index, rows, {"fingerprint": "f", **record})
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path\n"
            "from pactl.store.generations import writer_lock\n"
            f"with writer_lock(Path({str(bundle)!r})):\n"
            "    print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        with pytest.raises(PactlError, match="being written by another pactl process"):
            add_to_bundle(
                bundle,
                unit(rng.normal(size=(5, 8))).astype(np.float32),
                rows[:5],
                {"fingerprint": "f"},
            )
        code, _, err = run_cli(["index", str(tmp_path), "--add", str(bundle)], monkeypatch, capsys)
        assert code == 1 and err.count("\n") == 1 and "another pactl process" in err
        assert len(load_bundle(bundle).items) == 50  # readers do not wait for the lock
    finally:
        holder.kill()
        holder.wait()
    with writer_lock(bundle):  # released by the kernel when its holder died
        pass


def test_readers_see_the_old_or_the_new_bundle_while_adds_run(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    bundle = tmp_path / "bundle"
    dim, first, step, adds = 8, 40, 10, 12
    index, record = build_index(
        unit(rng.normal(size=(first, dim))).astype(np.float32), IndexConfig(), QUIET
    )
    save_bundle(
        bundle,
        index,
        [(i, f"/x/{i}.png", "") for i in range(first)],
        {"fingerprint": "f", **record},
    )
    valid = {first + step * k for k in range(adds + 1)}
    seen: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                loaded = load_bundle(bundle)
                assert loaded.index.ntotal == len(loaded.items) == loaded.meta["count"]
                seen.append(len(loaded.items))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for k in range(adds):
            ids = range(first + step * k, first + step * (k + 1))
            add_to_bundle(
                bundle,
                unit(rng.normal(size=(step, dim))).astype(np.float32),
                [(i, f"/x/{i}.png", "") for i in ids],
                {"fingerprint": "f"},
            )
            time.sleep(0.01)
    finally:
        stop.set()
        reader.join()
    assert not errors, errors[0]
    assert seen and set(seen) <= valid
    assert len(load_bundle(bundle).items) == first + step * adds
    assert len([p for p in bundle.iterdir() if p.name.startswith(GENERATION_PREFIX)]) == 1
