"""`pactl train`'s library side: the run folder's name, a resumed run's recipe, and the training
into the folder. The CLI (pactl.cli.train) and pactl.train() call these; both settle a new run's
recipe with pactl.recipe.settle.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pactl.config import ModelConfig, TrainConfig, check, option_name, override, resume_keeps
from pactl.console import Reporter, quoted
from pactl.errors import PactlError, UsageError
from pactl.recipe import Recipe
from pactl.store.home import runs_dir

if TYPE_CHECKING:
    from pactl.datasets import Manifest
    from pactl.training.loop import TrainResult


def default_run_name(source: str, model_cfg: ModelConfig, cfg: TrainConfig) -> str:
    """SOURCE-BACKBONE-LOSS-TIME, every character outside letters, digits, `.`, `-` and `_`
    replaced by `_`: one plain folder name whatever the source is called."""
    stem = Path(source).stem if ("/" in source or "." in source) else source
    name = f"{stem}-{model_cfg.backbone}-{cfg.loss}-{time.strftime('%Y%m%d-%H%M%S')}"
    return re.sub(r"[^\w.-]", "_", name)


def check_run_name(name: str) -> None:
    """--name is one plain folder name under the runs folder: not empty, `.` or `..`, no `/` or
    `\\`, no NUL or other control characters, at most 255 bytes. Anything else could name a
    folder outside runs/ (which --overwrite would then remove)."""
    plain = (
        name not in ("", ".", "..")
        and not any(c in name for c in "/\\")
        and name.isprintable()
        and len(name.encode("utf-8", "surrogateescape")) <= 255
    )
    if not plain:
        raise UsageError(
            f"--name {quoted(name)} must be one plain folder name under {runs_dir()}: no '/', "
            "backslash, '.', '..' or control characters"
        )


def resumed(
    resume: str | Path,
    changes: Mapping[str, Any],
    name: Callable[[str], str] = option_name,
    others: Collection[str] = (),
) -> tuple[Path, str, Recipe]:
    """The run `resume` names ('latest': the latest under the runs folder), its source and the
    recipe it was started with, `changes` (by field name) over it: only the settings declared
    resumable (epochs, device, workers, precision) may change. A setting that may not, and the
    run options in `others` (a source, a preset: they start new runs), are refused, each named
    as `name(field)`."""
    from pactl.runs import latest_run, resumed_configs

    refused = sorted([*(k for k in changes if k in resume_keeps()), *others])
    if refused:
        raise UsageError(
            f"--resume continues a run with its own settings: it takes --epochs, --device "
            f"and --workers, not {', '.join(name(k) for k in refused)} (start a new run for "
            "other settings)"
        )
    run = latest_run(runs_dir()) if str(resume) == "latest" else Path(resume)
    source, model_cfg, cfg = resumed_configs(run)
    cfg = check(override(cfg, **changes), name, UsageError)
    return run, source, Recipe(model_cfg, cfg)


def fit_run(
    source: str,
    manifest: Manifest,
    recipe: Recipe,
    run: Path,
    reporter: Reporter,
    resume: bool = False,
    overwrite: bool = False,
) -> TrainResult:
    """Train `recipe` on `manifest` into the run folder `run` (pactl.training.loop.fit); a run
    that fails or is interrupted before its first checkpoint leaves no folder behind."""
    from pactl.runs import prepare_run_dir
    from pactl.training.loop import fit

    created = not run.is_dir() or not any(run.iterdir())
    prepare_run_dir(run, resume=resume, overwrite=overwrite)
    try:
        return fit(source, manifest, recipe.model, recipe.train, run, reporter, resume=resume)
    except (PactlError, KeyboardInterrupt):
        if created and not (run / "checkpoint.pt").exists():  # nothing to resume: no dead end
            shutil.rmtree(run, ignore_errors=True)
        raise
