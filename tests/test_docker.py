"""The Dockerfile, checked without a Docker engine: hadolint's rules, and the layout the docs
promise (dependencies before code, a non-root user, the package installed as the Makefile does)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def stages() -> dict[str, list[str]]:
    """Instructions per build stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM \S+ AS (\w+)", line)
        if match:
            current = match.group(1)
            out[current] = []
        out[current].append(line)
    return out


def test_hadolint_finds_nothing() -> None:
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(binary).exists():
        pytest.skip("hadolint is not installed (it comes with the test extra)")
    done = subprocess.run(
        [binary, "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("stage", ["cpu", "cuda"])
def test_each_image_installs_dependencies_before_the_code_and_runs_as_a_user(stage: str) -> None:
    steps = stages()[stage]
    copy_code = next(i for i, s in enumerate(steps) if s.startswith("COPY pactl"))
    dependencies = re.compile(r"pip install (\.|\"\.\[([a-z,]+)\]\")")  # . or ".[extras]"
    installs = [i for i, s in enumerate(steps) if dependencies.search(s)]
    assert installs and installs[0] < copy_code  # dependencies: a layer the code does not touch
    match = dependencies.search(steps[installs[0]])
    assert match is not None and "serve" in (match.group(2) or "").split(",")  # `serve` works
    assert "EXPOSE 8000" in steps  # the port serve listens on
    after = " ".join(steps[copy_code:])
    assert "pip install --no-deps ." in after  # only pactl itself after the code is copied
    user = next(s for s in steps if s.startswith("USER "))
    assert user.split()[1].split(":")[0] not in ("0", "root")
    assert steps.index(user) < next(i for i, s in enumerate(steps) if s.startswith("ENTRYPOINT"))
    assert 'ENTRYPOINT ["pactl"]' in steps


def test_the_cuda_image_frees_uid_1000_before_taking_it() -> None:
    """PyTorch's images are Ubuntu 24.04, which holds a user `ubuntu` with uid 1000: a plain
    useradd --uid 1000 fails the build."""
    run = next(s for s in stages()["cuda"] if "useradd" in s)
    assert "--uid 1000" in run and 'userdel --remove "$(id -nu 1000)"' in run
    assert run.index("userdel") < run.index("useradd")


@pytest.mark.parametrize(
    "doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_code_fences_close_on_a_line_of_their_own(doc: str) -> None:
    """A closing ``` with text after it is no closing fence: the rest of the page, headings
    included, renders as code (README's tour of the verbs did)."""
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    inside = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith("```"):
            if inside:
                assert line.strip() == "```", f"{doc}:{number}: {line[:60]}"
            inside = not inside
    assert not inside, f"{doc}: a code fence is never closed"
