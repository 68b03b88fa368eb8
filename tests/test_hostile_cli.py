"""Hostile input at the command line: run names, option values, tampered checkpoints and run
configs, output paths, broken standard streams and a full disk. Each ends as one line on stderr
(`error: ...`) and a non-zero exit (2 for a usage mistake), never a traceback."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    TINY,
    fill,
    make_class_folder,
    one_error,
    read_csv,
    read_only_mount,
    run_cli,
    train_tiny,
)

from pactl import checkpoint as ckpt


def tiny_checkpoint(path: Path) -> dict[str, Any]:
    """best.pt of an untrained TINY network: a valid export, made in a fraction of a second."""
    from pactl.config import ModelConfig
    from pactl.model import build_model

    config = ModelConfig(
        backbone="small", weights="none", embedding_dim=16, image_size=16, resize_size=16
    )
    net, filled = build_model(config)
    weights = ckpt.clean_state_dict(net)
    payload = ckpt.export_payload(weights, filled, ["a", "b"], 1, {"recall@1": 0.5})
    ckpt.save(path, payload)
    return payload


def tiny_bundle(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    """root/b: a bundle of root/imgs (4 classes of 2 images) from tiny_checkpoint's root/best.pt."""
    make_class_folder(root / "imgs", classes=4, per_class=2)
    tiny_checkpoint(root / "best.pt")
    args = ["index", str(root / "imgs"), "--checkpoint", str(root / "best.pt")]
    code, _, err = run_cli([*args, "--out", str(root / "b"), "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    return root / "b"


# ---------------------------------------------------------------------------- run folders


@pytest.mark.parametrize("name", ["..", "ABS", "a/b", ".", "", "a\\b", "tab\there", "nul\0x"])
def test_run_name_must_be_one_plain_folder_name(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    (tmp_path / "runs").mkdir()
    (tmp_path / "sentinel.txt").write_text("keep me")
    outside = tmp_path / "outside"
    name = str(outside) if name == "ABS" else name
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", name]
    code, out, err = run_cli([*args, "--overwrite", "--quiet"], monkeypatch, capsys)
    assert code == 2 and out == ""
    assert "--name" in one_error(err)
    if name == "tab\there":  # the tab shown as one escape, not repr's escaped once more
        assert "--name 'tab\\there' must" in err, err
    assert (tmp_path / "sentinel.txt").read_text() == "keep me"  # runs/.. was not removed
    assert not outside.exists() and list((tmp_path / "runs").iterdir()) == []


def test_overwrite_never_removes_a_folder_pactl_did_not_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    mine = tmp_path / "runs" / "mine"
    mine.mkdir(parents=True)
    (mine / "sentinel.txt").write_text("keep me")
    (mine / "config.json").write_text('{"format": "someone.else"}')  # not the run marker
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", "mine"]
    code, out, err = run_cli([*args, "--overwrite", "--quiet"], monkeypatch, capsys)
    assert code == 1 and out == ""
    assert "was not made by pactl train: not removing it" in one_error(err)
    assert (mine / "sentinel.txt").read_text() == "keep me"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "sentinel.txt").write_text("keep me too")
    (tmp_path / "runs" / "link").symlink_to(elsewhere)
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", "link"]
    code, _, err = run_cli([*args, "--overwrite", "--quiet"], monkeypatch, capsys)
    assert code == 1 and "is a symbolic link" in one_error(err)
    assert (elsewhere / "sentinel.txt").read_text() == "keep me too"


def test_overwrite_replaces_a_run_pactl_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = train_tiny(tmp_path, monkeypatch, capsys)
    assert json.loads((run / "config.json").read_text())["format"] == "pactl.run"  # the marker
    (run / "notes.txt").write_text("inside a run folder: goes with it")
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", "t"]
    code, _, err = run_cli([*args, "--overwrite", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    assert not (run / "notes.txt").exists() and (run / "best.pt").is_file()


# ---------------------------------------------------------------------------- option values

TRAIN_BAD = [
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**64)], "--seed"),
    (["--seed", "abc"], "--seed"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--lr", "0"], "--lr"),
    (["--lr", "-1e-3"], "--lr"),
    (["--image-size", "2"], "--image-size"),
    (["--image-size", "5000"], "--image-size"),
    (["--resize-size", "12"], "--resize-size"),  # below the crop (16)
    (["--sampler", "m_per_class", "--m", "7"], "--m"),  # batch 8
    (["--batch-size", "99999999999999999999"], "--batch-size"),
    (["--batch-size", "1"], "--batch-size"),
    (["--epochs", "0"], "--epochs"),
    (["--epochs", "-2"], "--epochs"),
    (["--epochs", "99999999999999999999"], "--epochs"),
    (["--workers", "-1"], "--workers"),
    (["--workers", "100000"], "--workers"),
    (["--dim", "99999"], "--dim"),
    (["--weight-decay", "nan"], "--weight-decay"),
    (["--proxy-lr-mult", "-1"], "--proxy-lr-mult"),
    (["--alpha", "0"], "--alpha"),
    (["--delta", "inf"], "--delta"),
    (["--warmup-epochs", "-1"], "--warmup-epochs"),
    (["--lr-decay-step", "0"], "--lr-decay-step"),
    (["--lr-decay-gamma", "0"], "--lr-decay-gamma"),
    (["--val-classes", "nan"], "--val-classes"),
    (["--device", "bogus"], "--device"),
    (["--backbone", "googlenet", "--image-size", "8"], "use at least 15"),
    (["--backbone", "bn_inception", "--image-size", "16"], "BN-Inception cannot take"),
    (["--no-such-option"], "--no-such-option"),
]


@pytest.mark.parametrize(("extra", "named"), TRAIN_BAD)
def test_bad_train_option_is_a_usage_error_before_any_run_folder(
    extra: list[str],
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", "r", *extra]
    code, out, err = run_cli([*args, "--quiet"], monkeypatch, capsys)
    assert code == 2 and out == ""
    assert named in one_error(err)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["embed", "IMGS", "--backbone", "small", "--batch-size", "9" * 20], "--batch-size"),
        (["embed", "IMGS", "--backbone", "small", "--workers", "-1"], "--workers"),
        (["embed", "IMGS", "--backbone", "small", "--image-size", "20000"], "--image-size"),
        (["embed", "IMGS", "--backbone", "small", "--image-size", "2"], "--image-size"),
        (["embed", "IMGS", "--backbone", "small", "--device", "cuda:x"], "--device"),
        (["index", "IMGS", "--backbone", "small", "--target-recall", "nan"], "--target-recall"),
        (["index", "IMGS", "--backbone", "small", "--target-recall", "2"], "--target-recall"),
        (["query", "x.png", "--k", "0"], "--k"),
        (["query", "x.png", "--k", "9" * 20], "--k"),
        (["query", "x.png", "--device", "gpu"], "--device"),
        (["eval", "IMGS", "--backbone", "small", "--ks", "0"], "--ks"),
        (["eval", "IMGS", "--backbone", "small", "--ks", "9" * 20], "--ks"),
        (["eval", "IMGS", "--backbone", "small", "--workers", "-1"], "--workers"),
    ],
)
def test_bad_numbers_of_the_other_verbs_are_usage_errors(
    args: list[str],
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_class_folder(tmp_path / "IMGS", classes=2, per_class=2)
    resolved = [str(tmp_path / a) if a == "IMGS" else a for a in args]
    code, out, err = run_cli(resolved, monkeypatch, capsys)
    assert code == 2 and out == ""
    assert named in one_error(err)


# ---------------------------------------------------------------------------- checkpoints

NAN = float("nan")
TAMPERED = [
    (("model_config", "image_size"), 20000, "model_config.image_size"),
    (("model_config", "image_size"), "16", "model_config.image_size"),
    (("model_config", "embedding_dim"), -1, "model_config.embedding_dim"),
    (("model_config", "resize_size"), 4, "model_config.resize_size"),
    (("model_config", "mean"), (0.5, 0.5), "model_config.mean"),
    (("model_config", "mean"), (NAN, 0.5, 0.5), "model_config.mean"),
    (("model_config", "std"), (0.5, 0.0, 0.5), "model_config.std"),
    (("model_config", "backbone"), "nonet", "model_config.backbone"),
    (("model_config", "backbone"), 7, "model_config.backbone"),
    (("model_config", "interpolation"), "magic", "model_config.interpolation"),
    (("model_config", "dimension"), 32, "model_config.dimension"),
    (("model_config",), "not a mapping", "model_config"),
    (("epoch",), -1, "epoch"),
    (("epoch",), "1", "epoch"),
    (("version",), "1", "version"),
    (("version",), 99, "newer pactl"),
    (("kind",), "other", "kind"),
    (("classes",), "ab", "classes"),
    (("metrics",), [1], "metrics"),
    (("model",), {}, "model"),
    (("model", "embedding.weight"), torch.full((16, 128), NAN), "NaN"),
    (("model", "embedding.weight"), torch.zeros(8, 128), "do not fit"),
]


@pytest.mark.parametrize(("where", "value", "named"), TAMPERED)
def test_tampered_checkpoint_is_one_line_naming_file_and_field(
    where: tuple[str, ...],
    value: Any,
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    payload = copy.deepcopy(tiny_checkpoint(tmp_path / "good.pt"))
    parent = payload
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    torch.save(payload, tmp_path / "bad.pt")
    make_class_folder(tmp_path / "imgs", classes=2, per_class=2)
    code, out, err = run_cli(
        ["embed", str(tmp_path / "imgs"), "--checkpoint", str(tmp_path / "bad.pt"), "--quiet"],
        monkeypatch,
        capsys,
    )
    assert code == 1 and out == ""
    line = one_error(err)
    assert str(tmp_path / "bad.pt") in line and named in line
    assert not (tmp_path / "vectors").exists()


def test_tampered_run_config_and_training_state_are_refused_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = train_tiny(tmp_path, monkeypatch, capsys)
    config, state = run / "config.json", run / "checkpoint.pt"
    good_config, good_state = config.read_bytes(), ckpt.load(state)
    resume = ["train", "--resume", str(run), "--epochs", "2", "--quiet"]

    def refused(named: str, file: Path) -> None:
        code, out, err = run_cli(resume, monkeypatch, capsys)
        assert code == 1 and out == ""
        line = one_error(err)
        assert str(file) in line and named in line

    for change, named in [
        (("model_config", "image_size", 20000), "model_config.image_size"),
        (("train_config", "seed", -1), "train_config.seed"),
        (("train_config", "lr", "fast"), "train_config.lr"),
        (("train_config", "loss", "nope"), "train_config.loss"),
        (("train_config", "batch_size", 10**20), "train_config.batch_size"),
        ((None, "version", 99), "newer pactl"),
        ((None, "dataset", 5), "dataset"),
        ((None, "format", "x"), "not a pactl run's config"),
    ]:
        info = json.loads(good_config)
        section, key, value = change
        (info[section] if section else info)[key] = value
        config.write_text(json.dumps(info))
        refused(named, config)
    config.write_text("[]")
    refused("not a pactl run's config", config)
    config.write_bytes(good_config)

    def tampered(edit: Any, named: str) -> None:
        payload = copy.deepcopy(good_state)
        edit(payload)
        torch.save(payload, state)
        refused(named, state)

    tampered(lambda p: p["train_config"].update(lr=NAN), "train_config.lr")
    tampered(lambda p: p["optimizer"]["param_groups"][0].update(lr=NAN), "optimizer lr")
    tampered(lambda p: p.update(proxies={"proxies": torch.zeros(3, 3)}), "proxies")
    tampered(lambda p: p.update(rng={"torch": torch.zeros(3, dtype=torch.uint8)}), "rng")
    tampered(lambda p: p.update(best="x"), "best")
    exp_avg = next(iter(good_state["optimizer"]["state"].values()))["exp_avg"]
    wrong = torch.zeros(exp_avg.numel() + 1)
    tampered(lambda p: next(iter(p["optimizer"]["state"].values())).update(exp_avg=wrong), "shape")
    torch.save(good_state, state)
    code, _, err = run_cli(resume, monkeypatch, capsys)
    assert code == 0, err  # the untouched run resumes


# ---------------------------------------------------------------------------- output paths


def test_outputs_of_the_wrong_kind_are_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tiny_bundle(tmp_path, monkeypatch, capsys)
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("mine")
    vectors = tmp_path / "vec"
    vectors.mkdir()
    (vectors / "vectors.npy").write_bytes(b"")
    (vectors / "meta.json").write_text("{}")
    image, best = str(tmp_path / "imgs" / "class_0" / "0.png"), str(tmp_path / "best.pt")
    cases = [
        (["query", image, "--index", str(bundle), "--grid", "a_folder"], "is a folder"),
        (["eval", str(tmp_path / "imgs"), "--checkpoint", best, "--report", "a_folder"],
         "is a folder"),
        (["embed", str(tmp_path / "imgs"), "--checkpoint", best, "--out", "a_file"],
         "is a file, not a folder"),
        (["embed", str(tmp_path / "imgs"), "--checkpoint", best, "--out", "a_file/v"],
         "is not a folder"),
        (["index", str(vectors), "--out", str(vectors)], "would overwrite its own input"),
        (["index", str(vectors), "--out", "vec/inside"], "would overwrite its own input"),
        (["index", str(vectors), "--out", "vec/../vec/"], "would overwrite its own input"),
    ]  # fmt: skip
    for args, message in cases:
        code, out, err = run_cli([*args, "--quiet"], monkeypatch, capsys)
        assert code == 2 and out == "", args
        assert message in one_error(err), args
    assert (tmp_path / "a_file").read_text() == "mine"
    assert sorted(p.name for p in vectors.iterdir()) == ["meta.json", "vectors.npy"]
    assert (vectors / "meta.json").read_text() == "{}"


def test_a_grid_replaces_a_file_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--grid named like an existing image (one of the indexed ones, even) leaves it alone
    without --overwrite, as eval --report does."""
    bundle = tiny_bundle(tmp_path, monkeypatch, capsys)
    image, indexed = (tmp_path / "imgs" / f"class_{c}" / "0.png" for c in (0, 1))
    before = indexed.read_bytes()
    query = ["query", str(image), "--index", str(bundle), "--format", "csv", "-q"]
    code, out, err = run_cli([*query, "--grid", str(indexed)], monkeypatch, capsys)
    assert (code, out) == (1, "") and "exists; pass --overwrite" in one_error(err)
    assert indexed.read_bytes() == before
    code, out, err = run_cli([*query, "--grid", "g.png", "--overwrite"], monkeypatch, capsys)
    assert code == 0 and (tmp_path / "g.png").stat().st_size > 0, err
    code, _, err = run_cli([*query, "--grid", "g.png", "--overwrite"], monkeypatch, capsys)
    assert code == 0, err


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A read-only tmpfs: writes fail with EROFS for root too (root ignores chmod 555)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only_mount(
        ["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"], folder, "mount a read-only tmpfs"
    ):
        yield folder


def output_cases(
    tmp_path: Path,
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> list[list[str]]:
    """Each verb writing into `folder`: embed and index a folder, a query's grid, a report."""
    bundle = tiny_bundle(tmp_path, monkeypatch, capsys)
    image, best = str(tmp_path / "imgs" / "class_0" / "0.png"), str(tmp_path / "best.pt")
    return [
        ["embed", str(tmp_path / "imgs"), "--checkpoint", best, "--out", str(folder / "v")],
        ["index", str(tmp_path / "imgs"), "--checkpoint", best, "--out", str(folder / "b")],
        ["eval", str(tmp_path / "imgs"), "--checkpoint", best, "--report", str(folder / "e.csv")],
        ["query", image, "--index", str(bundle), "--grid", str(folder / "grid.png")],
    ]


def test_read_only_output_folders_are_one_line(
    read_only_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for args in output_cases(tmp_path, read_only_dir, monkeypatch, capsys):
        code, out, err = run_cli([*args, "--quiet"], monkeypatch, capsys)
        assert code == 1 and out == "", args
        assert "Read-only file system" in one_error(err), args
    monkeypatch.setenv("PACTL_RUNS", str(read_only_dir / "runs"))
    code, _, err = run_cli(
        ["train", str(tmp_path / "imgs"), *TINY, "--val-classes", "0", "--quiet"],
        monkeypatch,
        capsys,
    )
    assert code == 1 and "cannot write run folder" in one_error(err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 555 folder regardless")
def test_chmod_555_output_folders_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        for args in output_cases(tmp_path, locked, monkeypatch, capsys):
            code, out, err = run_cli([*args, "--quiet"], monkeypatch, capsys)
            assert code == 1 and "Permission denied" in one_error(err), args
    finally:
        locked.chmod(0o755)


def test_a_report_that_fails_at_write_time_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The folder was writable when checked and is not by the end (as for root, whom chmod
    does not stop): the write's own error is one line too."""
    import pactl.cli.eval

    def denied(path: Path, *args: Any) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    tiny_checkpoint(tmp_path / "best.pt")
    monkeypatch.setattr(pactl.cli.eval, "write_report", denied)
    args = ["eval", str(tmp_path / "imgs"), "--checkpoint", str(tmp_path / "best.pt")]
    code, out, err = run_cli([*args, "--quiet"], monkeypatch, capsys)
    assert code == 1 and out == ""
    assert "cannot write eval.csv (Permission denied)" in one_error(err)


def test_eval_report_is_written_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    tiny_checkpoint(tmp_path / "best.pt")
    (tmp_path / "eval.csv").write_text("the previous report\n")
    args = ["eval", str(tmp_path / "imgs"), "--checkpoint", str(tmp_path / "best.pt")]
    code, _, err = run_cli([*args, "--quiet", "--overwrite"], monkeypatch, capsys)
    assert code == 0, err
    assert read_csv(tmp_path / "eval.csv")[0]["dataset"] == str(tmp_path / "imgs")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


# ---------------------------------------------------------------------------- standard streams


@pytest.fixture
def bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Path:
    """A tiny bundle of 8 images, built from an untrained TINY network (no training)."""
    return tiny_bundle(tmp_path, monkeypatch, capsys)


def shell(script: str, bundle: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """`script` under sh with $PACTL running this Python's pactl and $B the bundle."""
    env = {**os.environ, "PACTL": f"{sys.executable} -m pactl", "B": str(bundle)}
    return subprocess.run(
        ["sh", "-c", script],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=bundle.parent,
        timeout=120,
    )


def test_stdout_on_a_full_device_is_one_line(bundle: Path) -> None:
    for fmt in ("jsonl", "csv", "table"):
        done = shell(f"$PACTL query imgs --index $B --format {fmt} > /dev/full", bundle)
        assert done.returncode == 1, done.stderr
        line = one_error(done.stderr.decode())
        assert "cannot write to standard output (No space left on device)" in line


def test_closed_stdout_and_closed_stdin_are_one_line(bundle: Path) -> None:
    done = shell("$PACTL query imgs/class_0/0.png --index $B >&-", bundle)
    assert done.returncode == 1
    assert "standard output is closed" in one_error(done.stderr.decode())
    done = shell("$PACTL query - --index $B <&-", bundle)
    assert done.returncode == 2
    assert "standard input, which is closed" in one_error(done.stderr.decode())


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "table"])
def test_a_reader_that_goes_away_ends_the_query_quietly(bundle: Path, fmt: str) -> None:
    # 320 queries of 8 hits: far more than a pipe holds, so writes meet the pipe that head
    # closed. rich's own handler would exit 1 for the table.
    folders = " ".join(["imgs"] * 40)
    query = f"$PACTL query {folders} --index $B --k 8 --quiet --format {fmt}"
    script = f'{{ {query}; echo "rc=$?" >&2; }} | head -1'
    done = shell(script, bundle)
    first = done.stdout.decode()
    assert first.strip(), "head saw no output"
    if fmt == "jsonl":
        assert json.loads(first)["rank"] == 1
    err = done.stderr.decode()
    assert err.strip().splitlines() == ["rc=0"], err  # nothing else: no traceback, no warning


def test_query_names_on_stdin_that_are_not_utf8(bundle: Path) -> None:
    odd = bundle.parent / os.fsdecode(b"imgs/caf\xe9.png")
    shutil.copy(bundle.parent / "imgs" / "class_0" / "0.png", odd)
    # PYTHONIOENCODING: text stdin decodes strictly, as under a UTF-8 locale on most machines.
    script = "PYTHONIOENCODING=utf-8 $PACTL query - --index $B --k 1 --format jsonl"
    done = shell(script, bundle, b"imgs/caf\xe9.png\n")
    assert done.returncode == 0, done.stderr
    (row,) = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert os.fsencode(row["query"]) == b"imgs/caf\xe9.png" and row["score"] > 0.99


def test_click_usage_errors_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, named in [
        (["query"], "give query images"),
        (["no-such-verb"], "No such command"),
        (["query", "x.png", "--format", "xml"], "--format"),
    ]:
        code, out, err = run_cli(args, monkeypatch, capsys)
        assert code == 2 and out == ""
        assert named in one_error(err)


# ---------------------------------------------------------------------------- a full disk


def test_train_on_a_real_full_disk(
    full_disk: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = full_disk / "runs"
    monkeypatch.setenv("PACTL_RUNS", str(runs))
    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    train = ["train", str(tmp_path / "imgs"), *TINY, "--val-classes", "0", "--quiet"]
    code, _, err = run_cli([*train, "--epochs", "1", "--name", "f"], monkeypatch, capsys)
    assert code == 0, err
    run = runs / "f"
    files = sorted(p.name for p in run.iterdir())
    before = (run / "checkpoint.pt").read_bytes()
    # Full to the last byte, then with room for the small files but not a checkpoint's copy.
    for leave in (0, 64 * 1024, 600 * 1024):
        fill(full_disk, leave=leave)
        resume = ["train", "--resume", str(run), "--epochs", "3", "--quiet"]
        code, out, err = run_cli(resume, monkeypatch, capsys)
        assert code == 1 and out == "", (leave, err)
        assert "no space left on the device" in one_error(err)
        assert (run / "checkpoint.pt").read_bytes() == before
        assert sorted(p.name for p in run.iterdir()) == files  # no temporary file left
        assert [r["epoch"] for r in read_csv(run / "metrics.csv")][:2] == ["0", "1"]
        (full_disk / ".filler").unlink()
    fill(full_disk)
    code, out, err = run_cli([*train, "--epochs", "1", "--name", "new"], monkeypatch, capsys)
    assert code == 1 and "no space left on the device" in one_error(err)
    assert sorted(p.name for p in runs.iterdir()) == ["f"]  # the new run's empty folder went
    assert math.isfinite(ckpt.load(run / "checkpoint.pt")["metrics"]["loss"])


def test_a_factory_faiss_cannot_parse_is_a_usage_error_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tiny_bundle(tmp_path, monkeypatch, capsys)
    vectors = str(bundle / "vectors") if (bundle / "vectors").exists() else str(bundle)
    for factory, words in (("bogus", "cannot parse the factory 'bogus'"), ("HNSW0", "HNSW0")):
        args = ["index", vectors, "--factory", factory, "--out", "fresh"]
        code, out, err = run_cli(args, monkeypatch, capsys)
        line = one_error(err)
        assert (code, out) == (2, "") and words in line and "index_factory" not in line, line
        assert not (tmp_path / "fresh").exists()


def test_a_wrong_ks_is_named_before_an_existing_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_bundle(tmp_path, monkeypatch, capsys)
    (tmp_path / "r.csv").write_text("mine")
    args = ["eval", str(tmp_path / "imgs"), "--checkpoint", str(tmp_path / "best.pt")]
    code, _, err = run_cli([*args, "--ks", "0", "--report", "r.csv"], monkeypatch, capsys)
    assert code == 2 and "--ks" in one_error(err)
