"""`--engine ray` on a Ray started here (two CPUs, two GPUs that Ray is told of): the shards it
embeds equal a serial embed, its index equals a serial build, a shard task that fails once is
retried to the same output, a killed driver goes on with the missing shards only, and bad input
is one line with nothing half-written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_class_folder, one_error, run_cli, unit

ray = pytest.importorskip("ray")

from pactl.config import EmbedConfig, EngineConfig, IndexConfig, ModelConfig  # noqa: E402
from pactl.console import QUIET  # noqa: E402
from pactl.engines import cluster  # noqa: E402
from pactl.engines.embedding import embed_on_ray  # noqa: E402
from pactl.engines.indexing import ray_builder  # noqa: E402
from pactl.errors import PactlError  # noqa: E402
from pactl.verbs.embed import embed_source  # noqa: E402
from pactl.verbs.index import index_vectors  # noqa: E402
from pactl.verbs.vector_sources import gather_vectors  # noqa: E402

pytestmark = pytest.mark.ray
MODEL = ModelConfig(backbone="small", weights="none", image_size=16)
MODEL_OPTIONS = ["--backbone", "small", "--weights", "none", "--image-size", "16"]
EMBED = EmbedConfig(batch_size=8)
RAY = EngineConfig("ray", shards=3)


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    """One Ray for the module: two CPUs, two GPUs it is told of (none is used: a task is only
    placed by them), a small object store; its address for a driver in another process."""
    ray.init(
        num_cpus=2,
        num_gpus=2,
        object_store_memory=200 * 2**20,
        include_dashboard=False,
        log_to_driver=False,
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_class_folder(tmp_path_factory.mktemp("ray") / "imgs", classes=4, per_class=6)


@pytest.fixture(scope="module")
def serial(images: Path) -> tuple[np.ndarray, Any]:
    """The vectors and items of one embed of `images` in this process."""
    out = images.parent / "serial"
    embed_source(str(images), MODEL, out, None, EMBED, QUIET)
    vectors, items, _ = gather_vectors(out)
    return np.asarray(vectors), items


def same_as_serial(folder: Path, serial: tuple[np.ndarray, Any]) -> None:
    vectors, items, _ = gather_vectors(folder)
    want, want_items = serial
    assert np.abs(np.asarray(vectors) - want).max() <= 1e-6
    assert items.ids.tolist() == want_items.ids.tolist()
    assert list(items.paths) == list(want_items.paths)
    assert list(items.labels) == list(want_items.labels)


def test_shards_embedded_on_ray_equal_a_serial_embed_one_gpu_each(
    address: str, images: Path, serial: Any, tmp_path: Path
) -> None:
    assert cluster.task_options(ray, gpus=True)["num_gpus"] == 1  # the cluster reports GPUs
    done = embed_on_ray(str(images), MODEL, tmp_path / "v", None, EMBED, RAY, QUIET)
    assert sorted(p.name for p in (tmp_path / "v" / "shards").iterdir()) == [
        f"{i:05d}-of-00003" for i in range(3)
    ]
    same_as_serial(tmp_path / "v", serial)
    assert done["count"] == done["embedded"] == 24
    # each task held one of the two GPUs Ray was told of
    assert sorted(done["placement"]) == [0, 1, 2]
    assert all(len(gpus) == 1 and gpus[0] in ("0", "1") for gpus in done["placement"].values())


def test_a_shard_that_fails_once_is_retried_to_the_same_output(
    address: str, images: Path, serial: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    struck = tmp_path / "struck"
    monkeypatch.setenv(cluster.FAULT_ENV, f"raise:1:{struck}")
    done = embed_on_ray(str(images), MODEL, tmp_path / "v", None, EMBED, RAY, QUIET)
    assert struck.exists()  # the fault did happen, in the first try of shard 1
    assert done["embedded"] == 24
    same_as_serial(tmp_path / "v", serial)


def write_shards(folder: Path, shards: int = 3, n: int = 6_000, dim: int = 32) -> np.ndarray:
    """A vectors folder of `shards` shards as `pactl embed --shard` writes it: clustered unit
    vectors, ids 0..n-1 in shard order."""
    rng = np.random.default_rng(5)
    centres = unit(rng.standard_normal((20, dim)))
    x = unit(centres[rng.integers(0, 20, n)] + 0.5 * rng.standard_normal((n, dim)))
    x = x.astype(np.float32)
    for i in range(shards):
        start, stop = n * i // shards, n * (i + 1) // shards
        part = folder / "shards" / f"{i:05d}-of-{shards:05d}"
        part.mkdir(parents=True)
        np.save(part / "vectors.npy", x[start:stop])
        rows = [f"{j},/data/{j}.png,,0,0" for j in range(start, stop)]
        header = "id,path,label,size,mtime_ns\n"
        (part / "items.csv").write_text(header + "\n".join(rows) + "\n")
        meta = {
            "format": "pactl.vectors", "version": 1, "dimension": dim, "count": stop - start,
            "metric": "ip", "checkpoint": None, "fingerprint": "f" * 64, "model_config": {},
        }  # fmt: skip
        (part / "meta.json").write_text(json.dumps(meta))
    return x


def search_all(bundle: Path, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from pactl.index import load_bundle

    loaded = load_bundle(bundle)
    return loaded.index.search(queries, 10)


@pytest.mark.parametrize(
    ("factory", "on_disk"),
    [("IVF32,Flat", "no"), ("IVF32,Flat", "yes"), ("Flat", "no"), ("IVF32,PQ4x4", "no")],
)
def test_an_index_built_on_ray_equals_a_serial_build(
    address: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    factory: str,
    on_disk: str,
) -> None:
    x = write_shards(tmp_path / "v")
    config = IndexConfig(factory=factory, on_disk=on_disk)
    _, here = index_vectors(tmp_path / "v", tmp_path / "here", config, QUIET)
    if on_disk == "yes":  # the worker filling shard 1 dies once: another runs the task again
        monkeypatch.setenv(cluster.FAULT_ENV, f"exit:1:{tmp_path / 'struck'}")
    build = ray_builder(EngineConfig("ray"))
    _, there = index_vectors(tmp_path / "v", tmp_path / "there", config, QUIET, build=build)
    assert (tmp_path / "struck").exists() == (on_disk == "yes")
    assert there["engine"] == "ray" and there["shards"] == 3
    for key in ("factory", "search_params", "recall_at_10", "ntotal", "train_points", "rescore"):
        assert there.get(key) == here.get(key), key
    assert there["on_disk"] == (on_disk == "yes")
    # lossy codes keep the float copy they are rescored from, as a build here keeps it
    floats = [tmp_path / name / "floats.npy" for name in ("here", "there")]
    assert floats[1].is_file() == floats[0].is_file() == ("PQ" in factory)
    assert ("rescore" in there) == ("PQ" in factory)
    if "PQ" in factory:
        np.testing.assert_array_equal(np.load(floats[1]), x)
    queries = x[::97]
    found_here, found_there = (
        search_all(tmp_path / "here", queries),
        search_all(tmp_path / "there", queries),
    )
    np.testing.assert_array_equal(found_there[1], found_here[1])
    np.testing.assert_array_equal(found_there[0], found_here[0])
    # and the tuned figure is the recall against brute force, as a build here measures it
    exact = np.argsort(-(queries @ x.T), axis=1, kind="stable")[:, :10]
    assert np.mean([len(set(a) & set(b)) for a, b in zip(exact, found_there[1], strict=True)]) >= 9


def test_a_worker_lost_on_every_try_is_one_line_and_no_bundle(
    address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_shards(tmp_path / "v", n=3_000)
    monkeypatch.setenv(cluster.FAULT_ENV, "exit:0")
    build = ray_builder(EngineConfig("ray"))
    with pytest.raises(PactlError) as caught:
        index_vectors(
            tmp_path / "v", tmp_path / "b", IndexConfig(factory="Flat"), QUIET, False, build
        )
    message = str(caught.value)
    assert "\n" not in message
    assert "index shard 0/3 failed after 3 tries (the cluster lost its worker)" in message
    assert not (tmp_path / "b").exists()  # nothing half-written: not even the folder


@pytest.mark.slow  # two drivers in their own processes, each importing torch and Ray
def test_a_killed_driver_goes_on_with_the_missing_shards_only(
    address: str,
    images: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "v"
    command = [
        sys.executable, "-m", "pactl", "embed", str(images), *MODEL_OPTIONS, "--batch-size",
        "8", "--out", str(out), "--engine", "ray", "--ray-address", address, "--shards", "2",
    ]  # fmt: skip
    first = out / "shards" / "00000-of-00002"
    env = {**os.environ, cluster.FAULT_ENV: "hang:1"}  # shard 1 never ends on its own
    driver = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (first / "meta.json").exists() and driver.poll() is None:
            assert time.monotonic() < deadline, "shard 0 was never committed"
            time.sleep(0.2)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.communicate()
    assert not (out / "shards" / "00001-of-00002" / "meta.json").exists()
    kept = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "1 committed already, 1 to embed" in done.stderr
    assert f"24 vectors (128-d) in {out}, 12 embedded now" in done.stdout
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == kept  # not redone
    code, _, err = run_cli(
        ["embed", str(images), *MODEL_OPTIONS, "--out", "whole"], monkeypatch, capsys
    )
    assert code == 0, err
    whole, whole_items, _ = gather_vectors(tmp_path / "whole")
    same_as_serial(out, (np.asarray(whole), whole_items))


def test_bad_input_is_one_line_before_any_work(
    address: str,
    images: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    embed = ["embed", str(images), *MODEL_OPTIONS, "--out", "v"]
    started = time.monotonic()
    code, out, err = run_cli(
        [*embed, "--engine", "ray", "--ray-address", "127.0.0.1:1"], monkeypatch, capsys
    )
    assert code != 0 and out == "" and time.monotonic() - started < 10
    assert "no Ray cluster answers at 127.0.0.1:1" in one_error(err)
    code, _, err = run_cli([*embed, "--shards", "2"], monkeypatch, capsys)
    assert code != 0 and "--shards is for --engine ray" in one_error(err)
    code, _, err = run_cli([*embed, "--engine", "ray", "--shard", "0/2"], monkeypatch, capsys)
    assert code != 0 and "--shard is for one slice by hand" in one_error(err)
    assert not (tmp_path / "v").exists()

    write_shards(tmp_path / "vec", n=51_000, dim=8)  # past Flat: the budget chooses
    index = ["index", "vec", "--out", "b", "--engine", "ray"]
    code, _, err = run_cli(
        [*index, "--memory-budget", "1e-9", "--factory", "HNSW32"], monkeypatch, capsys
    )
    assert code != 0 and "cannot do (a graph" in one_error(err)
    assert "cannot be filled shard by shard" in one_error(err)
    code, _, err = run_cli([*index, "--binary"], monkeypatch, capsys)
    assert code != 0 and "binary codes are built here" in one_error(err)
    code, _, err = run_cli([*index, "--memory-budget", "1e-6"], monkeypatch, capsys)
    assert code != 0 and "do not fit in 1e-06 GB" in one_error(err)
    assert not (tmp_path / "b").exists()

    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name: None)
    code, _, err = run_cli([*index], monkeypatch, capsys)
    assert code != 0 and "pip install 'pactl[ray]'" in one_error(err)
