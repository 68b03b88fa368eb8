"""A run's embeddings are made once per checkpoint and reused by eval, plot and index
(pactl.embed.cache): the network runs only for images that are new or changed, never for
other weights' cache, and the reused vectors are those a fresh embedding gives."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import train_tiny
from rich.console import Console

from pactl.checkpoint import open_network
from pactl.config import EmbedConfig, IndexConfig
from pactl.console import Reporter
from pactl.embed import embed_files, read_embedded
from pactl.embed.cache import CACHE_DIR, run_cache
from pactl.model import EmbeddingNet
from pactl.research.plot import PlotConfig, sample_test
from pactl.verbs.evaluate import eval_checkpoint
from pactl.verbs.index import index_images

QUIET = Reporter(Console(file=io.StringIO()), quiet=True)


@pytest.fixture
def run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    return train_tiny(tmp_path, monkeypatch, capsys, classes=6, per_class=4)


@pytest.fixture
def forwarded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch sizes the network's forward sees from here on."""
    seen: list[int] = []
    forward = EmbeddingNet.forward

    def counting(self: EmbeddingNet, images: torch.Tensor) -> torch.Tensor:
        seen.append(len(images))
        return forward(self, images)

    monkeypatch.setattr(EmbeddingNet, "forward", counting)
    return seen


def evaluate(run: Path, checkpoint: Path | None = None) -> dict[str, float]:
    checkpoint = checkpoint or run / "best.pt"
    return eval_checkpoint(str(run.parent.parent / "imgs"), checkpoint, (1,), "cpu", 0, QUIET)[0]


def cache_folders(run: Path) -> list[Path]:
    return sorted((run / CACHE_DIR).iterdir()) if (run / CACHE_DIR).is_dir() else []


def test_eval_plot_and_index_of_a_run_embed_each_image_once(
    run: Path, forwarded: list[int], tmp_path: Path
) -> None:
    first = evaluate(run)
    embedded = sum(forwarded)
    assert embedded > 0
    forwarded.clear()
    assert evaluate(run) == first  # the same figures, from the cache
    sample = sample_test(run, PlotConfig(points=100, device="cpu"), QUIET)
    assert len(sample.paths) == embedded
    bundle, _ = index_images(
        str(tmp_path / "imgs"), run / "best.pt", tmp_path / "bundle", "test",
        IndexConfig(factory="Flat"), EmbedConfig(device="cpu"), QUIET,
    )  # fmt: skip
    assert forwarded == []  # neither the second eval, nor plot, nor index ran the network
    model, network = open_network(run / "best.pt")
    cached = read_embedded(bundle / "vectors")
    fresh = embed_files(model, [Path(p) for p in cached.items.paths], network.config,
                        torch.device("cpu"), QUIET, draft=False)  # fmt: skip
    assert len(cached.vectors) == embedded == len(fresh.vectors)
    np.testing.assert_allclose(cached.vectors, fresh.vectors, atol=1e-6)
    by_path = dict(zip(cached.items.paths, np.asarray(cached.vectors), strict=True))
    for path, vector in zip(sample.paths, sample.vectors, strict=True):
        np.testing.assert_allclose(vector, by_path[os.path.abspath(path)], atol=1e-6)


def test_touching_one_image_embeds_only_that_one(run: Path, forwarded: list[int]) -> None:
    evaluate(run)
    (folder,) = cache_folders(run)
    items = read_embedded(folder).items
    touched = Path(items.paths[2])
    st = touched.stat()
    os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    forwarded.clear()
    evaluate(run)
    assert sum(forwarded) == 1
    again = read_embedded(folder)
    assert again.items.mtimes[again.items.paths.index(str(touched))] == st.st_mtime_ns + 10**9


def test_other_weights_never_reuse_the_cache(run: Path, forwarded: list[int]) -> None:
    evaluate(run)
    embedded = sum(forwarded)
    payload = torch.load(run / "best.pt", weights_only=True)
    payload["model"] = {
        k: v + 0.01 if v.is_floating_point() else v for k, v in payload["model"].items()
    }
    torch.save(payload, run / "other.pt")
    forwarded.clear()
    evaluate(run, run / "other.pt")
    assert sum(forwarded) == embedded
    assert len(cache_folders(run)) == 2
    _, first = open_network(run / "best.pt")
    _, other = open_network(run / "other.pt")
    assert first.fingerprint != other.fingerprint
    for network, path in ((first, "best.pt"), (other, "other.pt")):
        cache = run_cache(run / path, network)
        assert cache is not None
        assert read_embedded(cache.folder).meta["fingerprint"] == network.fingerprint


def test_a_checkpoint_outside_a_run_keeps_no_cache(
    run: Path, forwarded: list[int], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(run / "best.pt", elsewhere / "best.pt")
    evaluate(run, elsewhere / "best.pt")
    embedded = sum(forwarded)
    evaluate(run, elsewhere / "best.pt")
    assert sum(forwarded) == 2 * embedded
    assert sorted(p.name for p in elsewhere.iterdir()) == ["best.pt"]
    assert cache_folders(run) == []
