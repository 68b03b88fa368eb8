"""`pactl export` end to end through the CLI: ONNX, Parquet read back by `pactl index`, Qdrant
searched by `pactl query --qdrant` with the bundle's answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import one_error, run_cli
from test_api import tiny_run


@pytest.fixture
def made(tmp_path: Path, monkeypatch, capsys) -> Path:
    """photos/, best.pt, vectors/ and bundle/ (Flat) in the working folder."""
    tiny_run(tmp_path)
    for args in (
        ["embed", "photos", "--checkpoint", "best.pt", "--out", "vectors"],
        ["index", "vectors", "--out", "bundle", "--factory", "Flat"],
    ):
        code, _, err = run_cli([*args, "--quiet"], monkeypatch, capsys)
        assert code == 0, err
    return tmp_path


def hits_of(args: list[str], monkeypatch, capsys) -> list[tuple[str, int, str, float]]:
    code, out, err = run_cli(["query", *args, "--format", "jsonl", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    return [(r["query"], r["id"], r["path"], r["score"]) for r in map(json.loads, out.splitlines())]


def test_onnx_export_writes_the_file_once(made: Path, monkeypatch, capsys) -> None:
    code, out, err = run_cli(["export", "best.pt", "--to", "onnx", "--out", "model.onnx"],
                             monkeypatch, capsys)  # fmt: skip
    assert code == 0, err
    assert out.startswith("exported best.pt to model.onnx (opset 20, 16 px -> 16-d")
    assert (made / "model.onnx").stat().st_size > 0
    code, _, err = run_cli(["export", "best.pt", "--format", "onnx", "--out", "model.onnx"],
                           monkeypatch, capsys)  # fmt: skip
    assert code == 1 and "--overwrite" in one_error(err)


def test_parquet_export_is_indexed_back_with_the_same_answers(made: Path, monkeypatch, capsys):
    code, out, err = run_cli(["export", "vectors", "--to", "parquet", "--out", "pq",
                              "--rows-per-shard", "6"], monkeypatch, capsys)  # fmt: skip
    assert code == 0, err
    assert out.strip() == "wrote 16 vectors (16-d) to pq in 3 shards"
    code, _, err = run_cli(["index", "pq", "--out", "again", "--factory", "Flat", "--quiet"],
                           monkeypatch, capsys)  # fmt: skip
    assert code == 0, err
    queries = [str(p) for p in sorted(Path("photos").rglob("*.png"))[::5]]
    assert hits_of([*queries, "--index", "again", "--k", "5"], monkeypatch, capsys) == hits_of(
        [*queries, "--index", "bundle", "--k", "5"], monkeypatch, capsys
    )


def test_qdrant_export_resumes_and_query_gives_the_bundles_top_k(made: Path, monkeypatch, capsys):
    args = ["export", "bundle", "--to", "qdrant", "--out", "qd", "--batch-size", "5"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert "exported 16 items to Qdrant collection 'pactl' at qd (0 there already; 16" in out
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0 and "exported 0 items" in out and "16 there already" in out
    queries = [str(p) for p in sorted(Path("photos").rglob("*.png"))[::3]]
    for extra in ([], ["--exclude-self"]):
        base = [*queries, "--index", "bundle", "--k", "6", *extra]
        want = hits_of(base, monkeypatch, capsys)
        got = hits_of([*base, "--qdrant", "qd"], monkeypatch, capsys)
        assert [h[:3] for h in got] == [h[:3] for h in want]
        assert max(abs(a[3] - b[3]) for a, b in zip(got, want, strict=True)) < 1e-5


def test_qdrant_layout_options_reach_the_collection_and_query_says_its_search(
    made: Path, monkeypatch, capsys
) -> None:
    """--shards, --replication, --hnsw-m, --parallel, --target-recall are taken (local mode
    keeps no shards: tests/test_qdrant_tuning.py checks what a server is sent), the result line
    says the search tuned, and `pactl query --qdrant` says on stderr how it searches; the
    options are refused with another --to."""
    args = ["export", "bundle", "--to", "qdrant", "qd", "--shards", "3", "--replication", "2",
            "--hnsw-m", "8", "--parallel", "2", "--target-recall", "0.9", "--in-ram"]  # fmt: skip
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert "exported 16 items" in out
    assert "search tuned: hnsw_ef 16, oversampling 1, recall@10 1.0 (local mode: exact" in out
    assert "local mode writes in one stream" in err
    photo = str(sorted(Path("photos").rglob("*.png"))[0])
    code, _, err = run_cli(["query", photo, "--index", "bundle", "--qdrant", "qd"],
                           monkeypatch, capsys)  # fmt: skip
    assert code == 0 and "Qdrant's local mode compares every point" in err
    for option, value in (("--shards", "2"), ("--target-recall", "0.9"), ("--in-ram", None)):
        extra = [option] if value is None else [option, value]
        code, _, err = run_cli(["export", "vectors", "--to", "parquet", "--out", "pq", *extra],
                               monkeypatch, capsys)  # fmt: skip
        assert code == 2 and "goes with --to qdrant, not --to parquet" in one_error(err)


def test_the_target_may_be_the_second_argument(made: Path, monkeypatch, capsys) -> None:
    """`pactl export BUNDLE --to qdrant PATH` writes where `--out PATH` does; both, or neither,
    is a usage error."""
    code, out, err = run_cli(["export", "bundle", "--to", "qdrant", "qd2"], monkeypatch, capsys)
    assert code == 0 and "exported 16 items to Qdrant collection 'pactl' at qd2" in out, err
    code, out, err = run_cli(["export", "bundle", "qd2", "--to", "qdrant"], monkeypatch, capsys)
    assert code == 0 and "exported 0 items" in out and "16 there already" in out, err
    code, _, err = run_cli(["export", "bundle", "--to", "qdrant", "a", "--out", "b"],
                           monkeypatch, capsys)  # fmt: skip
    assert code == 2 and "give where to write once: a or --out b" in one_error(err)
    code, _, err = run_cli(["export", "bundle", "--to", "qdrant"], monkeypatch, capsys)
    assert code == 2 and "give where to write" in one_error(err)


def test_options_of_another_target_are_usage_errors(made: Path, monkeypatch, capsys) -> None:
    code, _, err = run_cli(["export", "vectors", "--to", "parquet", "--out", "x", "--opset", "18"],
                           monkeypatch, capsys)  # fmt: skip
    assert code == 2 and "--opset goes with --to onnx, not --to parquet" in one_error(err)
    code, _, err = run_cli(["export", "best.pt", "--to", "qdrant", "--out", "qd"],
                           monkeypatch, capsys)  # fmt: skip
    assert code == 2 and "is a file" in one_error(err)
    code, _, err = run_cli(["query", "photos", "--index", "bundle", "--collection", "c"],
                           monkeypatch, capsys)  # fmt: skip
    assert code == 2 and "--collection goes with --qdrant" in one_error(err)
    code, _, err = run_cli(["query", "photos", "--index", "bundle", "--qdrant", "nowhere"],
                           monkeypatch, capsys)  # fmt: skip
    assert code == 1 and "has no Qdrant collection 'pactl'" in one_error(err)


def test_a_parquet_folder_without_paths_is_one_error_line(made: Path, monkeypatch, capsys):
    import pyarrow.parquet as pq

    run_cli(["export", "vectors", "--to", "parquet", "--out", "pq", "-q"], monkeypatch, capsys)
    target = next(Path("pq/metadata").glob("*.parquet"))
    table = pq.read_table(target).drop_columns(["path"])
    pq.write_table(table, target.resolve())  # through the link, into the current generation
    code, _, err = run_cli(["index", "pq", "--out", "b"], monkeypatch, capsys)
    assert code == 1
    assert "has no path column (it has id, label, size, mtime_ns)" in one_error(err)
