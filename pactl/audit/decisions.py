"""Acting on an audit's findings: the decisions a person made about them (a CSV, or the JSON Lines
the review page of `pactl serve` appends), the labels they give each item, one image kept of each
copy group, and the fingerprint that ties decisions to the set they were made on.

A decision names an audited item by its `id` (its row among the audited items) and says `keep`
(or `accept`: the suggested label is taken), `reject` (the given label stays), with an optional
`label` that overrides either. Where an item is decided more than once the last line wins (the
review page appends). A row naming an item the audit does not hold, or one whose recorded path,
given label or fingerprint differ from the audit's (the set changed since), is refused with its
line, before anything is written. Nothing here touches an image.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pactl.errors import PactlError

TAKE = ("keep", "accept")  # the suggested label is taken
LEAVE = ("reject",)  # the given label stays
KEEP_COPY_RULES = ("first", "largest", "train")


@dataclass(frozen=True)
class Decision:
    """One line of a decisions file: where it stood (for messages), the item and the verdict,
    and what the line recorded of the item when it was decided ('' where it recorded nothing)."""

    line: int
    id: int
    decision: str  # keep | accept | reject
    label: str = ""  # an explicit label, overriding the decision
    suggested: str = ""  # the suggestion the person saw
    path: str = ""
    given: str = ""
    fingerprint: str = ""


def fingerprint(paths: Sequence[str], labels: Sequence[str], splits: Sequence[str]) -> str:
    """sha256 of the audited rows (path, label and split, in order): any change to the set (a
    row added, removed, moved or relabelled) changes it."""
    digest = hashlib.sha256()
    for row in zip(paths, labels, splits, strict=True):
        digest.update("\0".join(row).encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def read_decisions(path: Path) -> list[Decision]:
    """A decisions file: JSON Lines (each line an object with `id` and `decision`) or CSV
    (`id,decision[,label]`, with or without that header)."""
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as e:
        raise PactlError(f"cannot read {path}: {e.strerror or e}") from None
    if text.lstrip().startswith("{"):
        return [json_decision(path, n, line) for n, line in numbered(text) if line.strip()]
    return csv_decisions(path, text)


def numbered(text: str) -> list[tuple[int, str]]:
    return list(enumerate(text.splitlines(), start=1))


def json_decision(path: Path, n: int, line: str) -> Decision:
    """One JSON line as a Decision."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise PactlError(f"{path}:{n}: not a JSON object ({e.msg}): {line[:80]!r}") from None
    if not isinstance(row, dict):
        raise PactlError(f"{path}:{n}: not a JSON object: {line[:80]!r}")
    texts = {k: row.get(k) or "" for k in ("label", "suggested", "path", "given", "fingerprint")}
    if not all(isinstance(v, str) for v in texts.values()):
        raise PactlError(f"{path}:{n}: label, suggested, path, given are text: {line[:80]!r}")
    return checked(path, n, row.get("id"), row.get("decision"), **texts)


def csv_decisions(path: Path, text: str) -> list[Decision]:
    """`id,decision[,label]` rows; a first row whose id is not a number is the header."""
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise PactlError(f"cannot read {path}: {e}") from None
    out, columns = [], ["id", "decision", "label"]
    for n, cells in enumerate(rows, start=1):
        if not cells or not "".join(cells).strip():
            continue
        if n == 1 and not cells[0].strip().lstrip("-").isdigit():
            columns = [c.strip() for c in cells]
            if not {"id", "decision"} <= set(columns):
                raise PactlError(f"{path}:1: a header names `id` and `decision`: {cells}")
            continue
        got = dict(zip(columns, (c.strip() for c in cells), strict=False))
        extra = {k: got.get(k, "") for k in ("label", "path", "given", "suggested")}
        out.append(checked(path, n, got.get("id"), got.get("decision"), **extra))
    return out


def checked(source: Path, n: int, item: object, decision: object, **texts: str) -> Decision:
    """A Decision of one line's cells, its id a whole number and its decision a known word."""
    try:
        if isinstance(item, (bool, float)):  # 1.5 or true is no item's number
            raise ValueError
        number = int(item)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise PactlError(f"{source}:{n}: `id` {item!r} is not an item's number") from None
    word = str(decision or "").strip().lower()
    if word not in TAKE + LEAVE:
        raise PactlError(
            f"{source}:{n}: decision {decision!r} is not one of {', '.join(TAKE + LEAVE)}"
        )
    return Decision(n, number, word, **texts)


def relabel(
    decisions: Sequence[Decision],
    source: Path,
    paths: Sequence[str],
    labels: Sequence[str],
    suggested: Sequence[str],
    mark: str,
) -> dict[int, str]:
    """{item: new label} from `decisions`, checked against the audited set (`paths`, `labels`,
    the audit's `suggested` labels, '' none; `mark` its fingerprint). The last line of an item
    wins; items whose label stays are left out."""
    chosen: dict[int, Decision] = {}
    for d in decisions:
        where = f"{source}:{d.line}"
        if not 0 <= d.id < len(paths):
            raise PactlError(
                f"{where}: item {d.id} is not in the audited set (ids 0 to {len(paths) - 1}): "
                "decisions belong to the audit that made them"
            )
        changed = (
            (d.fingerprint and d.fingerprint != mark and "the set's fingerprint")
            or (d.path and d.path != paths[d.id] and f"item {d.id}'s path")
            or (d.given and d.given != labels[d.id] and f"item {d.id}'s label")
        )
        if changed:
            raise PactlError(
                f"{where}: {changed} differs from this audit's: the manifest changed since the "
                "decisions were made; audit it again and decide anew"
            )
        chosen[d.id] = d
    out = {}
    for item, d in chosen.items():
        new = d.label or (d.suggested or suggested[item] if d.decision in TAKE else labels[item])
        if not new:
            raise PactlError(
                f"{source}:{d.line}: item {item} is kept with its suggested label, and it has "
                "none: give the label in the line's `label`"
            )
        if new != labels[item]:
            out[item] = new
    return out


def copy_groups(pairs: Sequence[tuple[int, int]], n: int) -> list[list[int]]:
    """The groups of items the copy pairs join (each a sorted list of 2 or more), by union-find."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for i in sorted({i for pair in pairs for i in pair}):
        groups.setdefault(root(i), []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def copy_drops(
    groups: Sequence[Sequence[int]], rule: str, paths: Sequence[str], splits: Sequence[str]
) -> np.ndarray:
    """The items left out so that one of each copy group stays, by `rule`: `first` the earliest
    audited row; `largest` the largest file, ties by path; `train` the one in the train split
    (several: the largest of them, ties by path), else the largest, ties by path."""
    if rule not in KEEP_COPY_RULES:
        raise PactlError(f"--keep-copies {rule!r}: one of {', '.join(KEEP_COPY_RULES)}")
    drop: list[int] = []
    for group in groups:
        drop += [i for i in group if i != kept_copy(group, rule, paths, splits)]
    return np.array(sorted(drop), dtype=np.int64)


def kept_copy(group: Sequence[int], rule: str, paths: Sequence[str], splits: Sequence[str]) -> int:
    """The one item of `group` that `rule` keeps."""
    if rule == "first":
        return min(group)
    pool = [i for i in group if splits[i] == "train"] if rule == "train" else []
    return min(pool or group, key=lambda i: (-file_size(paths[i]), paths[i]))


def file_size(path: str) -> int:
    """Bytes of the file (-1: gone or unreadable, so never the largest)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return -1
