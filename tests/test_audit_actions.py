"""Acting on `pactl audit`'s findings (pactl.audit.decisions, pactl.verbs.audit_actions,
pactl.interop.labelstudio): decisions read and checked against the audited set, the manifest
with the accepted labels, one image of each copy group by its rule, the Label Studio tasks and
FiftyOne's CSV, and bad decisions refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import one_error, read_csv, run_cli
from test_audit import hand_set, write_vectors

from pactl.audit import decisions
from pactl.errors import PactlError

BASE = ["audit", "b", "--neighbours", "5", "--no-copies", "--no-checks", "-f", "csv", "-q"]


@pytest.fixture
def bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    """The hand set's bundle: row 3 labelled a among class b (suggested b), row 20 an outlier."""
    vectors, labels, _ = hand_set()
    write_vectors(tmp_path / "vec", vectors, labels)
    assert run_cli(["index", "vec", "--out", "b", "-q"], monkeypatch, capsys)[0] == 0
    return tmp_path


def cli(
    args: list[str], mp: pytest.MonkeyPatch, cs: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    return run_cli([*BASE, *args], mp, cs)


def test_decisions_take_the_suggestion_keep_the_label_or_the_one_given(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("id,decision,label\n0,keep,\n1,reject,\n2,accept,z\n3,keep,\n3,reject,\n")
    made = decisions.read_decisions(path)
    labels, suggested = ["a", "a", "b", "b"], ["b", "c", "a", "a"]
    new = decisions.relabel(made, path, ["p0", "p1", "p2", "p3"], labels, suggested, "f")
    assert new == {0: "b", 2: "z"}  # 1 rejected; 3's last line rejects
    # a headerless CSV reads the same
    path.write_text("0,keep\n2,accept,z\n")
    assert decisions.relabel(
        decisions.read_decisions(path), path, ["p0", "p1", "p2", "p3"], labels, suggested, "f"
    ) == {0: "b", 2: "z"}


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"id": 9, "decision": "keep"}', "item 9 is not in the audited set"),
        ('{"id": 1, "decision": "keep", "path": "other"}', "item 1's path differs"),
        ('{"id": 1, "decision": "keep", "given": "b"}', "item 1's label differs"),
        ('{"id": 1, "decision": "keep", "fingerprint": "g"}', "the set's fingerprint differs"),
        ('{"id": 1, "decision": "maybe"}', "decision 'maybe' is not one of"),
        ('{"id": 1.0, "decision": "keep"}', "is not an item's number"),
        ('{"id": 1, "decision": "keep"', "not a JSON object"),
    ],
)
def test_a_decision_that_does_not_fit_the_audit_is_refused_with_its_line(
    tmp_path: Path, line: str, says: str
) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"id": 0, "decision": "reject"}\n' + line + "\n")
    with pytest.raises(PactlError, match="d.jsonl:2: ") as e:
        made = decisions.read_decisions(path)
        decisions.relabel(made, path, ["p0", "p1"], ["a", "a"], ["b", "b"], "f")
    assert says in str(e.value)


def test_copy_groups_join_pairs_and_each_rule_keeps_one(tmp_path: Path) -> None:
    files = []
    for i, size in enumerate([10, 30, 30, 5, 7]):
        files.append(tmp_path / f"{i}.png")
        files[-1].write_bytes(b"x" * size)
    paths = [str(f) for f in files]
    splits = ["test", "test", "test", "train", "test"]
    groups = decisions.copy_groups([(1, 0), (2, 1), (3, 4)], 5)
    assert groups == [[0, 1, 2], [3, 4]]
    drop = {
        r: decisions.copy_drops(groups, r, paths, splits).tolist()
        for r in ("first", "largest", "train")
    }
    assert drop["first"] == [1, 2, 4]
    assert drop["largest"] == [0, 2, 3]  # 1 and 2 tie at 30 bytes: the first path
    assert drop["train"] == [0, 2, 4]  # no train image in the first group: the largest


