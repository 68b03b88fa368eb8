"""An interrupted embed goes on from its last commit and ends with what one uninterrupted run
writes; progress is only reused for the same job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import make_class_folder

from pactl import embed as embed_module
from pactl.checkpoint import open_network
from pactl.config import ModelConfig
from pactl.console import QUIET
from pactl.embed import PROGRESS_PREFIX, embed_to_folder, read_embedded


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
        torch.device("cpu"), QUIET, batch_size=4, commit_every=commit_every,
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
