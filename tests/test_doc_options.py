"""Options docs/cli.md and docs/training.md name that no other test exercised, each held to the
effect its help or its sentence promises (the resolved setting, and what it does to the run)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TINY, make_class_folder, run_cli

from pactl import checkpoint as ckpt


def tiny_train(name: str, monkeypatch: Any, capsys: Any, *extra: str) -> Path:
    """One epoch of the TINY network on imgs/ (made once per test folder): the run folder."""
    if not Path("imgs").is_dir():
        make_class_folder(Path("imgs"), classes=6, per_class=4)
    args = ["train", "imgs", *TINY, "--epochs", "1", "--name", name, "--quiet", *extra]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    return Path("runs") / name


def shown_train(monkeypatch: Any, capsys: Any, *extra: str) -> dict[str, Any]:
    """`pactl train imgs TINY EXTRA --print-config`'s train settings."""
    if not Path("imgs").is_dir():
        make_class_folder(Path("imgs"), classes=6, per_class=4)
    code, out, err = run_cli(
        ["train", "imgs", *TINY, *extra, "--print-config"], monkeypatch, capsys
    )
    assert code == 0, err
    return dict(json.loads(out)["train"])


def run_settings(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "config.json").read_text())["train_config"])


def batchnorm_buffers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if k.endswith(("running_mean", "running_var"))}


def test_freeze_bn_keeps_pretrained_statistics_and_no_freeze_bn_trains_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/cli.md, train: "`--freeze-bn/--no-freeze-bn` (default: frozen for pretrained
    weights, training with `--weights none`)". A weights file whose BatchNorm statistics are
    marked (mean 0.25, variance 2): frozen, the run's checkpoint holds them as they were;
    with --no-freeze-bn they moved."""
    from pactl.backbones import build_backbone

    torch.manual_seed(3)
    backbone = build_backbone("small", "none").module
    for name, buffer in backbone.named_buffers():
        if name.endswith("running_mean"):
            buffer.fill_(0.25)
        elif name.endswith("running_var"):
            buffer.fill_(2.0)
    torch.save(backbone.state_dict(), tmp_path / "w.pth")
    weights = ["--weights", str(tmp_path / "w.pth")]
    assert shown_train(monkeypatch, capsys, *weights)["freeze_bn"] is True
    assert shown_train(monkeypatch, capsys, *weights, "--no-freeze-bn")["freeze_bn"] is False
    assert shown_train(monkeypatch, capsys)["freeze_bn"] is False  # --weights none
    assert shown_train(monkeypatch, capsys, "--freeze-bn")["freeze_bn"] is True

    for option, frozen in (([], True), (["--no-freeze-bn"], False)):
        name = "frozen" if frozen else "trains"
        run = tiny_train(name, monkeypatch, capsys, *weights, *option)
        assert run_settings(run)["freeze_bn"] is frozen
        stats = batchnorm_buffers(ckpt.load(run / "checkpoint.pt")["model"])
        assert len(stats) == 8  # four BatchNorm layers in the small backbone
        kept = [
            torch.all(v == (0.25 if k.endswith("mean") else 2.0)).item() for k, v in stats.items()
        ]
        assert all(kept) if frozen else not any(kept), name


def test_sync_bn_is_on_under_torchrun_on_gpus_when_batchnorm_trains_and_the_option_decides(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/cli.md, train: "`--sync-bn/--no-sync-bn` (default: on under torchrun on GPUs when
    BatchNorm trains)"; docs/training.md: "`--no-sync-bn` turns it off"."""
    import dataclasses

    import pactl.runtime
    from pactl.config import ModelConfig, TrainConfig
    from pactl.recipe import resolve_train_config

    assert shown_train(monkeypatch, capsys)["sync_bn"] is False  # one CPU process
    assert shown_train(monkeypatch, capsys, "--sync-bn")["sync_bn"] is True
    assert shown_train(monkeypatch, capsys, "--no-sync-bn")["sync_bn"] is False
    monkeypatch.setattr(pactl.runtime, "resolve_device", lambda _: torch.device("cuda", 0))
    model = ModelConfig(backbone="small", weights="none")
    unset = TrainConfig(freeze_bn=None, sync_bn=None)
    assert resolve_train_config(model, unset, distributed=True).sync_bn is True
    assert resolve_train_config(model, unset, distributed=False).sync_bn is False
    frozen = dataclasses.replace(unset, freeze_bn=True)
    assert resolve_train_config(model, frozen, distributed=True).sync_bn is False
    off = dataclasses.replace(unset, sync_bn=False)
    assert resolve_train_config(model, off, distributed=True).sync_bn is False


