"""`pactl train`'s library side: the one start of a run (start_run: the settings checked, a new
run's recipe settled by pactl.recipe.settle or a resumed run's read back, its folder named, its
manifest read once), and the training into the folder (fit_run). The CLI (pactl.cli.train) and
pactl.train() are two doors to these, and differ only in how they name a setting in an error.
"""

from __future__ import annotations

import functools
import re
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pactl.config import (
    TRAIN_RULES,
    ModelConfig,
    TrainConfig,
    check,
    option_name,
    override,
    resume_keeps,
)
from pactl.console import Reporter, quoted
from pactl.errors import PactlError, UsageError
from pactl.recipe import Recipe, settle
from pactl.store.home import runs_dir
from pactl.verbs.sources import check_source

if TYPE_CHECKING:
    from pactl.datasets import Manifest
    from pactl.training.loop import TrainResult


@dataclass(frozen=True)
class RunStart:
    """A run as start_run settles it: what it trains on, with which recipe, into which folder,
    whether it continues one (--resume), and the source's manifest, read once whoever reads it
    first (the recipe where it needs the images' size, else the training)."""

    source: str
    recipe: Recipe
    run: Path
    resume: bool
    manifests: Callable[[bool], Manifest]  # following links or not -> the manifest, cached

    def manifest(self) -> Manifest:
        """The manifest the run trains on (links followed as its recipe says)."""
        return self.manifests(self.recipe.train.follow_links)


def start_run(
    source: str | Path | None,
    settings: Mapping[str, Any],
    reporter: Reporter,
    *,
    preset: str | None = None,
    name: str | None = None,
    resume: str | Path | None = None,
    others: Collection[str] = (),
    words: Callable[[str], str] = option_name,
) -> RunStart:
    """The one start of a run, for `pactl train` and pactl.train(): the settings given (by
    ModelConfig and TrainConfig field name; a time budget in seconds or as text) checked, then
    the run `resume` names with its own settings (resumed), or a new run of `source` settled by
    pactl.recipe.settle into runs/NAME. `others`: the door's own run options given, which
    --resume refuses as it refuses a source, a preset and a name. Every error names what it
    is about as `words(field)` (--time-budget for the CLI, time_budget for the API)."""
    given = checked_settings(settings, words)
    if name is not None:
        check_run_name(name)
    if resume is not None:
        named = {"source": source, "preset": preset, "name": name}
        refused = [*(k for k, v in named.items() if v is not None), *others]
        run, text, recipe = resumed(resume, given, words, refused)
        return RunStart(text, recipe, run, True, manifests(text, reporter))
    if source is None:
        raise UsageError(f"give a dataset name, folder or CSV to train on (or {words('resume')})")
    text = str(source)
    check_source(text)
    data = manifests(text, reporter)
    side = lambda: typical_side(data(bool(given.get("follow_links"))))  # noqa: E731
    recipe = settle(text, given, device_type(given.get("device", "auto")), side, preset, words)
    run = runs_dir() / (name or default_run_name(text, recipe.model, recipe.train))
    return RunStart(text, recipe, run, False, data)


def checked_settings(settings: Mapping[str, Any], words: Callable[[str], str]) -> dict[str, Any]:
    """The settings as settle takes them: lists as tuples, a time budget in seconds, and not
    with epochs (the budget chooses them)."""
    from pactl.budget import parse_duration

    given = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
    budget = given.get("time_budget")
    if budget is not None and "epochs" in given:
        raise UsageError(
            f"give {words('epochs')} or {words('time_budget')}, not both (the budget chooses "
            "epochs)"
        )
    if isinstance(budget, str):
        try:
            given["time_budget"] = parse_duration(budget)
        except UsageError as e:
            raise UsageError(f"{words('time_budget')} {e}") from None
    return given


def manifests(source: str, reporter: Reporter) -> Callable[[bool], Manifest]:
    """The source's manifest, read once for each way of following links."""

    @functools.cache
    def read(follow_links: bool) -> Manifest:
        from pactl.datasets import load_source

        return load_source(source, reporter, follow_links=follow_links)

    return read


def typical_side(manifest: Manifest) -> int | None:
    """The typical short side of the training images, which the from-scratch CPU recipe's
    network depends on."""
    from pactl.datasets import typical_side as side

    return side(manifest)


def device_type(device: Any) -> str:
    """The kind of device the recipe is chosen for; a wrong device is auto here, and settle
    names it."""
    from pactl.runtime import resolve_device

    return resolve_device(device if TRAIN_RULES["device"].ok(device) else "auto").type


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


def fit_run(start: RunStart, reporter: Reporter, overwrite: bool = False) -> TrainResult:
    """Train the run `start` settled into its folder (pactl.training.loop.fit); a run that
    fails or is interrupted before its first checkpoint leaves no folder behind."""
    from pactl.runs import prepare_run_dir
    from pactl.training.loop import fit

    run, recipe = start.run, start.recipe
    manifest = start.manifest()
    created = not run.is_dir() or not any(run.iterdir())
    prepare_run_dir(run, resume=start.resume, overwrite=overwrite)
    try:
        return fit(
            start.source, manifest, recipe.model, recipe.train, run, reporter, resume=start.resume
        )
    except (PactlError, KeyboardInterrupt):
        if created and not (run / "checkpoint.pt").exists():  # nothing to resume: no dead end
            shutil.rmtree(run, ignore_errors=True)
        raise
