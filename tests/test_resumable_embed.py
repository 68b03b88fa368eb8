"""An interrupted embed goes on from its last commit and ends with what one uninterrupted run
writes; progress is only reused for the same job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import FORKING_PACTL, make_class_folder

from pactl.checkpoint import open_network
from pactl.config import EmbedConfig, ModelConfig
from pactl.console import QUIET
from pactl.embed import PROGRESS_PREFIX, embed_to_folder, read_embedded
from pactl.embed import writing as embed_module


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Any]:
    folder = make_class_folder(tmp_path / "imgs", classes=4, per_class=10)
    files = sorted(folder.rglob("*.png"))
    (files[7]).write_bytes(b"not an image")  # one failure, committed with its reason
    config = ModelConfig(backbone="small", weights="none", image_size=16)
    model, network = open_network(config)
    return {
        "model": model,
        "network": network,
        "files": files,
        "labels": [f.parent.name for f in files],
        "ids": np.arange(len(files), dtype=np.int64),
    }


def run(job: dict[str, Any], out: Path, commit_every: int = 6) -> dict[str, Any]:
    return embed_to_folder(
        job["model"], job["network"], job["files"], job["labels"], job["ids"], out,
        torch.device("cpu"), QUIET, EmbedConfig(batch_size=4, commit_every=commit_every),
    )  # fmt: skip


class Killed(Exception):
    pass


def test_a_stopped_embed_goes_on_from_its_last_commit(
    job: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = run(job, tmp_path / "whole")
    want_vectors, want_items, _ = read_embedded(tmp_path / "whole")
    real = embed_module.embed_files
    calls: list[int] = []

    def stopping(model: Any, files: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(files))
        if len(calls) == 4:  # dies in the 4th chunk, after 3 commits
            raise Killed
        return real(model, files, *args, **kwargs)

    monkeypatch.setattr(embed_module, "embed_files", stopping)
    out = tmp_path / "out"
    with pytest.raises(Killed):
        run(job, out)
    assert len(list(out.glob(f"{PROGRESS_PREFIX}*/*.npz"))) == 3
    calls.clear()
    monkeypatch.setattr(
        embed_module, "embed_files", lambda *a, **k: (calls.append(len(a[1])), real(*a, **k))[1]
    )
    meta = run(job, out)
    assert sum(calls) == len(job["files"]) - 3 * 6  # only what was not committed
    vectors, items, _ = read_embedded(out)
    assert items.paths.tolist() == want_items.paths.tolist()
    np.testing.assert_allclose(vectors, want_vectors, atol=1e-6)
    assert meta["skipped"] == whole["skipped"] == 1 and meta["count"] == whole["count"]
    # what this run embedded, and what it took from the 3 committed chunks of 6 (one of
    # them holds the unreadable image)
    assert meta["embedded"] + meta["resumed"] == whole["embedded"] and meta["resumed"] >= 17
    assert meta["embedded"] == sum(calls) - (meta["skipped"] if meta["resumed"] == 18 else 0)
    assert not list(
        out.glob(f"{PROGRESS_PREFIX}*")
    )  # the progress is gone once the output holds it


def test_progress_of_another_job_is_not_reused(
    job: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = embed_module.embed_files
    calls: list[int] = []

    def stopping(model: Any, files: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(files))
        if len(calls) == 3:
            raise Killed
        return real(model, files, *args, **kwargs)

    monkeypatch.setattr(embed_module, "embed_files", stopping)
    out = tmp_path / "out"
    with pytest.raises(Killed):
        run(job, out)
    monkeypatch.undo()
    job["files"][0].write_bytes(job["files"][1].read_bytes())  # an input changed: another job
    calls.clear()
    monkeypatch.setattr(
        embed_module, "embed_files", lambda *a, **k: (calls.append(len(a[1])), real(*a, **k))[1]
    )
    run(job, out)
    assert sum(calls) == len(job["files"])  # everything embedded again


def test_progress_cut_another_way_is_not_reused(
    job: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(job, tmp_path / "whole", commit_every=4)
    want_vectors, want_items, _ = read_embedded(tmp_path / "whole")
    real = embed_module.embed_files
    calls: list[int] = []

    def stopping(model: Any, files: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(files))
        if len(calls) == 3:  # two chunks of 6 committed
            raise Killed
        return real(model, files, *args, **kwargs)

    monkeypatch.setattr(embed_module, "embed_files", stopping)
    out = tmp_path / "out"
    with pytest.raises(Killed):
        run(job, out, commit_every=6)
    monkeypatch.undo()
    calls.clear()
    monkeypatch.setattr(
        embed_module, "embed_files", lambda *a, **k: (calls.append(len(a[1])), real(*a, **k))[1]
    )
    run(job, out, commit_every=4)  # chunk 1 of 4 is not chunk 1 of 6: all embedded again
    assert sum(calls) == len(job["files"])
    vectors, items, _ = read_embedded(out)
    assert items.paths.tolist() == want_items.paths.tolist()
    np.testing.assert_allclose(vectors, want_vectors, atol=1e-6)


# After FORKING_PACTL: one `pactl` child per line of stdin, printing the
# child's pid at once and its exit status when it ends (-9: killed).
FORKER = r"""
for line in sys.stdin:
    job = {**json.loads(line), "stdout": "log"}
    pid = os.fork()
    if pid == 0:
        run_pactl(job)
    start = time.monotonic()
    print(pid, flush=True)
    status = os.waitpid(pid, 0)[1]
    print(json.dumps([exit_code(status), time.monotonic() - start]), flush=True)
