"""The review page's routes (`pactl serve --findings FILE --decisions FILE`): an audit's
suspected labels with their evidence and neighbours, and a person's keep or reject of each,
appended to the decisions file that `pactl audit --write-manifest --relabel` reads.

The findings are audit's JSON Lines (`pactl audit --findings FILE`, each row with the audited
set's fingerprint, or `-f jsonl`); only the suspected labels (`kind` label) are reviewed. Each
decision is one JSON line written with one append (O_APPEND, then fsync) under a lock, so a crash
leaves whole lines only, and it records what the person saw: the item's id, path, given and
suggested labels and the fingerprint, which --relabel checks against its own audit. Images are
shown through the bundle's own item routes (a finding's path looked up among the bundle's
items); the service never writes anything else, and never an image.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query
from starlette.concurrency import run_in_threadpool

from pactl.audit.decisions import LEAVE, TAKE, read_decisions
from pactl.errors import PactlError
from pactl.serve.bodies import json_object
from pactl.serve.engine import Engine

MAX_PAGE = 200  # findings in one answer


@dataclass
class Review:
    """The findings reviewed (label rows, in the file's order) and the decisions so far."""

    findings: Path
    decisions: Path
    rows: list[dict[str, Any]]
    by_id: dict[int, int]  # audited item id -> its position in `rows`
    decided: dict[int, dict[str, str]] = field(default_factory=dict)  # id -> the last decision


def open_review(findings: Path, decisions: Path) -> Review:
    """The findings and the decisions made so far, each read whole; a bad line is one error."""
    rows = [r for r in read_findings(findings) if r.get("kind") == "label"]
    if not rows:
        raise PactlError(f"{findings} holds no suspected labels (kind label) to review")
    review = Review(findings, decisions, rows, {int(r["id"]): i for i, r in enumerate(rows)})
    if decisions.exists():
        for d in read_decisions(decisions):
            review.decided[d.id] = {"decision": d.decision, "label": d.label}
    elif not os.access(decisions.parent if str(decisions.parent) else ".", os.W_OK):
        raise PactlError(f"cannot write --decisions {decisions}: its folder is not writable")
    return review


def read_findings(path: Path) -> list[dict[str, Any]]:
    """audit's JSON Lines: each line an object with kind, id, path and label."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PactlError(f"cannot read --findings {path}: {e}") from None
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PactlError(f"{path}:{n}: not a JSON object ({e.msg})") from None
        if not isinstance(row, dict) or not {"kind", "id", "path", "label"} <= row.keys():
            raise PactlError(f"{path}:{n}: not one of pactl audit's rows (-f jsonl)")
        rows.append(row)
    return rows


def shown(review: Review, engine: Engine, position: int) -> dict[str, Any]:
    """One finding as the page shows it: its evidence, its neighbours, the bundle item of each
    image (None: not in the bundle served) and the decision made so far."""
    row = review.rows[position]
    near = [n for n in row.get("neighbours") or [] if isinstance(n, dict)]
    paths = [str(row["path"]), *(str(n.get("path", "")) for n in near)]
    items = bundle_ids(engine, paths)
    keys = ("id", "rank", "score", "path", "split", "label", "suggested", "class_share")
    out = {k: row.get(k) for k in (*keys, "neighbour_share", "reason")}
    out["item"] = items[0]
    out["neighbours"] = [
        {"id": n.get("id"), "label": n.get("label"), "cosine": n.get("cosine"),
         "path": n.get("path", ""), "item": item}
        for n, item in zip(near, items[1:], strict=True)
    ]  # fmt: skip
    out["decision"] = review.decided.get(int(row["id"]))
    return out


def bundle_ids(engine: Engine, paths: list[str]) -> list[int | None]:
    """Each path's item id in the bundle served (None: not there, or no path)."""
    snapshot = engine.fresh()
    known = [p for p in paths if p]
    ids = dict(zip(known, snapshot.lookup.ids(known).tolist(), strict=True)) if known else {}
    return [int(ids[p]) if p and ids.get(p, -1) >= 0 else None for p in paths]


def decision_line(review: Review, body: dict[str, Any]) -> dict[str, Any]:
    """The line a decision appends, from the request `{"id", "decision"[, "label"]}`."""
    item, word, label = body.get("id"), body.get("decision"), body.get("label", "")
    if not isinstance(item, int) or isinstance(item, bool) or item not in review.by_id:
        raise HTTPException(404, f"no finding of item {item!r} in {review.findings}")
    if word not in TAKE + LEAVE:
        raise HTTPException(400, f"decision: one of {', '.join(TAKE + LEAVE)}")
    if not isinstance(label, str) or "\n" in label or len(label) > 1000:
        raise HTTPException(400, "label: one line of text")
    row = review.rows[review.by_id[item]]
    line = {"id": item, "decision": word, "label": label.strip(), "path": row["path"]}
    line |= {"given": row["label"], "suggested": row.get("suggested") or ""}
    line["fingerprint"] = row.get("fingerprint") or ""
    return line


def append_line(path: Path, line: dict[str, Any]) -> None:
    """One whole line appended in one write, on disk before the answer."""
    data = (json.dumps(line) + "\n").encode("ascii")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(f"short write to {path}")
        os.fsync(fd)
    finally:
        os.close(fd)


def review_routes(app: FastAPI, review: Review) -> None:
    """GET /review/findings (a page of them) and POST /review/decisions (one decision)."""
    engine: Engine = app.state.engine
    turn = asyncio.Lock()  # one append at a time, in the order they came

    @app.get("/review/findings")
    def findings(
        offset: int = Query(0, ge=0), limit: int = Query(50, ge=1, le=MAX_PAGE)
    ) -> dict[str, Any]:
        """The suspected labels from `offset`, most doubted first, each with its evidence."""
        positions = range(offset, min(offset + limit, len(review.rows)))
        return {
            "total": len(review.rows),
            "decided": len(review.decided),
            "decisions": str(review.decisions),
            "findings": [shown(review, engine, i) for i in positions],
        }

    @app.post("/review/decisions")
    async def decide(body: dict[str, Any] = Depends(json_object)) -> dict[str, Any]:
        """Keep (take the suggested label) or reject (keep the given one) a finding's item."""
        line = decision_line(review, body)
        async with turn:
            await run_in_threadpool(append_line, review.decisions, line)
            review.decided[line["id"]] = {"decision": line["decision"], "label": line["label"]}
        return {"recorded": line, "decided": len(review.decided)}
