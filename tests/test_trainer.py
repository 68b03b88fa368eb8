"""pactl.training.trainer's Trainer: built once and frozen, its schedule written by timing.py
alone, its run state by epoch_records.py alone, and the calibration vectors returned by the
evaluation and kept by the loop for the epoch best.pt holds."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import make_class_folder

import pactl
from pactl import checkpoint as ckpt
from pactl.config import ModelConfig, TrainConfig
from pactl.training.distributed import World
from pactl.training.trainer import Trainer, build_trainer

PACKAGE = Path(pactl.__file__).resolve().parent


def test_a_trainer_is_built_once() -> None:
    model_cfg = ModelConfig("small", "none", embedding_dim=8, image_size=16, resize_size=16)
    t = build_trainer(model_cfg, TrainConfig(device="cpu", workers=0), 3, World())
    for name in [f.name for f in dataclasses.fields(Trainer)] + ["cfg", "scheduler"]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(t, name, None)
    assert t.cfg is t.schedule.cfg and t.scheduler is t.schedule.scheduler


def writers(*chains: tuple[str, ...]) -> set[str]:
    """The modules of pactl/ that assign to an attribute reached by one of `chains` (`("state",
    "best")`: x.state.best = ...)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[Any] = []
            if isinstance(node, ast.Assign):
                targets = [*node.targets]
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in [e for t in targets for e in getattr(t, "elts", [t])]:
                names = []
                while isinstance(target, ast.Attribute):
                    names.insert(0, target.attr)
                    target = target.value
                if any(tuple(names[-len(c) :]) == c for c in chains):
                    found.add(str(path.relative_to(PACKAGE)))
    return found


def test_each_part_of_a_run_that_changes_has_one_writer() -> None:
    schedule = writers(("schedule", "cfg"), ("schedule", "scheduler"), ("schedule",))
    assert schedule == {"training/timing.py"}
    state = writers(("state", "best"), ("state", "last"), ("state", "start"))
    assert state == {"training/epoch_records.py"}
    assert writers(("evaluated",), ("best_vectors",)) == set()  # no vectors ride on the Trainer


def test_best_pt_is_calibrated_from_the_vectors_its_own_epoch_was_evaluated_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each evaluation's vectors, in order (epoch 0 first); the ones the calibration reads are
    the very arrays of the epoch best.pt holds (chosen by test Recall@1: any epoch may win)."""
    import pactl.training.loop
    import pactl.training.start

    evaluated: list[Any] = []
    real = pactl.training.trainer.evaluate_epoch

    def evaluate_epoch(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        evaluated.append(result.vectors)
        return result

    calibrated: list[Any] = []

    def calibrate_checkpoint(*args: Any) -> None:
        calibrated.append(args[-1])

    monkeypatch.setattr(pactl.training.loop, "evaluate_epoch", evaluate_epoch)
    monkeypatch.setattr(pactl.training.start, "evaluate_epoch", evaluate_epoch)
    monkeypatch.setattr(pactl.training.loop, "calibrate_checkpoint", calibrate_checkpoint)
    make_class_folder(Path("imgs"), classes=6, per_class=5)
    run = pactl.train(
        "imgs", name="t", epochs=3, selection="test", backbone="small", weights="none",
        embedding_dim=16, image_size=16, batch_size=8, lr=1e-3, warmup_epochs=0, workers=0,
    )  # fmt: skip
    best = ckpt.load(run.folder / "best.pt")["epoch"]
    assert len(evaluated) == 4 and all(v is not None for v in evaluated)
    assert len(calibrated) == 1 and calibrated[0] is evaluated[best]