"""


def test_embed_killed_at_random_moments_ends_as_one_uninterrupted_run(tmp_path: Path) -> None:
    import contextlib
    import json
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    from pactl.store.generations import GENERATION_PREFIX

    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=16, size=24)
    model = ["--backbone", "small", "--weights", "none", "--image-size", "16"]
    forker = subprocess.Popen(
        [sys.executable, "-c", FORKING_PACTL + FORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
    )
    pipe_in, pipe_out = forker.stdin, forker.stdout
    assert pipe_in is not None and pipe_out is not None

    def start(out: Path, log: Path) -> int:
        args = ["embed", str(imgs), *model, "--out", str(out), "--batch-size", "2"]
        pipe_in.write(json.dumps({"args": [*args, "--commit-every", "4"], "log": str(log)}))
        pipe_in.write("\n")
        pipe_in.flush()
        return int(pipe_out.readline())

    def end(log: Path) -> int:
        code = int(json.loads(pipe_out.readline())[0])
        assert code in (0, -signal.SIGKILL), log.read_text()
        return code

    def commits(out: Path) -> int:
        return sum(1 for _ in out.glob(f"{PROGRESS_PREFIX}*/*.npz"))

    out, rng, logs, mid_way = tmp_path / "killed", random.Random(7), [], []
    try:
        start(tmp_path / "whole", tmp_path / "whole.log")
        assert end(tmp_path / "whole.log") == 0
        for attempt in range(2):  # each run is killed a random moment after its 2nd new commit
            logs.append(tmp_path / f"{attempt}.log")
            before, pid = commits(out), start(out, logs[-1])
            deadline = time.monotonic() + 60
            while commits(out) < before + 2 and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.01))
            with contextlib.suppress(ProcessLookupError):  # it may have finished already
                os.kill(pid, signal.SIGKILL)
            assert end(logs[-1]) == -signal.SIGKILL, "the embed ended before it was killed"
            mid_way.append(not (out / ".pactl-current").exists())  # killed before its switch
        logs.append(tmp_path / "last.log")
        start(out, logs[-1])
        assert end(logs[-1]) == 0
    finally:
        forker.kill()
        forker.wait()
    # A run killed before its new version was in place leaves commits the next run goes on
    # from (a kill after the switch leaves a folder the next run finds up to date).
    assert mid_way[0], "the first kill came after the embed had finished its work"
    for killed, log in zip(mid_way, logs[1:], strict=False):
        assert ("going on from" in log.read_text()) == killed, log.read_text()
    want_vectors, want_items, _ = read_embedded(tmp_path / "whole")
    vectors, items, _ = read_embedded(out)
    assert items.paths.tolist() == want_items.paths.tolist()
    assert items.ids.tolist() == want_items.ids.tolist()
    np.testing.assert_allclose(np.asarray(vectors), np.asarray(want_vectors), atol=1e-6)
    hidden = sorted(p.name for p in out.iterdir() if p.name.startswith("."))
    assert not [h for h in hidden if h.startswith(PROGRESS_PREFIX)]  # progress cleared
    assert len([h for h in hidden if h.startswith(GENERATION_PREFIX)]) == 1
