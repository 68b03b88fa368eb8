"""Where pactl writes: every file a user names for output (audit's --sheet and --write-manifest,
query's --grid, eval's --report, export's .onnx) follows one rule (pactl.store.targets). A link,
a FIFO or a device is refused, never replaced by a regular file; an existing file is replaced
only with --overwrite; a file the command reads is never its output. Nothing here writes to a
device: /dev/null is only named, and checked to be a character device still."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import one_error, run_cli
from test_hostile_cli import tiny_bundle

from pactl.store.generations import atomic_write_text
from pactl.store.targets import check_target

# verb -> the command writing `target` in the folder tiny_bundle made (with --overwrite: the
# rule must hold even then, where a verb has it)
Command = Callable[[Path, str], list[str]]
IMAGE = "imgs/class_0/0.png"
VERBS: dict[str, Command] = {
    "audit --sheet": lambda root, target: ["audit", "b", "--no-copies", "--sheet", target],
    "audit --write-manifest": lambda root, target: [
        "audit", "b", "--no-copies", "--drop-top", "1", "--write-manifest", target
    ],
    "query --grid": lambda root, target: ["query", IMAGE, "--index", "b", "--grid", target],
    "eval --report": lambda root, target: [
        "eval", "imgs", "--checkpoint", "best.pt", "--report", target
    ],
    "export --to onnx": lambda root, target: ["export", "best.pt", "--to", "onnx", "--out", target],
}  # fmt: skip
SUFFIX = {"audit --sheet": ".png", "query --grid": ".png", "export --to onnx": ".onnx"}


@pytest.fixture
def root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    monkeypatch.chdir(tmp_path)
    tiny_bundle(tmp_path, monkeypatch, capsys)
    return tmp_path


def refused(
    root: Path,
    verb: str,
    target: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """Run `verb` writing `target` with --overwrite; it must fail in one line: that line."""
    code, out, err = run_cli([*VERBS[verb](root, target), "--overwrite", "-q"], monkeypatch, capsys)
    assert code != 0 and out == "", (verb, target, err)
    return one_error(err)


@pytest.mark.parametrize("verb", VERBS)
def test_a_fifo_is_refused_and_stays_a_fifo(
    root: Path, verb: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = root / f"fifo{SUFFIX.get(verb, '.csv')}"
    os.mkfifo(fifo)
    assert "is a FIFO" in refused(root, verb, fifo.name, monkeypatch, capsys)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("verb", VERBS)
def test_a_link_is_refused_and_what_it_names_kept(
    root: Path, verb: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = root / "someone_elses.txt"
    victim.write_text("mine")
    link = root / f"link{SUFFIX.get(verb, '.csv')}"
    link.symlink_to(victim)
    assert "is a symbolic link" in refused(root, verb, link.name, monkeypatch, capsys)
    assert link.is_symlink() and victim.read_text() == "mine"


def guard_dev_null(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a rename or unlink of /dev/null fail in this process, so that a regression fails
    the test instead of replacing the machine's /dev/null (as root, it would)."""
    for name in ("replace", "rename", "unlink", "remove"):
        real = getattr(os, name)

        def guarded(*args: object, _real: Callable[..., object] = real, **kw: object) -> object:
            if any(os.path.realpath(str(a)) == "/dev/null" for a in args[:2]):
                raise AssertionError(f"os.{_real.__name__} of /dev/null")
            return _real(*args, **kw)

        monkeypatch.setattr(os, name, guarded)


@pytest.mark.skipif(not stat.S_ISCHR(os.stat("/dev/null").st_mode), reason="no /dev/null")
@pytest.mark.parametrize("verb", VERBS)
def test_dev_null_is_refused_never_replaced(
    root: Path, verb: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    guard_dev_null(monkeypatch)
    line = refused(root, verb, "/dev/null", monkeypatch, capsys)
    assert "of /dev/null" not in line, line  # refused before any write, not by the guard
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


@pytest.mark.parametrize("verb", VERBS)
def test_an_existing_file_is_replaced_only_with_overwrite(
    root: Path, verb: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = root / f"mine{SUFFIX.get(verb, '.csv')}"
    mine.write_bytes(b"mine")
    code, out, err = run_cli([*VERBS[verb](root, mine.name), "-q"], monkeypatch, capsys)
    assert code != 0 and "exists; pass --overwrite" in one_error(err), verb
    assert mine.read_bytes() == b"mine"


INPUTS = {  # verb -> a file it reads, named as its output (with --overwrite)
    "audit --sheet": IMAGE,
    "query --grid": IMAGE,
    "eval --report": "best.pt",
    "export --to onnx": "best.pt",
}


@pytest.mark.parametrize("verb", INPUTS)
def test_an_input_is_never_the_output(
    root: Path, verb: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (root / INPUTS[verb]).read_bytes()
    line = refused(root, verb, INPUTS[verb], monkeypatch, capsys)
    assert "which this command reads" in line, line
    assert (root / INPUTS[verb]).read_bytes() == before


def test_audit_never_writes_its_source_or_drop_list(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The audited --source CSV and the --drop list, named as --write-manifest."""
    rows = "".join(f"imgs/class_{c}/{n}.png,{c}\n" for c in range(4) for n in range(2))
    (root / "m.csv").write_text("path,label\n" + rows)
    (root / "drop.csv").write_text("path\n" + str(root / IMAGE) + "\n")
    audit = ["audit", "b", "--no-copies", "--overwrite", "-q"]
    for args in (["--source", "m.csv", "--drop-top", "1", "--write-manifest", "m.csv"],
                 ["--drop", "drop.csv", "--write-manifest", "drop.csv"]):  # fmt: skip
        before = (root / args[-1]).read_text()
        code, out, err = run_cli([*audit, *args], monkeypatch, capsys)
        assert code == 2 and "which this command reads" in one_error(err), args
        assert (root / args[-1]).read_text() == before


def test_the_library_never_renames_over_a_fifo_or_a_link(tmp_path: Path) -> None:
    """The check before the rename: a name that became a FIFO or a link after the command's
    own check is refused by the atomic write itself."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    for name in ("fifo", "link"):
        with pytest.raises(Exception, match="pactl writes only regular files"):
            atomic_write_text(tmp_path / name, "x")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert (tmp_path / "link").is_symlink() and not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link"]  # no temporary


def test_a_hard_link_to_an_input_is_that_input(tmp_path: Path) -> None:
    (tmp_path / "source.csv").write_text("x")
    os.link(tmp_path / "source.csv", tmp_path / "other.csv")
    with pytest.raises(Exception, match="which this command reads"):
        check_target(tmp_path / "other.csv", "--out", True, [tmp_path / "source.csv"])
