"""An audit's suspected labels for a labelling tool: Label Studio tasks with the suggested label
as a prediction, and a CSV that FiftyOne's CSVDataset importer reads.

Label Studio: a JSON list of tasks, each `{"data": {"image": PATH, ...}, "predictions": [{
"model_version", "score", "result": [{"from_name": "label", "to_name": "image", "type":
"choices", "value": {"choices": [SUGGESTED]}}]}]}`, for a labelling config holding `<Image
name="image" value="$image"/>` and `<Choices name="label" toName="image">` (LABEL_CONFIG). With
`url_prefix` (for Label Studio's local files, `/data/local-files/?d=`) each image is that prefix
and its path below `root`.

FiftyOne: `filepath,label,suggested,kind,score,id,reason` with absolute paths, imported by
`fo.Dataset.from_dir(dataset_type=fo.types.CSVDataset, labels_path=FILE, fields={...})`.
Both files are written whole or not at all, and name each image once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from pactl.errors import PactlError
from pactl.store.csv_cells import csv_text
from pactl.store.generations import atomic_write_text

MODEL_VERSION = "pactl-audit"
FIFTYONE_COLUMNS = ("filepath", "label", "suggested", "kind", "score", "id", "reason")
LABEL_CONFIG = """<View>
  <Image name="image" value="$image"/>
  <Choices name="label" toName="image" choice="single">
    {choices}
  </Choices>
</View>"""


class Row(Protocol):
    """What an export reads of an audit's finding (pactl.verbs.audit.Finding)."""

    @property
    def kind(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def path(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def suggested(self) -> str: ...
    @property
    def id(self) -> int: ...
    @property
    def reason(self) -> str: ...


def once(rows: Sequence[Row]) -> list[Row]:
    """Each image's first row (the lists come ranked)."""
    seen: set[str] = set()
    out = []
    for r in rows:
        if r.path not in seen:
            seen.add(r.path)
            out.append(r)
    return out


def image_ref(path: str, url_prefix: str, root: Path | None) -> str:
    """The image as Label Studio reads it: the path, or the prefix and the path below `root`."""
    if not url_prefix:
        return path
    below = os.path.relpath(path, root) if root is not None else path.lstrip("/")
    if below.startswith(".."):
        raise PactlError(f"{path} is not below {root}: give a --labelstudio-root above every image")
    return url_prefix + quote(below, safe="/")


def labelstudio_tasks(
    rows: Sequence[Row], url_prefix: str = "", root: Path | None = None
) -> list[dict[str, object]]:
    """One task per image, the suggested label (where there is one) its prediction, scored by
    the finding's score (the doubt of a label: higher, worth a look sooner)."""
    tasks: list[dict[str, object]] = []
    for r in once(rows):
        task: dict[str, object] = {
            "data": {
                "image": image_ref(r.path, url_prefix, root),
                "path": r.path,
                "given": r.label,
                "suggested": r.suggested,
                "kind": r.kind,
                "score": round(float(r.score), 6),
                "audit_id": r.id,
                "reason": r.reason,
            }
        }
        if r.suggested:
            choice = {"choices": [r.suggested]}
            result = {"from_name": "label", "to_name": "image", "type": "choices", "value": choice}
            task["predictions"] = [
                {"model_version": MODEL_VERSION, "score": round(float(r.score), 6),
                 "result": [result]}
            ]  # fmt: skip
        tasks.append(task)
    return tasks


def write_labelstudio(
    rows: Sequence[Row], out: Path, url_prefix: str = "", root: Path | None = None
) -> int:
    """Label Studio tasks of `rows` to `out` (JSON, atomically): returns the tasks written."""
    tasks = labelstudio_tasks(rows, url_prefix, root)
    atomic_write_text(out, json.dumps(tasks, indent=1) + "\n")
    return len(tasks)


def label_config(labels: Sequence[str]) -> str:
    """A labelling config the tasks fit, its choices `labels` (XML-escaped)."""
    from xml.sax.saxutils import quoteattr

    lines = "\n    ".join(f"<Choice value={quoteattr(x)}/>" for x in labels)
    return LABEL_CONFIG.format(choices=lines)


def write_fiftyone(rows: Sequence[Row], out: Path) -> int:
    """FiftyOne's CSVDataset layout of `rows` to `out` (atomically): returns the rows written."""
    picked = once(rows)
    cells = [
        (r.path, r.label, r.suggested, r.kind, round(float(r.score), 6), r.id, r.reason)
        for r in picked
    ]
    atomic_write_text(out, csv_text(list(FIFTYONE_COLUMNS), cells))
    return len(picked)
