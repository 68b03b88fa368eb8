"""The command line: light --help, one-line errors with the right exit codes."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_class_folder, run_cli

VERBS = ["download", "train", "embed", "index", "query", "eval"]


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys; sys.argv = ['pactl', '--help']\n"
        "from pactl.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'torchvision', 'faiss', 'numpy', 'sklearn') "
        "if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in done.stdout, done.stdout + done.stderr
    for verb in VERBS:
        assert verb in done.stdout


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help_with_examples(
    verb: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli([verb, "--help"], monkeypatch, capsys)
    assert code == 0
    assert "Examples" in out
    assert f"pactl {verb}" in out


@pytest.mark.parametrize(
    ("args", "message", "exit_code"),
    [
        (["train", "no_such_folder"], "neither a known dataset", 2),
        (["train", "EMPTY"], "has no images", 1),
        (["train", "BAD.csv"], "lacks the column", 1),
        (["download", "no_such_set"], "unknown dataset", 2),
        (["train", "IMGS", "--backbone", "nonet", "--epochs", "1"], "unknown backbone", 2),
        (["embed", "IMGS", "--checkpoint", "NOTCKPT.pt"], "truncated or not a torch file", 1),
        (["embed", "IMGS", "--checkpoint", "OTHER.pt"], "not a pactl checkpoint", 1),
        (["query", "x.png", "--index", "NOBUNDLE"], "", 1),
        (["eval"], "no runs under", 1),
        (["train", "IMGS", "--backbone", "small", "--dim", "0"], "--dim must be positive", 2),
        (["train", "ONECLASS.csv", "--backbone", "small"], "needs at least 2 classes", 1),
        (["embed", "IMGS", "--checkpoint", "TRUNC.pt"], "truncated or not a torch file", 1),
        (["query", "IMGS/class_0/0.png", "--index", "IMGS", "--k", "3"], "lacks meta.json", 1),
        (["query", "x.png", "--index", "IMGS", "--k", "3"], "x.png: file not found", 1),
    ],
)
def test_bad_input_is_one_line_not_a_traceback(
    args: list[str],
    message: str,
    exit_code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import torch

    (tmp_path / "EMPTY").mkdir()
    (tmp_path / "BAD.csv").write_text("file,class\na.png,1\n")
    make_class_folder(tmp_path / "IMGS", classes=4, per_class=2)
    (tmp_path / "NOTCKPT.pt").write_bytes(b"not a checkpoint at all")
    torch.save({"state_dict": {"w": torch.zeros(2)}}, tmp_path / "OTHER.pt")
    (tmp_path / "NOBUNDLE").mkdir()
    rows = "".join(f"IMGS/class_0/{n}.png,0,train\n" for n in range(2))
    rows += "".join(f"IMGS/class_{c}/0.png,{c},test\n" for c in (1, 2))
    (tmp_path / "ONECLASS.csv").write_text("path,label,split\n" + rows)
    whole = io.BytesIO()
    torch.save({"format": "pactl.checkpoint", "model": {"w": torch.zeros(1000)}}, whole)
    (tmp_path / "TRUNC.pt").write_bytes(whole.getvalue()[:1500])
    resolved = [str(tmp_path / a) if (tmp_path / a).exists() else a for a in args]
    code, out, err = run_cli(resolved, monkeypatch, capsys)
    assert code == exit_code, err
    assert out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert "Traceback" not in err


def test_pickle_with_code_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pickle

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (print, ("owned",))

    import torch

    torch.save(
        {"format": "pactl.checkpoint", "x": Evil()}, tmp_path / "evil.pt", pickle_module=pickle
    )
    make_class_folder(tmp_path / "imgs", classes=4, per_class=1)
    code, out, err = run_cli(
        ["embed", str(tmp_path / "imgs"), "--checkpoint", str(tmp_path / "evil.pt")],
        monkeypatch,
        capsys,
    )
    assert code == 1
    assert "owned" not in out + err
    assert "refusing to load" in err


def test_usage_error_exit_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["query", "x.png", "--k", "0"], monkeypatch, capsys)
    assert code == 2
    assert out == ""
