"""Honest learning: epoch 0, validation classes choosing best.pt, no silent collapse, and the
pretrained baseline (`--backbone` instead of `--checkpoint`) against an independent reference."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, make_class_folder, run_cli
from PIL import Image

from pactl import checkpoint as ckpt
from pactl.config import TrainConfig
from pactl.datasets import manifest_from_folder
from pactl.training.epoch_records import health_warnings
from pactl.training.evaluation import mean_pairwise_cosine
from pactl.training.splits import check_splits, hold_out_classes


def read_metrics(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


# --- validation classes -------------------------------------------------------------------


def test_validation_classes_are_disjoint_from_train_and_test(tmp_path: Path) -> None:
    manifest = manifest_from_folder(make_class_folder(tmp_path / "imgs", classes=20, per_class=2))
    splits = check_splits(manifest, TrainConfig(batch_size=4, val_classes=0.2))
    train, val, test = (set(p.labels.tolist()) for p in (splits.train, splits.val, splits.test))
    assert len(train) + len(val) == 10 and len(test) == 10  # folders: half the classes test
    assert len(val) == 2  # 0.2 x 10 train classes
    assert not train & val and not train & test and not val & test
    assert set(splits.val.splits) == {"val"}
    again = check_splits(manifest, TrainConfig(batch_size=4, val_classes=0.2))
    assert set(again.val.labels.tolist()) == val  # seeded: the same classes every time
    other = check_splits(manifest, TrainConfig(batch_size=4, val_classes=0.2, seed=7))
    assert set(other.val.labels.tolist()) != val or len(val) == 10


def test_a_manifest_val_split_is_used_as_it_is(tmp_path: Path) -> None:
    make_class_folder(tmp_path / "imgs", classes=6, per_class=2)
    rows = ["path,label,split"]
    for c, split in enumerate(["train", "train", "val", "val", "test", "test"]):
        rows += [f"imgs/class_{c}/{n}.png,{c},{split}" for n in range(2)]
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    from pactl.datasets import read_manifest

    splits = check_splits(read_manifest(tmp_path / "m.csv"), TrainConfig(batch_size=2))
    assert set(splits.val.labels.tolist()) == {2, 3} and set(splits.train.labels.tolist()) == {0, 1}


def test_too_few_classes_hold_nothing_out(tmp_path: Path) -> None:
    manifest = manifest_from_folder(make_class_folder(tmp_path / "imgs", classes=6, per_class=2))
    train = manifest.select("train")  # 3 classes: 2 held out would leave 1 to learn from
    kept, val = hold_out_classes(train, 0.15, seed=0)
    assert len(kept) == len(train) and len(val) == 0


def test_validation_chooses_best_pt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=16, per_class=4)
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "3", "--name", "v"]
    code, out, err = run_cli([*args, "--lr", "3e-2"], monkeypatch, capsys)
    assert code == 0, err
    run = tmp_path / "runs" / "v"
    rows = read_metrics(run)
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3]
    assert {"val_recall@1", "val_map@r", "recall@1", "mean_cos"} <= set(rows[0])
    val = [(float(r["val_recall@1"]), float(r["val_map@r"])) for r in rows]
    chosen = max(range(len(val)), key=lambda e: (val[e], e))  # Recall@1, MAP@R, the later

    best = ckpt.load(run / "best.pt")
    assert best["epoch"] == chosen
    assert best["metrics"]["val_recall@1"] == pytest.approx(val[chosen][0], abs=1e-5)
    assert f"best epoch {chosen} (by validation Recall@1, then MAP@R)" in out
    assert "recipe: small (random weights) at 16 px" in err
    assert "best.pt chosen by validation Recall@1" in err and "per epoch" in err
    config = json.loads((run / "config.json").read_text())
    assert config["train_config"]["selection"] == "val"
    # The split is on record in the run folder, and reads back as the same split.
    from pactl.datasets import read_manifest

    written = read_manifest(run / "split.csv")
    assert len(written) == 64 and set(written.splits) == {"train", "val", "test"}
    trained = manifest_from_folder(tmp_path / "imgs")
    where = dict(zip(map(str, trained.files()), trained.splits, strict=True))
    for path, split in zip(written.paths, written.splits, strict=True):
        assert where[path] == (split if split != "val" else "train")


def test_validation_and_test_disagreeing_beyond_sampling_error_is_said(tmp_path: Path) -> None:
    from pactl.training.splits import disagreement

    manifest = manifest_from_folder(make_class_folder(tmp_path / "imgs", classes=20, per_class=5))
    splits = check_splits(manifest, TrainConfig(batch_size=4, val_classes=0.2))
    assert (len(splits.val), len(splits.test)) == (10, 50)
    # Hand-computed: sqrt(.9 x .1 / 10 + .5 x .5 / 50) = 0.1183; 2 sigma = 0.237 < 0.4.
    line = disagreement({"val_recall@1": 0.9, "recall@1": 0.5}, splits)
    assert line is not None and "0.900 (10 images)" in line and "(0.237)" in line
    # 0.21 apart is within 2 sigma (sqrt(.7 x .3 / 10 + .49 x .51 / 50) = 0.1612 -> 0.322).
    assert disagreement({"val_recall@1": 0.7, "recall@1": 0.49}, splits) is None
    assert disagreement({"recall@1": 0.5}, splits) is None  # no validation classes


def test_a_saturated_validation_recall_leaves_the_choice_to_map_r(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two validation classes are often all right from the start (Recall@1 1.0 at every epoch,
    epoch 0 included): best.pt then goes to the epoch with the best validation MAP@R, not to
    the untrained network, and the curves (reading metrics.csv) mark that same epoch."""
    from types import SimpleNamespace

    from pactl.config import ModelConfig
    from pactl.console import QUIET
    from pactl.model import build_model
    from pactl.runs import best_epoch, metric_columns, read_metrics
    from pactl.training import epoch_records as train
    from pactl.training.trainer import RunFolder, RunState

    monkeypatch.setattr(train, "save_state", lambda *args: None)  # checkpoint.pt: not this test
    model_cfg = ModelConfig(backbone="small", weights="none", image_size=16, resize_size=16)
    net, model_cfg = build_model(model_cfg)
    t = SimpleNamespace(
        cfg=TrainConfig(epochs=4, selection="val"), model=net, model_cfg=model_cfg, writer=None,
        state=RunState(),
    )  # fmt: skip
    columns = metric_columns(TrainConfig(eval_ks=(1,)), with_val=True)

    def run(folder: Path, val_map: list[float]) -> int:
        folder.mkdir()
        t.state = state = RunState()
        run = RunFolder(folder, "data", None, columns, ["a", "b"])  # type: ignore[arg-type]
        kept = None
        for epoch, m in enumerate(val_map):
            row = {"epoch": epoch, "recall@1": 0.8 + epoch / 100, "map@r": 0.3, "nmi": 0.5}
            row.update({"val_recall@1": 1.0, "val_map@r": m, "mean_cos": 0.5, "seconds": 1.0})
            vectors = (np.full((2, 2), epoch), np.arange(2))  # this epoch's evaluation's
            if train.record_epoch(t, run, row, QUIET):  # as the loop keeps best.pt's vectors
                kept = vectors
            assert state.last == {k: v for k, v in row.items() if k != "epoch"}
        assert state.start["val_map@r"] == val_map[0]  # epoch 0's row: what warnings hold to
        assert ckpt.load(folder / "best.pt")["epoch"] == state.best.epoch
        # best.pt's calibration reads the vectors of the epoch best.pt holds
        assert kept is not None and kept[0][0, 0] == state.best.epoch
        assert best_epoch(read_metrics(folder / "metrics.csv"), "val") == state.best.epoch
        return state.best.epoch

    assert run(tmp_path / "a", [0.55, 0.70, 0.87, 0.80, 0.86]) == 2
    # MAP@R saturated too: validation cannot choose, and the tie goes to the last epoch
    assert run(tmp_path / "b", [1.0] * 5) == 4


