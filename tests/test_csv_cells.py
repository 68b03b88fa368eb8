"""CSV formula injection: a file or class named `=HYPERLINK(...)` is text in every CSV pactl
writes (OWASP: a single quote before a cell starting with = + - @ TAB or CR), reads back as the
same name, and stays raw in JSON Lines."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from conftest import make_class_folder, read_csv, run_cli
from test_hostile_cli import tiny_checkpoint

from pactl.store.csv_cells import csv_text, escape_cell, unescape_cell

STARTS = ("=", "+", "-", "@", "\t", "\r")  # OWASP's list, written out here independently
FORMULAS = ['=HYPERLINK("http://x","y")', "+cmd|'/c calc'!A0", "-2+3", "@SUM(A1)", "\tx", "\rx"]


def spreadsheet_would_run(cell: str) -> bool:
    """What a spreadsheet takes for a formula: a cell starting with one of STARTS that is not a
    plain number."""
    try:
        float(cell)
        return False
    except ValueError:
        return cell.startswith(STARTS)


@pytest.mark.parametrize(
    ("value", "written"),
    [
        *((f, "'" + f) for f in FORMULAS),
        ("a=b", "a=b"),
        ("'abc", "'abc"),
        ("'=x", "''=x"),  # already quoted text keeps its own quote after a round trip
        ("''", "'''"),
        ("-", "'-"),
        ("", ""),
        ("-0.5", "-0.5"),  # a plain number is read as a number by every spreadsheet
        ("1e-06", "1e-06"),
        (-0.5, -0.5),
        (-3, -3),
    ],
)
def test_escape_cell_by_hand(value: object, written: object) -> None:
    assert escape_cell(value) == written
    if isinstance(value, str):
        assert unescape_cell(str(written)) == value


def test_every_name_survives_the_escape() -> None:
    names = ["", "'", "''", "'a", "a'", *FORMULAS, *("'" + f for f in FORMULAS), "'''=", "=="]
    text = csv_text(["name"], [[n] for n in names], quote=True)
    rows = list(csv.reader(io.StringIO(text, newline="")))[1:]
    assert [unescape_cell(r[0]) for r in rows] == names
    assert not any(spreadsheet_would_run(r[0]) for r in rows)


def formula_folder(root: Path) -> Path:
    """Images whose file and class names are formulas."""
    make_class_folder(root, classes=2, per_class=2)
    (root / "class_0" / "0.png").rename(root / "class_0" / "=HYPERLINK(1).png")
    (root / "class_0" / "1.png").rename(root / "class_0" / "+cmd.png")
    (root / "class_1").rename(root / "@evil")
    return root


def test_query_csv_and_items_csv_hold_no_formula(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    imgs = formula_folder(tmp_path / "=imgs")
    tiny_checkpoint(tmp_path / "best.pt")
    bundle = tmp_path / "b"
    args = ["index", str(imgs), "--checkpoint", str(tmp_path / "best.pt"), "--out", str(bundle)]
    assert run_cli([*args, "--quiet"], monkeypatch, capsys)[0] == 0
    query = ["query", str(imgs / "class_0" / "+cmd.png"), "--index", str(bundle), "--k", "4"]
    code, out, err = run_cli([*query, "--format", "csv"], monkeypatch, capsys)
    assert code == 0, err
    table = list(csv.reader(io.StringIO(out, newline="")))
    items = list(csv.reader(io.StringIO((bundle / "items.csv").read_text(), newline="")))
    for cell in (c for rows in (table, items) for row in rows for c in row):
        assert not spreadsheet_would_run(cell), cell
    code, out, err = run_cli([*query, "--format", "jsonl"], monkeypatch, capsys)
    hits = [json.loads(line) for line in out.splitlines()]
    real = {str(p) for p in imgs.rglob("*.png")}
    assert {h["path"] for h in hits} == real  # raw, and the paths round-tripped items.csv
    assert {h["label"] for h in hits} == {"class_0", "@evil"}
    assert {unescape_cell(r[3]) for r in table[1:]} == real


@pytest.mark.parametrize("checkpoint", ["-best.pt", "=1+1.pt", "+cmd.pt", "@SUM(A1)/best.pt"])
def test_eval_report_holds_no_formula(tmp_path: Path, checkpoint: str) -> None:
    """`pactl eval --report`'s row: the dataset and the checkpoint as given (a relative path can
    start with = + - @) are escaped, the metrics (numbers, a negative one too) are not."""
    from pactl.cli.eval import write_report

    write_report(tmp_path / "e.csv", "=cmd|x", Path(checkpoint), {"recall@1": -0.25})
    row = read_csv(tmp_path / "e.csv")[0]
    assert row == {"dataset": "'=cmd|x", "checkpoint": "'" + checkpoint, "recall@1": "-0.25"}
    assert not any(spreadsheet_would_run(cell) for cell in row.values())
    assert unescape_cell(row["checkpoint"]) == checkpoint


def test_csv_text_quotes_only_what_needs_it_by_default() -> None:
    """Guards against csv_text quoting every text cell by default (metrics.csv and manifests
    are written through it as plain cells): only a field with a comma, a quote or a line break
    is quoted, and `quote=True` quotes every str."""
    assert csv_text(["name", "n"], [["a,b", 1], ["plain", 2]]) == 'name,n\n"a,b",1\nplain,2\n'
    assert csv_text(None, [["plain", 2]], quote=True) == '"plain",2\n'


def test_write_rows_keeps_the_bytes_of_a_name_that_is_not_utf8(tmp_path: Path) -> None:
    """Guards against write_rows encoding strictly: a file name's bytes that are not UTF-8
    (held as lone surrogates) are written as themselves, and read back to the same bytes."""
    import os

    from pactl.store.csv_cells import write_rows

    name = os.fsdecode(b"caf\xe9-=1+2.png")  # Latin-1 bytes, and a formula after them
    write_rows(tmp_path / "rows.csv", ["path"], [[name]])
    assert (tmp_path / "rows.csv").read_bytes() == b'"path"\n"caf\xe9-=1+2.png"\n'
    with open(tmp_path / "rows.csv", newline="", errors="surrogateescape") as f:
        assert [unescape_cell(r[0]) for r in csv.reader(f)] == ["path", name]
