"""A broken torch/torchvision/timm/faiss install (mismatched builds) is one line naming the
library, the versions installed and how to install matching ones: a fake broken package first
on PYTHONPATH, in a subprocess."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_class_folder, one_error

WORKTREE = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("package", "raises"),
    [
        ("torchvision", 'RuntimeError("operator torchvision::nms does not exist")'),
        ("faiss", 'ImportError("libopenblas.so.0: cannot open shared object file")'),
    ],
)
def test_a_broken_heavy_import_is_one_line(package: str, raises: str, tmp_path: Path) -> None:
    fake = tmp_path / "fake" / package
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise {raises}\n")
    make_class_folder(tmp_path / "imgs", classes=2, per_class=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), str(WORKTREE)])}
    args = ["embed", "imgs", "--backbone", "small", "--weights", "none", "--out", "v"]
    if package == "faiss":
        args = ["index", "v"]
        (tmp_path / "v").mkdir()
        (tmp_path / "v" / "vectors.npy").write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "pactl", *args, "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    line = one_error(done.stderr)
    message = raises.split('"')[1]
    assert line.startswith(f"error: {package} fails to import (") and message in line, line
    torch = importlib.metadata.version("torch")  # the versions as the metadata says them
    assert f"torch {torch}" in line and "pip install" in line