def test_paper_presets_keep_the_paper_protocol(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("cub200", "cars196", "sop", "inshop"):
        code, out, _ = run_cli(["train", name, "--print-config"], monkeypatch, capsys)
        shown = json.loads(out)["train"]
        assert code == 0
        assert (shown["selection"], shown["val_classes"], shown["epochs"]) == ("test", 0.0, 60)
        assert shown["amp"] == "none"  # the paper trains in float32
    # classes held out on request are there to choose best.pt, whatever the preset chose
    for name in ("cars196", "digits"):
        args = ["train", name, "--val-classes", "0.2", "--print-config"]
        code, out, _ = run_cli(args, monkeypatch, capsys)
        shown = json.loads(out)
        assert code == 0 and shown["train"]["selection"] == "val", name
        assert any("--val-classes" in line for line in shown["why"])


def test_user_data_on_a_cpu_gets_the_cpu_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    code, out, _ = run_cli(["train", str(tmp_path / "imgs"), "--print-config"], monkeypatch, capsys)
    shown = json.loads(out)
    assert code == 0
    assert shown["model"]["backbone"] == "timm:efficientnet_lite0"
    assert shown["model"]["image_size"] == 128 and shown["model"]["resize_size"] == 146
    assert shown["model"]["interpolation"] == "bicubic"  # the weights' own filter
    assert shown["train"]["selection"] == "val" and shown["train"]["val_classes"] == 0.15
    assert "CPU" in shown["why"][0]


def test_user_data_from_random_weights_on_a_cpu_gets_the_from_scratch_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--weights none on a CPU: ResNet-18 at 64 px on whole images mirrored, a constant rate (the
    pretrained recipe's network and crops measured far worse from random weights); an option
    given still wins, and a dataset's own preset stays its own."""
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2, size=40)
    imgs = str(tmp_path / "imgs")
    code, out, _ = run_cli(
        ["train", imgs, "--weights", "none", "--print-config"], monkeypatch, capsys
    )
    shown = json.loads(out)
    assert code == 0 and "from random weights" in shown["why"][0]
    model, train = shown["model"], shown["train"]
    assert (model["backbone"], model["image_size"], model["resize_size"]) == ("resnet18", 64, 64)
    assert (train["augment"], train["lr"], train["batch_size"]) == ("flip", 1e-3, 128)
    assert train["lr_decay_step"] > train["epochs"]  # constant
    assert any("constant lr" in w for w in shown["why"])
    assert any("resized whole to 64 px" in w for w in shown["why"])
    asked = ["train", imgs, "--weights", "none", "--backbone", "timm:efficientnet_lite0",
             "--image-size", "96", "--augment", "light", "--print-config"]  # fmt: skip
    code, out, _ = run_cli(asked, monkeypatch, capsys)
    model, train = json.loads(out)["model"], json.loads(out)["train"]
    assert (model["backbone"], model["image_size"], model["resize_size"]) == (
        "timm:efficientnet_lite0", 96, 96,
    )  # fmt: skip
    assert train["augment"] == "light"
    code, out, _ = run_cli(
        ["train", imgs, "--weights", "imagenet", "--print-config"], monkeypatch, capsys
    )
    shown = json.loads(out)
    assert shown["model"]["backbone"] == "timm:efficientnet_lite0"
    assert (shown["train"]["augment"], shown["train"]["crop_scale"]) == ("rrc_flip", 1.0)
    assert any("whole images" in w and "mirrored" in w for w in shown["why"])
    code, out, _ = run_cli(
        ["train", "digits", "--weights", "none", "--print-config"], monkeypatch, capsys
    )
    assert json.loads(out)["model"]["backbone"] == "small"  # the dataset's preset


def test_small_images_from_random_weights_get_the_small_cnn_at_their_own_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Images of at most 32 px (by the median short side of the training images) get the small
    CNN at that side from random weights, the rest of the recipe unchanged; larger ones keep
    ResNet-18 at 64 px, and pretrained weights keep their own recipe whatever the size."""
    from pactl.console import QUIET
    from pactl.datasets import load_source, typical_side

    # 9 training images: short sides 20 (x4), 28 (x3: 28x28, 28x50, 60x28), 40 (x2), median 28;
    # a 10th that does not read, and 5 test images of 100 px that are not looked at
    sizes = [(20, 20)] * 4 + [(28, 28), (28, 50), (60, 28)] + [(40, 40)] * 2 + [(100, 100)] * 5
    rows = []
    for i, (w, h) in enumerate(sizes):
        (tmp_path / "imgs" / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (w, h), (i * 15, 0, 0)).save(tmp_path / "imgs" / f"c{i % 3}" / f"{i}.png")
        rows.append(f"imgs/c{i % 3}/{i}.png,{i % 3},{'train' if i < 9 else 'test'}")
    (tmp_path / "imgs" / "broken.png").write_bytes(b"not an image")
    rows.insert(9, "imgs/broken.png,0,train")
    (tmp_path / "data.csv").write_text("path,label,split\n" + "\n".join(rows) + "\n")
    manifest = load_source(str(tmp_path / "data.csv"), QUIET)
    assert typical_side(manifest) == 28
    assert typical_side(manifest, sample=2) == 20  # rows 0 and 9, which fails

    def shown(*extra: str) -> dict:
        args = ["train", str(tmp_path / "data.csv"), "--weights", "none", *extra]
        code, out, err = run_cli([*args, "--print-config"], monkeypatch, capsys)
        assert code == 0, err
        return json.loads(out)

    small = shown()
    model, train = small["model"], small["train"]
    assert (model["backbone"], model["image_size"], model["resize_size"]) == ("small", 28, 28)
    assert (train["augment"], train["lr"], train["batch_size"], train["epochs"]) == (
        "flip", 1e-3, 128, 36,
    )  # fmt: skip
    assert "images of 28 px" in small["why"][0]
    asked = shown("--backbone", "resnet18")["model"]
    assert (asked["backbone"], asked["image_size"]) == ("resnet18", 28)  # the images' own side
    make_class_folder(tmp_path / "big", classes=4, per_class=2, size=33)
    code, out, _ = run_cli(
        ["train", str(tmp_path / "big"), "--weights", "none", "--print-config"], monkeypatch, capsys
    )
    assert (json.loads(out)["model"]["backbone"], json.loads(out)["model"]["image_size"]) == (
        "resnet18", 64,
    )  # fmt: skip
    code, out, _ = run_cli(
        ["train", str(tmp_path / "data.csv"), "--print-config"], monkeypatch, capsys
    )
    assert json.loads(out)["model"]["backbone"] == "timm:efficientnet_lite0"


# --- no silent collapse -------------------------------------------------------------------


def test_mean_pairwise_cosine_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 8)) + 2.0
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    gram = x @ x.T
    want = (gram.sum() - np.trace(gram)) / (37 * 36)
    assert mean_pairwise_cosine(x.astype(np.float32)) == pytest.approx(want, abs=1e-6)
    same = np.tile(x[:1], (5, 1))
    assert mean_pairwise_cosine(same) == pytest.approx(1.0, abs=1e-9)


def test_health_warnings_name_a_fall_and_a_collapse() -> None:
    start = {"recall@1": 0.6, "val_recall@1": 0.5, "mean_cos": 0.3}
    assert health_warnings({"epoch": 2, "recall@1": 0.5, "mean_cos": 0.4}, start) == []
    fell = health_warnings({"epoch": 2, "val_recall@1": 0.2, "recall@1": 0.5}, start)
    assert len(fell) == 1 and "val_recall@1 fell to 0.2000 from 0.5000" in fell[0]
    collapsed = health_warnings({"epoch": 2, "recall@1": 0.0, "mean_cos": 0.99}, start)
    assert "fell to 0.0000" in collapsed[0] and "collapsed" in collapsed[1]
    assert health_warnings({"epoch": 0, "recall@1": 0.0, "mean_cos": 0.99}, start) == []
    # A random network starts with every embedding alike; spreading them out is no collapse.
    random_start = {"recall@1": 0.1, "mean_cos": 0.97}
    assert health_warnings({"epoch": 1, "recall@1": 0.2, "mean_cos": 0.93}, random_start) == []
    assert "collapsed" in health_warnings({"epoch": 1, "mean_cos": 0.98}, random_start)[0]
    # close together but retrieving better (MAP@R up): training is working, no collapse
    learning = {"epoch": 1, "mean_cos": 0.984, "recall@1": 0.83, "map@r": 0.38}
    assert health_warnings(learning, {**random_start, "recall@1": 0.75, "map@r": 0.22}) == []
    assert "collapsed" in health_warnings(learning, {**random_start, "map@r": 0.38})[0]


def test_from_scratch_batchnorm_trains_and_does_not_collapse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--weights none with the defaults: BatchNorm statistics move; Recall@1 holds or grows."""
    make_class_folder(tmp_path / "imgs", classes=8, per_class=8)
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "3", "--name", "s"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    run = tmp_path / "runs" / "s"
    assert json.loads((run / "config.json").read_text())["train_config"]["freeze_bn"] is False
    rows = read_metrics(run)
    assert float(rows[-1]["recall@1"]) >= float(rows[0]["recall@1"])
    assert float(rows[-1]["mean_cos"]) < 0.9
    assert "collapsed" not in err and "fell to" not in err
    state = ckpt.load(run / "checkpoint.pt")["model"]
    assert not torch.equal(state["backbone.1.running_mean"], torch.zeros(16))  # it moved


def test_a_collapse_is_reported_on_the_epoch_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A collapsed embedding (mean pairwise cosine near 1) is named, even with --quiet."""
    make_class_folder(tmp_path / "imgs", classes=8, per_class=4)
    monkeypatch.setattr(
        "pactl.training.evaluation.mean_pairwise_cosine", lambda v: 0.97 if len(v) else float("nan")
    )
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "1", "--name", "c", "--quiet"]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert "warning: epoch 1: the embeddings have collapsed (mean pairwise cosine 0.970)" in err


# --- the pretrained baseline: --backbone instead of --checkpoint ---------------------------


def _weights_file(tmp_path: Path) -> Path:
    from pactl.backbones import build_backbone

    torch.manual_seed(11)
    module = build_backbone("small", "none").module
    path = tmp_path / "small.pth"
    torch.save(module.state_dict(), path)
    return path


def _pooled_reference(files: list[Path], weights: Path) -> np.ndarray:
    """GAP + GMP of the backbone's feature map, L2-normalised, in float64, written out here."""
    from PIL import Image

    from pactl.backbones import build_backbone

    module = build_backbone("small", str(weights)).module.eval().double()
    rows = []
    for f in files:
        pixels = np.asarray(Image.open(f).convert("RGB").resize((16, 16)), dtype=np.float64)
        x = torch.from_numpy((pixels / 255 - 0.5) / 0.5).permute(2, 0, 1)[None]
        with torch.no_grad():
            fmap = module(x)[0]  # (C, h, w)
        pooled = fmap.mean(dim=(1, 2)) + fmap.amax(dim=(1, 2))
        rows.append((pooled / pooled.norm()).numpy())
    return np.stack(rows)


def test_backbone_baseline_embed_index_query_and_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    images = make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    weights = _weights_file(tmp_path)
    base = [
        "--backbone",
        "small",
        "--weights",
        str(weights),
        "--image-size",
        "16",
        "--resize-size",
        "16",
    ]
    code, _, err = run_cli(
        ["embed", str(images), *base, "--out", str(tmp_path / "vec"), "-q"], monkeypatch, capsys
    )
    assert code == 0, err
    vectors = np.load(tmp_path / "vec" / "vectors.npy")
    meta = json.loads((tmp_path / "vec" / "meta.json").read_text())
    files = sorted(images.rglob("*.png"))
    want = _pooled_reference(files, weights)
    assert vectors.shape == (16, 128) and meta["checkpoint"] is None
    np.testing.assert_allclose(vectors, want, atol=2e-5)

    code, _, err = run_cli(["index", str(tmp_path / "vec"), "-q"], monkeypatch, capsys)
    assert code == 0, err
    code, out, err = run_cli(
        ["query", str(files[0]), "--index", "index", "--k", "3", "-f", "jsonl"], monkeypatch, capsys
    )
    assert code == 0, err
    hits = [json.loads(line) for line in out.splitlines()]
    order = np.argsort(-(want @ want[0]), kind="stable")[:3]
    assert [h["path"] for h in hits] == [str(files[i]) for i in order]

    # Other weights under the same file name: the bundle refuses them.
    torch.save({k: v + 1 for k, v in torch.load(weights).items()}, weights)
    code, _, err = run_cli(["query", str(files[0]), "--index", "index"], monkeypatch, capsys)
    assert code == 1 and "is not the network that made these vectors" in err


def test_backbone_baseline_eval_matches_brute_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    images = make_class_folder(tmp_path / "imgs", classes=6, per_class=5, seed=3)
    weights = _weights_file(tmp_path)
    code, out, err = run_cli(
        ["eval", str(images), "--backbone", "small", "--weights", str(weights),
         "--image-size", "16", "--resize-size", "16", "--ks", "1,2", "--report", "r.csv", "-q"],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0, err
    test = manifest_from_folder(images).select("test")
    v = _pooled_reference(test.files(), weights)
    sims = v @ v.T
    np.fill_diagonal(sims, -np.inf)
    nearest = np.argsort(-sims, axis=1, kind="stable")
    same = test.labels[nearest] == test.labels[:, None]
    shown = dict(line.split() for line in out.splitlines())
    assert float(shown["recall@1"]) == pytest.approx(same[:, 0].mean(), abs=1e-4)
    assert float(shown["recall@2"]) == pytest.approx(same[:, :2].any(axis=1).mean(), abs=1e-4)
    with open(tmp_path / "r.csv", newline="") as f:
        (report,) = list(csv.DictReader(f))  # the comma in the description is quoted
    assert report["checkpoint"] == f"small (weights {weights}, no training)"
    assert float(report["recall@1"]) == pytest.approx(same[:, 0].mean(), abs=1e-4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint", "X.pt", "--backbone", "small"], "not both"),
        (["--weights", "imagenet"], "go with --backbone"),
        ([], "give --checkpoint"),
        (["--backbone", "nonet"], "unknown backbone"),
    ],
)
def test_backbone_or_checkpoint_is_a_usage_error(
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    torch.save({}, tmp_path / "X.pt")
    resolved = [str(tmp_path / a) if a == "X.pt" else a for a in args]
    code, out, err = run_cli(["embed", str(tmp_path / "imgs"), *resolved], monkeypatch, capsys)
    assert code == 2 and out == "" and message in err, err


def test_from_random_weights_bn_trains_and_no_warm_up_unless_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_class_folder(tmp_path / "imgs", classes=4, per_class=2)
    base = ["train", "cars196", "--weights", "none", "--print-config"]
    code, out, _ = run_cli(base, monkeypatch, capsys)
    shown = json.loads(out)
    assert code == 0
    assert (shown["train"]["freeze_bn"], shown["train"]["warmup_epochs"]) == (False, 0)
    assert any("random weights need statistics that move" in w for w in shown["why"])
    asked = [*base, "--freeze-bn", "--warmup-epochs", "2", "--augment", "light"]
    code, out, _ = run_cli(asked, monkeypatch, capsys)
    shown = json.loads(out)["train"]
    assert (shown["freeze_bn"], shown["warmup_epochs"], shown["augment"]) == (True, 2, "light")


def test_random_batchnorm_statistics_are_calibrated_before_epoch_0(tmp_path: Path) -> None:
    """From random weights, epoch 0 sees BatchNorm statistics of the training data (the
    average over a few batches), not the (0, 1) the layers are born with."""
    from pactl.config import ModelConfig
    from pactl.loaders import loader_for
    from pactl.training.distributed import World
    from pactl.training.start import calibrate_batchnorm
    from pactl.training.trainer import build_trainer

    make_class_folder(tmp_path / "imgs", classes=6, per_class=4)
    train = manifest_from_folder(tmp_path / "imgs").select("train")
    model_cfg = ModelConfig("small", "none", embedding_dim=8, image_size=16, resize_size=16)
    cfg = TrainConfig(batch_size=4, workers=0, channels_last=False)
    t = build_trainer(model_cfg, cfg, num_classes=3, world=World())
    calibrate_batchnorm(t, train, batches=2)
    bn = t.net.backbone[1]
    assert bn.momentum == 0.1  # restored
    conv = t.net.backbone[0].double()
    means, variances = [], []
    loader = loader_for(train.files()[:8], None, t.model_cfg, 4, 0, torch.device("cpu"))
    with torch.no_grad():
        for batch in loader:
            out = conv(batch.images.double())  # (4, 16, 16, 16)
            means.append(out.mean(dim=(0, 2, 3)))
            variances.append(out.var(dim=(0, 2, 3), unbiased=True))
    torch.testing.assert_close(
        bn.running_mean.double(), torch.stack(means).mean(0), atol=1e-5, rtol=1e-4
    )
    torch.testing.assert_close(
        bn.running_var.double(), torch.stack(variances).mean(0), atol=1e-5, rtol=1e-4
    )