def test_crop_scale_is_the_smallest_crop_every_training_transform_takes(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/cli.md, train: "rrc_flip: a random crop of `--crop-scale` (0.08, the paper's ...) to
    all of the image's area". Every training transform of the run is built with it."""
    import pactl.transforms

    assert shown_train(monkeypatch, capsys, "--augment", "rrc_flip")["crop_scale"] == 0.08
    built: list[tuple[bool, str, float]] = []
    original = pactl.transforms.build_transform

    def recorded(*args: Any, **kwargs: Any) -> Any:
        built.append((kwargs["train"], kwargs["augment"], kwargs["crop_scale"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(pactl.transforms, "build_transform", recorded)
    run = tiny_train("crops", monkeypatch, capsys, "--augment", "rrc_flip", "--crop-scale", "0.5")
    assert run_settings(run)["crop_scale"] == 0.5
    training = [b for b in built if b[0]]
    assert training and set(training) == {(True, "rrc_flip", 0.5)}


@pytest.mark.parametrize(
    ("options", "amp", "channels_last", "compiled"),
    [
        ([], "none", True, False),
        (["--amp", "bf16", "--no-channels-last", "--compile"], "bf16", False, True),
    ],
)
def test_amp_channels_last_and_compile_act_on_the_training_steps(
    options: list[str],
    amp: str,
    channels_last: bool,
    compiled: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    """docs/training.md: "`--amp bf16|fp16` autocasts the network; the loss stays in float32;
    fp16 uses a gradient scaler", "`--channels-last` (NHWC convolutions, the default;
    `--no-channels-last` turns it off) and `--compile` (`torch.compile`)". Seen from inside the
    run: the backbone's output dtype in each training step, the layout of each batch, and
    torch.compile called on the network (recorded, not run: compiling takes a minute)."""
    import pactl.training.loop
    import pactl.training.trainer as trainer

    dtypes: set[torch.dtype] = set()
    layouts: set[bool] = set()
    compiles: list[Any] = []
    stepping: list[bool] = []  # inside train_step (BatchNorm's calibration runs in float32)
    build, on_device, step = trainer.build_trainer, trainer.on_device, trainer.train_step

    def watched(*args: Any, **kwargs: Any) -> Any:
        t = build(*args, **kwargs)
        assert t.scaler.is_enabled() is False  # a scaler is fp16's alone
        t.net.backbone.register_forward_hook(
            lambda m, i, o: dtypes.add(o.dtype) if stepping else None
        )
        return t

    def one_step(*args: Any, **kwargs: Any) -> Any:
        stepping.append(True)
        try:
            return step(*args, **kwargs)
        finally:
            stepping.pop()

    def laid_out(t: Any, images: torch.Tensor) -> torch.Tensor:
        out = on_device(t, images)
        layouts.add(out.is_contiguous(memory_format=torch.channels_last))
        return out

    monkeypatch.setattr(pactl.training.loop, "build_trainer", watched)
    monkeypatch.setattr(trainer, "on_device", laid_out)
    monkeypatch.setattr(trainer, "train_step", one_step)
    monkeypatch.setattr(torch, "compile", lambda model, **_: compiles.append(model) or model)
    run = tiny_train("hw", monkeypatch, capsys, *options)
    settings = run_settings(run)
    assert (settings["amp"], settings["channels_last"], settings["compile"]) == (
        amp,
        channels_last,
        compiled,
    )
    assert dtypes == {torch.bfloat16 if amp == "bf16" else torch.float32}
    assert layouts == {channels_last}
    assert len(compiles) == int(compiled)
    if compiled:
        assert type(compiles[0]).__name__ == "EmbeddingNet"


def test_amp_fp16_trains_with_a_gradient_scaler() -> None:
    """docs/training.md: "fp16 uses a gradient scaler" (and bf16 none)."""
    from pactl.config import ModelConfig, TrainConfig
    from pactl.training.distributed import World
    from pactl.training.trainer import build_trainer

    model = ModelConfig(backbone="small", weights="none", embedding_dim=8, image_size=16)
    for amp, scaled in (("fp16", True), ("bf16", False), ("none", False)):
        cfg = TrainConfig(device="cpu", amp=amp, workers=0)
        assert build_trainer(model, cfg, 3, World()).scaler.is_enabled() is scaled, amp


def hadamard(n: int) -> np.ndarray:
    """Sylvester's construction, written out: H_1 = [1], H_2n = [[H, H], [H, -H]]."""
    h = np.ones((1, 1))
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    return h


def test_code_proxies_hadamard_and_quantization_shape_the_code_loss(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/cli.md, train: "`--code-proxies learned|hadamard` ...: `learned` (the default) trains
    `--loss` with its own proxies, `hadamard` pulls each class to a fixed hash centre (CSQ's
    Hadamard rows) ...; `--quantization W` weighs the term `1 - cos(v, sign v)`". The run's
    centres are the Hadamard rows (and -rows) by hand, unchanged by training; its loss is the
    base loss plus W times that term, computed in float64."""
    from pactl.config import ModelConfig, TrainConfig
    from pactl.training.trainer import build_criterion

    shown = shown_train(monkeypatch, capsys, "--bits", "16", "--dim", "16")
    assert (shown["code_proxies"], shown["quantization"]) == ("learned", 0.5)
    options = ["--bits", "16", "--dim", "16", "--code-proxies", "hadamard", "--quantization", "2.5"]
    run = tiny_train("codes", monkeypatch, capsys, *options)
    settings = run_settings(run)
    assert (settings["code_proxies"], settings["quantization"]) == ("hadamard", 2.5)
    proxies = ckpt.load(run / "checkpoint.pt")["proxies"]
    (centres,) = proxies.values()
    h = hadamard(16)
    rows = np.concatenate([h, -h])[: len(centres)]
    assert np.array_equal(centres.numpy(), rows)

    config = json.loads((run / "config.json").read_text())
    model = ModelConfig(**config["model_config"])
    cfg = TrainConfig(**{**config["train_config"], "eval_ks": tuple(settings["eval_ks"])})
    criterion = build_criterion(model, cfg, len(centres)).double()
    base = build_criterion(model, TrainConfig(**{**vars(cfg), "quantization": 0.0}), len(centres))
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = torch.arange(6) % len(centres)
    v = x.numpy()
    term = np.mean(1 - np.abs(v).sum(1) / (np.linalg.norm(v, axis=1) * np.sqrt(16)))
    got = float(criterion(x, labels)) - float(base.double()(x, labels))
    assert got == pytest.approx(2.5 * term, rel=1e-9, abs=1e-12)


def test_sweep_trials_trains_that_many_points_of_the_grid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/cli.md, sweep: "A grid of training runs ... or, with `--trials N`, a TPE search of N
    points among them"; sweep.json records the trials."""
    pytest.importorskip("optuna")
    from test_sweep import SETTINGS

    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    args = ["sweep", "imgs", "--param", "alpha=8,16,32,64", "--trials", "2", "--name", "tpe"]
    settings = [a for s in SETTINGS if s != "epochs=2" for a in ("--set", s)]
    code, out, err = run_cli(
        [*args, *settings, "--set", "epochs=1", "-q", "--format", "csv"], monkeypatch, capsys
    )
    assert code == 0, err
    folder = tmp_path / "runs" / "tpe"
    points = sorted(p.name for p in (folder / "points").iterdir())
    assert len(points) == 2 and set(points) < {f"alpha={a}-s0" for a in (8, 16, 32, 64)}
    assert json.loads((folder / "sweep.json").read_text())["config"]["trials"] == 2
    assert len(out.strip().splitlines()) == 1 + 2  # the header and a row per point


def test_serve_max_batch_caps_the_images_of_one_forward_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/serving.md: "`--max-batch` | `32` | images embedded in one forward pass, at most";
    "the first request of a pass waits up to `--batch-wait-ms` for others, up to
    `--max-batch` images in all". The option reaches the service's config, and its batcher
    never gives a pass more images (a request that would overflow one opens the next)."""
    pytest.importorskip("fastapi")
    from test_api import tiny_run

    import pactl.serve.server
    from pactl.serve.engine import Batcher, Job

    tiny_run(tmp_path)
    assert (
        run_cli(
            ["index", "photos", "--checkpoint", "best.pt", "--out", "b", "-q"], monkeypatch, capsys
        )[0]
        == 0
    )
    configs: list[Any] = []
    monkeypatch.setattr(pactl.serve.server, "serve", lambda config, log: configs.append(config))
    code, _, err = run_cli(["serve", "b", "--max-batch", "5", "--port", "0"], monkeypatch, capsys)
    assert code == 0, err
    assert [c.max_batch for c in configs] == [5]
    code, _, _ = run_cli(["serve", "b", "--port", "0"], monkeypatch, capsys)
    assert configs[-1].max_batch == 32

    passes: list[int] = []

    class Counting:
        def answer(self, jobs: list[Job]) -> list[Any]:
            passes.append(sum(len(j.files) for j in jobs))
            return [None] * len(jobs)

    async def four_requests_at_once() -> None:
        batcher = Batcher(Counting(), configs[0].max_batch, wait_s=0.5)  # type: ignore[arg-type]
        batcher.start()
        jobs = [
            Job([Path(f"{i}-{n}.png") for n in range(2)], ["a", "b"], [None] * 2, 1, False)
            for i in range(4)
        ]
        await asyncio.gather(*(batcher.submit(job) for job in jobs))
        await batcher.stop()

    asyncio.run(four_requests_at_once())
    assert sum(passes) == 8 and max(passes) <= 5 and passes == [4, 4]


def test_index_no_binary_indexes_the_floats_of_a_bits_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """docs/cli.md, index: "Vectors of a network trained with `pactl train --bits N` are indexed
    this way by default, their own signs the codes (`--no-binary` indexes their floats)". The
    float bundle answers as exact cosine search (float64, brute force) does."""
    import faiss

    from pactl import checkpoint
    from pactl.config import ModelConfig
    from pactl.model import build_model

    make_class_folder(tmp_path / "imgs", classes=4, per_class=4)
    config = ModelConfig(
        backbone="small", weights="none", embedding_dim=16, image_size=16, resize_size=16, bits=16
    )
    torch.manual_seed(0)
    net, filled = build_model(config)
    payload = checkpoint.export_payload(
        checkpoint.clean_state_dict(net), filled, [f"class_{c}" for c in range(4)], 1, {}
    )
    checkpoint.save(tmp_path / "best.pt", payload)
    for args in (
        ["embed", "imgs", "--checkpoint", "best.pt", "--out", "v"],
        ["index", "v", "--out", "codes"],
        ["index", "v", "--out", "floats", "--no-binary"],
    ):
        code, _, err = run_cli([*args, "-q"], monkeypatch, capsys)
        assert code == 0, err
    assert json.loads((tmp_path / "codes" / "meta.json").read_text())["binary"]["bits"] == 16
    meta = json.loads((tmp_path / "floats" / "meta.json").read_text())
    assert not meta.get("binary")
    index = faiss.read_index(str(tmp_path / "floats" / "index.faiss"))  # a float index
    assert index.d == 16 and index.ntotal == 16
    vectors = np.load(tmp_path / "v" / "vectors.npy").astype(np.float64)
    queries = vectors[:3]
    code, out, err = run_cli(
        ["query", "--vectors", str(_save(tmp_path / "q.npy", queries)), "--index", "floats",
         "--k", "5", "-f", "jsonl"],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0, err
    hits = [json.loads(line) for line in out.splitlines()]
    for row in range(3):
        got = [h["score"] for h in hits if h["query"] in (row, str(row))]
        want = np.sort(vectors @ queries[row])[::-1][:5]
        assert np.allclose(got, want, atol=1e-5), row


def _save(path: Path, array: np.ndarray) -> Path:
    np.save(path, array.astype(np.float32))
    return path
