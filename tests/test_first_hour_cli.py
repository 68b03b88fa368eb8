"""The first hour at the command line: names shown as they are, links followed on request, exit
codes that say what happened, an eval report that replaces nothing, `pactl list`, and help that
reads whole at 80 columns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_class_folder, one_error, read_csv, run_cli
from test_hostile_cli import tiny_checkpoint

# An untrained backbone as the network: no checkpoint needed, a fraction of a second.
SMALL = ["--backbone", "small", "--weights", "none", "--image-size", "16", "--resize-size", "16"]
ODD = "printer[red]copy\x1b[31m:thumbs_up:.png"  # markup, an escape sequence, an emoji code


@pytest.fixture
def bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    """tmp_path/b: 4 classes of 2 images (tmp_path/imgs) indexed with an untrained network."""
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    tiny_checkpoint(tmp_path / "best.pt")
    args = ["index", "imgs", "--checkpoint", "best.pt", "--out", "b", "--quiet"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    return tmp_path / "b"


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------------------- names as they are


@pytest.mark.parametrize("verb", [["eval"], ["embed"], ["index"], ["train"]])
def test_a_missing_source_is_named_literally(
    verb: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "my[photos]:thumbs_up:"
    args = [*verb, name] if verb == ["train"] else [*verb, name, *SMALL]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code in (1, 2) and out == ""
    assert "'my[photos]:thumbs_up:' is neither a known dataset" in one_error(err)


def test_a_skipped_query_is_one_literal_line_naming_the_path_once(
    bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / ODD).write_text("not an image")
    good = str(tmp_path / "imgs" / "class_0" / "0.png")
    args = ["query", good, ODD, "--index", "b", "--k", "1", "--format", "csv", "--quiet"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert len(read_rows(out)) == 1
    shown = "printer[red]copy\\x1b[31m:thumbs_up:.png"
    assert lines(err) == [
        f"skipped query {shown}: not an image (or a format PIL cannot read)",
        "warning: 1 unreadable query image skipped",
    ]


def test_result_lines_show_paths_literally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=2, per_class=2)
    out_dir = "vec[red]\x1b[31m"
    code, out, err = run_cli(["embed", "imgs", *SMALL, "--out", out_dir], monkeypatch, capsys)
    assert code == 0, err
    assert out.startswith("4 vectors (128-d) in vec[red]\\x1b[31m,")


def read_rows(text: str) -> list[dict[str, str]]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(text)))


# ---------------------------------------------------------------------------- --follow-links


def linked_folder(root: Path) -> Path:
    """root/imgs with 3 classes of 2 images, and class_x a link to a class outside it."""
    make_class_folder(root / "imgs", classes=3, per_class=2)
    make_class_folder(root / "elsewhere", classes=1, per_class=2, seed=1)
    (root / "imgs" / "class_x").symlink_to(root / "elsewhere" / "class_0")
    return root / "imgs"


def test_embed_follows_links_out_of_the_folder_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    linked_folder(tmp_path)
    code, out, err = run_cli(["embed", "imgs", *SMALL, "--out", "v1"], monkeypatch, capsys)
    assert code == 0, err
    assert out.startswith("6 vectors") and "--follow-links" in err
    args = ["embed", "imgs", *SMALL, "--out", "v2", "--follow-links"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert out.startswith("8 vectors") and "--follow-links" not in err
    labels = {row["label"] for row in read_csv(tmp_path / "v2" / "items.csv")}
    assert labels == {"class_0", "class_1", "class_2", "class_x"}


def test_query_of_a_folder_follows_links_only_when_asked(
    bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "out.png").symlink_to(tmp_path / "imgs" / "class_0" / "0.png")
    args = ["query", "q", "--index", "b", "--k", "1", "--format", "csv"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 1 and out == ""  # the folder's one image leads out of it: nothing to ask
    assert "no query images" in one_error(err)
    code, out, err = run_cli([*args, "--follow-links"], monkeypatch, capsys)
    assert code == 0, err
    assert [row["query"] for row in read_rows(out)] == ["q/out.png"]


# ---------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    ("queries", "message"),
    [
        (["nonexist.png"], "error: cannot read query image nonexist.png: file not found"),
        (["a.png", "b.png"], "error: none of the 2 query images could be read (first: a.png: "),
        (["EMPTY"], "error: no query images"),
    ],
)
def test_a_query_that_answers_nothing_fails_in_one_line(
    queries: list[str],
    message: str,
    bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "EMPTY").mkdir()
    for fmt in ("csv", "jsonl", "table"):
        args = ["query", *queries, "--index", "b", "--format", fmt]
        code, out, err = run_cli(args, monkeypatch, capsys)
        assert code == 1 and out == "", (fmt, out)
        assert one_error(err).startswith(message), err


def test_a_partly_unreadable_query_list_answers_the_rest(
    bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = "imgs/class_1/0.png"
    args = ["query", "gone.png", good, "--index", "b", "--k", "2", "--format", "csv"]
    code, out, err = run_cli([*args, "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    assert {row["query"] for row in read_rows(out)} == {good}
    assert lines(err) == [
        "skipped query gone.png: file not found",
        "warning: 1 unreadable query image skipped",
    ]
    code, out, err = run_cli([*args, "--strict"], monkeypatch, capsys)
    assert code == 1 and out == ""
    assert one_error(err) == "error: unreadable query image gone.png: file not found"


def test_nul_separated_paths_in_and_out(bundle: Path, tmp_path: Path) -> None:
    """`find -print0 | pactl query - -0 --paths-only | xargs -0`: a name with a newline
    survives both ways."""
    odd = tmp_path / "imgs" / "class_2" / "new\nline.png"
    os.rename(tmp_path / "imgs" / "class_2" / "1.png", odd)
    code, _, err = pactl(["index", "imgs", "--checkpoint", "best.pt", "--out", "b2"], tmp_path)
    assert code == 0, err
    names = [os.fsencode(odd), os.fsencode(tmp_path / "imgs" / "class_0" / "0.png")]
    stdin = b"".join(n + b"\0" for n in names)
    args = ["query", "-", "-0", "--paths-only", "--index", "b2", "--k", "1", "--quiet"]
    code, out, err = pactl(args, tmp_path, stdin)
    assert code == 0, err
    assert out == stdin  # each query finds itself, NUL-terminated
    args = ["query", "-", "-0", "--index", "b2", "--k", "1", "--format", "jsonl", "--quiet"]
    code, out, err = pactl(args, tmp_path, stdin)
    assert code == 0, err
    assert [json.loads(line)["query"] for line in out.splitlines()] == [
        os.fsdecode(n) for n in names
    ]
    code, out, err = pactl(["query", "-", "--index", "b2", "--k", "1"], tmp_path, stdin)
    assert code == 2 and out == b"" and "give -0" in one_error(err)


def pactl(args: list[str], cwd: Path, stdin: bytes = b"") -> tuple[int, bytes, str]:
    done = subprocess.run(
        [sys.executable, "-m", "pactl", *args], cwd=cwd, input=stdin, capture_output=True
    )
    return done.returncode, done.stdout, done.stderr.decode(errors="replace")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-0"], "-0 separates the paths read from '-' and those --paths-only writes"),
        (["--paths-only", "--format", "csv"], "--paths-only writes bare paths"),
    ],
)
def test_output_options_that_would_do_nothing_are_refused(
    extra: list[str],
    message: str,
    bundle: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["query", "imgs/class_0/0.png", "--index", "b", *extra]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 2 and out == ""
    assert message in one_error(err)


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "nosuchset", *SMALL],
        ["eval", "nosuchset"],
        ["download", "nosuchset"],
        ["index", "nosuchset", *SMALL],
        ["index", "nosuchset"],
        ["embed", "nosuchset", *SMALL],
    ],
)
def test_an_unknown_dataset_is_a_usage_error_naming_the_known_ones(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 2 and out == ""
    line = one_error(err)
    assert "'nosuchset'" in line and "cars196, cub200, digits, inshop, sop" in line


def test_quiet_keeps_results_and_drops_info_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    args = ["eval", "imgs", *SMALL, "--ks", "1"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0 and "wrote eval.csv" in err
    code, out, err = run_cli([*args, "--report", "again.csv", "-q"], monkeypatch, capsys)
    assert code == 0 and err == ""
    assert out.splitlines()[0].split()[0] == "recall@1"


# ---------------------------------------------------------------------------- eval's report


def test_eval_report_goes_to_the_run_folder_and_replaces_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    tiny_checkpoint(run / "best.pt")
    args = ["eval", "imgs", "--checkpoint", str(run / "best.pt"), "--ks", "1", "--quiet"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert (run / "eval.csv").is_file() and not (tmp_path / "eval.csv").exists()
    (run / "eval.csv").write_text("an earlier report\n")
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 1 and out == ""
    assert "eval.csv exists; pass --overwrite" in one_error(err)
    assert (run / "eval.csv").read_text() == "an earlier report\n"
    code, _, err = run_cli([*args, "--overwrite"], monkeypatch, capsys)
    assert code == 0, err
    assert read_csv(run / "eval.csv")[0]["dataset"] == "imgs"
    code, _, err = run_cli([*args, "--report", "mine.csv"], monkeypatch, capsys)
    assert code == 0 and (tmp_path / "mine.csv").is_file()


def test_eval_of_a_backbone_writes_into_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    args = ["eval", "imgs", *SMALL, "--ks", "1", "--quiet"]
    assert run_cli(args, monkeypatch, capsys)[0] == 0
    assert read_csv(tmp_path / "eval.csv")[0]["checkpoint"].startswith("small")
    assert run_cli(args, monkeypatch, capsys)[0] == 1


# ---------------------------------------------------------------------------- pactl list


def registry_names(what: str) -> list[str]:
    from pactl.backbones import BACKBONES
    from pactl.datasets import CATALOG
    from pactl.losses import LOSSES
    from pactl.recipe import PRESETS

    names = {"backbones": [*BACKBONES, "timm:<model>"], "presets": list(PRESETS)}
    return {**names, "losses": list(LOSSES), "datasets": list(CATALOG)}[what]


@pytest.mark.parametrize("what", ["backbones", "presets", "losses", "datasets"])
def test_list_shows_each_registry_in_every_format(
    what: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    names = registry_names(what)
    code, out, err = run_cli(["list", what], monkeypatch, capsys)  # a pipe: tab-separated
    assert code == 0 and err == ""
    assert [line.split("\t")[0] for line in out.splitlines()] == names
    code, out, _ = run_cli(["list", what, "--format", "json"], monkeypatch, capsys)
    assert [row["name"] for row in json.loads(out)] == names
    code, out, _ = run_cli(["list", what, "--format", "csv"], monkeypatch, capsys)
    assert [row["name"] for row in read_rows(out)] == names
    code, out, _ = run_cli(["list", what, "--format", "text"], monkeypatch, capsys)
    header, *rows = out.splitlines()
    assert header.split()[0] == "name" and [row.split()[0] for row in rows] == names
    if len(header.split()) > 1:  # columns line up under their heading
        second = header.index(header.split()[1])
        assert all(row[second - 2 : second] == "  " and row[second] != " " for row in rows)


def test_list_of_an_unknown_registry_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["list", "nosuch"], monkeypatch, capsys)
    assert code == 2 and out == "" and "backbones" in one_error(err)


def test_format_rows_keeps_rows_apart() -> None:
    from pactl.output import format_rows

    header, rows = ["name", "note"], [["a", "x, y"], ["bb", 'say "hi"']]
    assert format_rows(header, rows, "tsv") == 'a\tx, y\nbb\tsay "hi"\n'
    assert format_rows(header, rows, "text") == 'name  note\na     x, y\nbb    say "hi"\n'
    assert read_rows(format_rows(header, rows, "csv"))[1] == {"name": "bb", "note": 'say "hi"'}


@pytest.mark.parametrize("backbone", ["nosuch", "timm:nosuch"])
def test_print_config_refuses_a_backbone_as_training_does(
    backbone: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    tiny = ["--backbone", backbone, "--weights", "none", "--epochs", "1", "--quiet"]
    shown = run_cli(["train", "imgs", *tiny, "--print-config"], monkeypatch, capsys)
    trained = run_cli(["train", "imgs", *tiny, "--name", "t"], monkeypatch, capsys)
    assert shown[0] == trained[0] != 0 and shown[1] == trained[1] == ""
    assert one_error(shown[2]) == one_error(trained[2])


# ---------------------------------------------------------------------------- help


def verbs() -> list[str]:
    import typer

    from pactl.cli import app

    return list(typer.main.get_command(app).commands)


def words_of(command_name: str) -> tuple[list[str], list[str], list[str]]:
    """Option names, choice values and example lines of a verb, from its click command."""
    import typer

    from pactl.cli import app

    command = typer.main.get_command(app).commands[command_name]
    names, choices = ["-h", "--help"], []
    for param in command.params:
        assert param.help, f"pactl {command_name}: {param.name} has no help text"
        if param.param_type_name == "option":
            names += [*param.opts, *param.secondary_opts]
        descriptor = param.type_descriptor
        if descriptor.is_choice:
            choices += [getattr(c, "value", str(c)) for c in descriptor.choices]
    examples = command.help.partition("\b\n")[2].split("\n\n")[0].splitlines()
    return names, choices, [line.strip() for line in examples]


@pytest.mark.parametrize("columns", [80, 200])
def test_help_of_every_verb_is_whole_at_any_width(
    columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert {"download", "train", "embed", "index", "query", "eval", "list"} <= set(verbs())
    for verb in verbs():
        code, out, _ = run_cli([verb, "--help"], monkeypatch, capsys)
        assert code == 0
        too_long = [line for line in out.splitlines() if len(line) > columns]
        assert not too_long, (verb, too_long)
        names, choices, examples = words_of(verb)
        for word in [*names, *choices]:
            assert re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", out), (verb, word)
        for example in examples:  # kept as written, never re-wrapped
            assert re.search(rf"^ +{re.escape(example)}$", out, re.MULTILINE), (verb, example)
        assert "<bool>" not in out and "…" not in out
        if "--device" in names:
            assert "default: auto" in out, verb
    code, out, _ = run_cli(["--help"], monkeypatch, capsys)
    assert code == 0 and all(len(line) <= columns for line in out.splitlines())
    assert all(verb in out for verb in verbs())


@pytest.mark.parametrize(
    "extra", [["--follow-links"], ["--checkpoint", "x.pt"], ["--backbone", "resnet18"]]
)
def test_image_options_on_a_vectors_folder_are_refused(
    extra: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "vec").mkdir()
    (tmp_path / "x.pt").write_bytes(b"")
    np.save(tmp_path / "vec" / "vectors.npy", np.eye(4, dtype=np.float32))
    code, out, err = run_cli(["index", str(tmp_path / "vec"), *extra], monkeypatch, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"{extra[0]} is for indexing images" in err
    assert not (tmp_path / "vec" / "index.faiss").exists()
