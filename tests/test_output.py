"""Names from the file system on a terminal and in machine formats: shown safely, kept exactly."""

from __future__ import annotations

import csv
import io
import json
import os
import re

import numpy as np
import pytest
from rich.console import Console

from pactl.console import Reporter, visible
from pactl.output import HitWriter
from pactl.results import Hit

# Names a file system can hand over: markup, control characters, bidi overrides, line breaks,
# CSV specials, non-ASCII, and bytes that are not UTF-8 (lone surrogates after surrogateescape).
AWKWARD = [
    "[bold]x[/bold].png",
    "[/nope].png",
    ":smile:.png",
    "a\x1b[2Jb.png",
    "over\rwrite.png",
    "bell\a\bback.png",
    "\u202egnp.exe",
    "new\nline.png",
    "crlf\r\n.png",
    'comma,"quote".png',
    " spaced .png",
    "café/日本.png",
    "raw\udce9\udcff.png",
    "back\\slash\\x1b.png",
    "c1\x85\x9b.png",
    "",
]


def hit(path: str, label: str = "cat", query: str = "q.png", rank: int = 1) -> Hit:
    return Hit(query, rank, rank - 1, path, label, 0.5)


def stdout_like() -> tuple[io.TextIOWrapper, io.BytesIO]:
    """A text stream over bytes, as sys.stdout is: strict UTF-8 for text written to it."""
    raw = io.BytesIO()
    return io.TextIOWrapper(raw, encoding="utf-8", newline="\n"), raw


def console(force_terminal: bool) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=force_terminal, width=200), buffer


def unescape(shown: str) -> str:
    """The inverse of visible(), as documented there: proves that no two names look alike."""
    named = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}

    def one(m: re.Match[str]) -> str:
        body = m.group(1)
        if body in named:
            return named[body]
        code = int(body[1:], 16)
        if body[0] == "x" and code >= 0x80:  # a byte that is not UTF-8
            return chr(0xDC00 + code)
        return chr(code)

    return re.sub(r"\\(\\|t|n|r|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})", one, shown)


# --- visible() -------------------------------------------------------------------------------


def test_visible_keeps_printable_text() -> None:
    for text in ["", "plain.png", "a b/c d.png", "café/日本/Ωμέγα.png", "[bold]x[/bold] :smile:"]:
        assert visible(text) == text


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("a\rb", "a\\rb"),
        ("a\nb", "a\\nb"),
        ("a\tb", "a\\tb"),
        ("\a\b\x00\x7f", "\\x07\\x08\\x00\\x7f"),
        ("\x85\x9b", "\\u0085\\u009b"),  # C1 controls: characters, so \u, never \x
        ("\u202eevil\u2066\u200f", "\\u202eevil\\u2066\\u200f"),  # bidi overrides and marks
        ("\u2028\u00a0", "\\u2028\\u00a0"),  # a line separator, a space that is not U+0020
        ("raw\udce9\udcff", "raw\\xe9\\xff"),  # bytes that are not UTF-8: \x and the byte
        ("\ud800", "\\ud800"),  # a lone surrogate that is no escaped byte
        ("back\\slash", "back\\\\slash"),  # doubled, so "\\x1b" typed in a name is not ESC
        ("\U000e0001", "\\U000e0001"),
    ],
)
def test_visible_escapes_what_a_terminal_would_act_on(text: str, shown: str) -> None:
    assert visible(text) == shown


def test_visible_is_printable_unambiguous_and_encodable() -> None:
    rng = np.random.default_rng(0)
    alphabet = list("ab \\xu01[]/") + [chr(c) for c in (0, 7, 8, 9, 10, 13, 27, 0x7F, 0x85)]
    alphabet += ["é", "日", "\u202e", "\u200d", "\udc85", "\udce9", "\ud800", "\U0001f600"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 12))).tolist())
        shown = visible(text)
        assert shown.isprintable(), (text, shown)
        shown.encode("utf-8")  # no lone surrogate is left to fail on output
        assert unescape(shown) == text, (text, shown)


# --- Reporter --------------------------------------------------------------------------------


@pytest.mark.parametrize("force_terminal", [False, True])
@pytest.mark.parametrize("name", AWKWARD)
def test_log_and_warn_show_names_literally(name: str, force_terminal: bool) -> None:
    err, buffer = console(force_terminal)
    Reporter(err).log(f"reading {name}")
    Reporter(err, quiet=True).warn(f"skipped {name}")  # shown even when quiet
    Reporter(err, quiet=True).log("not shown")
    lines = [f"reading {visible(name)}", f"warning: skipped {visible(name)}"]
    assert buffer.getvalue() == "".join(line + "\n" for line in lines)


def test_bar_description_is_not_markup() -> None:
    err, buffer = console(force_terminal=True)
    reporter = Reporter(err)
    assert reporter.show_bars
    with reporter.bar("extracting [/nope] \x1b[2J.tar", total=2) as advance:
        advance(2)
    assert "\x1b[2J" not in buffer.getvalue()


# --- table -----------------------------------------------------------------------------------


@pytest.mark.parametrize("force_terminal", [False, True])
def test_table_shows_every_name_literally(force_terminal: bool) -> None:
    out, buffer = console(force_terminal)
    stream, _ = stdout_like()
    writer = HitWriter(out, stream, "table", paths_only=False, null=False)
    for name in AWKWARD:
        writer.write([[hit(name, label=name, query=name + "?")]])
    writer.close()
    shown = buffer.getvalue()
    for name in AWKWARD:
        assert f"{visible(name)}?" in shown  # the title, escapes and all
        assert visible(name) in shown
    for raw in ["\x1b[2J", "\r", "\a", "\b", "\u202e", "\x85", "\x9b", "😄"]:
        assert raw not in shown, repr(raw)
    if not force_terminal:
        assert "\x1b" not in shown  # no styles either: nothing but text to a file


