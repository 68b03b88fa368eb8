"""FAISS factories that crash: numbers FAISS takes and then dies on (SIGSEGV, SIGFPE, abort:
no message, no cleanup) are refused before it sees them, float and binary, and a process
killed while it builds a new bundle leaves no folder behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_ondisk import write_vectors_folder

from pactl.errors import PactlError
from pactl.index.build import check_factory

# Each crashed FAISS (1.x) in a subprocess when built over 2,000 vectors, or asked it for
# gigabytes (std::bad_alloc): found by trying numbers at the edges of each kind.
CRASHING = [
    "BHNSW1",  # SIGSEGV
    "BHNSW0",  # abort
    "BIVF16_HNSW1",  # SIGSEGV
    "HNSW1",  # SIGSEGV
    "IVF4_HNSW1,Flat",  # SIGSEGV
    "IVF4,PQ4x0",  # SIGFPE
    "BIVF0",
    "IVF0,Flat",
    "NSG2",
    "RQ4x30",  # std::bad_alloc: 2**30 centroids
    "IVF2147483647,Flat",  # std::bad_alloc
    "BIVF2147483647",  # std::bad_alloc
]


@pytest.mark.parametrize("factory", CRASHING)
def test_a_factory_faiss_crashes_on_is_refused(factory: str) -> None:
    with pytest.raises(PactlError, match="out of range"):
        check_factory(factory)


@pytest.mark.parametrize("factory", ["BHNSW2", "BIVF16_HNSW2", "HNSW2", "IVF4,PQ4x8", "RQ2x8"])
def test_the_least_numbers_that_work_are_taken(factory: str) -> None:
    check_factory(factory)


def unit_vectors(folder: Path) -> None:
    vectors = np.random.default_rng(0).standard_normal((300, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    write_vectors_folder(folder, vectors, np.arange(300))


def pactl(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pactl", *args, "-q"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize(("factory", "binary"), [("BHNSW1", True), ("IVF4,PQ4x0", False)])
def test_a_crashing_factory_ends_in_one_line_and_no_folder(
    tmp_path: Path, factory: str, binary: bool
) -> None:
    """Before the check: BHNSW1 killed pactl by SIGSEGV and left `out` with a half-made
    generation in it."""
    unit_vectors(tmp_path / "vec")
    args = ["index", "vec", "--factory", factory, "--out", "out"]
    done = pactl([*args, *(["--binary"] if binary else [])], tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and "out of range" in done.stderr
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vec"]


def test_a_build_killed_outright_leaves_no_new_folder(tmp_path: Path) -> None:
    """A SIGKILL at each crash point of a first build (as FAISS crashing does: nothing of
    pactl's runs after it) leaves no `out`, and the next build clears what it left."""
    unit_vectors(tmp_path / "vec")
    for point in (1, 2):
        done = pactl(["index", "vec", "--out", "out"], tmp_path, PACTL_CRASH_AT=str(point))
        assert done.returncode == -signal.SIGKILL, done.stderr
        assert not (tmp_path / "out").exists()
    assert pactl(["index", "vec", "--out", "out"], tmp_path).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "vec"]