def test_relabel_writes_the_accepted_labels_and_refuses_a_changed_set(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(["--findings", "f.jsonl", "--top", "3"], monkeypatch, capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in (bundle / "f.jsonl").read_text().splitlines()]
    first = rows[0]
    assert (first["kind"], first["id"], first["suggested"]) == ("label", 3, "b")
    mark = first["fingerprint"]
    assert len(mark) == 64 and all(r["fingerprint"] == mark for r in rows)
    decided = [
        {"id": 3, "decision": "keep", "path": "/d/3.png", "given": "a", "fingerprint": mark},
        {"id": 5, "decision": "reject", "path": "/d/5.png", "given": "a", "fingerprint": mark},
        {"id": 6, "decision": "keep", "label": "c", "fingerprint": mark},
    ]
    (bundle / "d.jsonl").write_text("".join(json.dumps(d) + "\n" for d in decided))
    code, _, err = cli(["--relabel", "d.jsonl", "--write-manifest", "m.csv"], monkeypatch, capsys)
    assert code == 0, err
    got = {r["path"]: r["label"] for r in read_csv(bundle / "m.csv")}
    assert len(got) == 24 and got["/d/3.png"] == "b" and got["/d/5.png"] == "a"
    assert got["/d/6.png"] == "c" and got["/d/0.png"] == "a"
    # the same decisions against another set: refused with the line, nothing written
    vectors, labels, _ = hand_set()
    labels[0] = "c"
    write_vectors(bundle / "vec2", vectors, labels)
    assert (
        run_cli(["index", "vec2", "--out", "b", "-q", "--overwrite"], monkeypatch, capsys)[0] == 0
    )
    code, _, err = cli(["--relabel", "d.jsonl", "--write-manifest", "m2.csv"], monkeypatch, capsys)
    assert code == 1 and "d.jsonl:1: the set's fingerprint differs" in one_error(err)
    assert not (bundle / "m2.csv").exists()


def test_drop_top_auto_drops_the_estimated_count(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        [*BASE[:-1], "--drop-top", "auto", "--write-manifest", "m.csv"], monkeypatch, capsys
    )
    assert code == 0, err
    said = [line for line in err.splitlines() if "--drop-top auto:" in line][0]
    n = int(said.split("auto: ")[1].split(" ")[0])
    assert n >= 1 and len(read_csv(bundle / "m.csv")) == 24 - n
    assert "/d/3.png" not in {r["path"] for r in read_csv(bundle / "m.csv")}
    assert "audit card: estimated noise rate" in err
    code, _, err = cli(["--drop-top", "lots", "--write-manifest", "x.csv"], monkeypatch, capsys)
    assert code == 2 and "a number of labels from 1, or auto" in one_error(err)
    code, _, err = cli(["--relabel", "m.csv"], monkeypatch, capsys)
    assert code == 2 and "give it" in one_error(err)


def test_label_studio_tasks_and_fiftyone_csv_carry_the_suggestion(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--top", "4", "--labelstudio", "ls.json", "--fiftyone", "fo.csv"]
    code, _, err = cli(
        [*args, "--labelstudio-prefix", "/data/local-files/?d="], monkeypatch, capsys
    )
    assert code == 0, err
    tasks = json.loads((bundle / "ls.json").read_text())
    assert len(tasks) == 4
    first = tasks[0]
    assert first["data"]["image"] == "/data/local-files/?d=d/3.png"
    assert first["data"]["given"] == "a" and first["data"]["audit_id"] == 3
    (prediction,) = first["predictions"]
    assert prediction["score"] == pytest.approx(first["data"]["score"])
    assert prediction["result"] == [
        {"from_name": "label", "to_name": "image", "type": "choices", "value": {"choices": ["b"]}}
    ]
    rows = read_csv(bundle / "fo.csv")
    assert list(rows[0]) == ["filepath", "label", "suggested", "kind", "score", "id", "reason"]
    assert [r["filepath"] for r in rows] == [t["data"]["path"] for t in tasks]
    assert (rows[0]["label"], rows[0]["suggested"]) == ("a", "b")


def test_the_noise_estimate_is_zero_on_a_clean_set_of_pure_clusters() -> None:
    from pactl.audit.noise_rate import estimate_noise

    labels = np.repeat(np.arange(3), 4)
    nn = np.array([[c] * 3 for c in labels])
    assert estimate_noise(nn, labels, 3).overall == 0.0