def test_table_title_with_a_closing_tag_does_not_raise() -> None:
    out, buffer = console(force_terminal=False)
    stream, _ = stdout_like()
    HitWriter(out, stream, "table", False, False).write([[hit("[/nope]", "[/x]", "[/q]")]])
    assert "[/q]" in buffer.getvalue() and "[/nope]" in buffer.getvalue()


def test_table_shows_a_long_path_whole() -> None:
    buffer = io.StringIO()
    out = Console(file=buffer, force_terminal=False, width=60)
    stream, _ = stdout_like()
    path = "/data/" + "x" * 150 + "/END.png"
    HitWriter(out, stream, "table", False, False).write([[hit(path, label="l" * 80)]])
    rows = [line.split("│") for line in buffer.getvalue().splitlines() if line.startswith("│")]
    assert "".join(row[-2].strip() for row in rows) == path  # folded over lines, not cut
    assert "".join(row[-3].strip() for row in rows) == "l" * 80


# --- machine formats -------------------------------------------------------------------------


def awkward_hits() -> list[list[Hit]]:
    """One query per awkward name, each with a hit whose path and label are awkward too."""
    return [
        [hit(name, label=name[::-1], query=f"q{name}", rank=r) for r in (1, 2)] for name in AWKWARD
    ]


def test_csv_round_trips_every_name() -> None:
    stream, raw = stdout_like()
    out, _ = console(force_terminal=False)
    writer = HitWriter(out, stream, "csv", paths_only=False, null=False)
    batches = awkward_hits()
    writer.write(batches[:3])
    writer.write(batches[3:])  # the header once, not per batch
    writer.close()
    text = io.TextIOWrapper(io.BytesIO(raw.getvalue()), "utf-8", "surrogateescape", newline="")
    rows = list(csv.reader(text))
    assert rows[0] == list(HitWriter.columns)
    expected = [h for per_query in batches for h in per_query]
    assert len(rows) == 1 + len(expected)
    for row, h in zip(rows[1:], expected, strict=True):
        assert row == [h.query, str(h.rank), str(h.id), h.path, h.label, "0.5"]
        assert os.fsencode(row[3]) == os.fsencode(h.path)  # the name's own bytes


def test_csv_plain_rows_are_unchanged() -> None:
    stream, raw = stdout_like()
    out, _ = console(force_terminal=False)
    writer = HitWriter(out, stream, "csv", paths_only=False, null=False)
    writer.write([[hit("/data/a.png"), hit("/data/b,c.png", rank=2)]])
    assert raw.getvalue().decode() == (
        "query,rank,id,path,label,score\n"
        "q.png,1,0,/data/a.png,cat,0.5\n"
        'q.png,2,1,"/data/b,c.png",cat,0.5\n'
    )


def test_jsonl_lines_parse_and_keep_every_name() -> None:
    stream, raw = stdout_like()
    out, _ = console(force_terminal=False)
    writer = HitWriter(out, stream, "jsonl", paths_only=False, null=False)
    batches = awkward_hits()
    writer.write(batches)
    writer.close()
    data = raw.getvalue()
    assert data.decode("ascii")  # ASCII, hence valid UTF-8 whatever the names held
    lines = data.split(b"\n")
    assert lines[-1] == b""
    expected = [h for per_query in batches for h in per_query]
    for line, h in zip(lines[:-1], expected, strict=True):
        row = json.loads(line)
        assert (row["query"], row["path"], row["label"]) == (h.query, h.path, h.label)
        assert (row["rank"], row["id"], row["score"]) == (h.rank, h.id, 0.5)


@pytest.mark.parametrize("null", [True, False])
def test_paths_only_writes_the_names_bytes(null: bool) -> None:
    stream, raw = stdout_like()
    out, _ = console(force_terminal=False)
    err, said = console(force_terminal=False)
    writer = HitWriter(out, stream, "table", True, null, reporter=Reporter(err, quiet=True))
    stream.write("before\n")  # text already written comes first
    batches = awkward_hits()
    writer.write(batches[:8])
    writer.write(batches[8:])
    writer.close()
    end = b"\0" if null else b"\n"
    names = [h.path for per_query in batches for h in per_query]
    assert raw.getvalue() == b"before\n" + b"".join(os.fsencode(p) + end for p in names)
    warned = said.getvalue()
    if null:
        assert warned == ""
    else:  # names with a newline: one warning, on the reporter, for the whole output
        assert warned.count("warning:") == 1 and "-0" in warned and "\\n" in warned


def test_paths_only_without_newlines_does_not_warn() -> None:
    stream, raw = stdout_like()
    out, _ = console(force_terminal=False)
    err, said = console(force_terminal=False)
    writer = HitWriter(out, stream, "table", True, False, reporter=Reporter(err))
    writer.write([[hit("/a b.png"), hit("/c\r.png", rank=2)]])
    assert raw.getvalue() == b"/a b.png\n/c\r.png\n"
    assert said.getvalue() == ""


def test_paths_only_to_a_text_only_stream_keeps_the_str() -> None:
    stream = io.StringIO()
    out, _ = console(force_terminal=False)
    HitWriter(out, stream, "table", True, True).write([[hit("raw\udce9.png"), hit("é", rank=2)]])
    assert stream.getvalue() == "raw\udce9.png\0é\0"
