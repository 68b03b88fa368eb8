"""`pactl sweep`: a grid (or, with a trial count, a TPE search) of training runs on Optuna.

A sweep folder holds everything: sweep.json (what is swept, the base recipe), journal.log
(Optuna's JournalStorage: a file, so hosts sharing the folder over NFS share the work without a
database), points/<point>-s<seed>/ (one ordinary run folder per point and seed) and
locks/<point>-s<seed>/ (a writer lock each: a point is trained by one process at a time) and
cache/ (what points that start alike compute once: the epoch-0 row, the BatchNorm calibration of a
random network, the header check of the images; pactl.training.start_cache).

The run folders are what makes a sweep resumable: a point whose run folder has all its epochs is
read back, never trained again; one with a checkpoint.pt resumes from it; one without starts
afresh. A trial left RUNNING by a killed process (no process holds its points' locks) is marked
failed and its parameters queued again, so the next `pactl sweep --resume DIR` finishes it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pactl.config import REQUIRED, ModelConfig, TrainConfig, problems, setting, to_dict
from pactl.console import QUIET, Reporter
from pactl.errors import Busy, PactlError, UsageError
from pactl.recipe import settle
from pactl.research.seeds import MAX_SEEDS
from pactl.rules import MAX_SEED, Rule, integer, integers, number_or_text, optional, text
from pactl.store.generations import atomic_write_text, make_folder, writer_lock

if TYPE_CHECKING:
    import optuna
    from matplotlib.figure import Figure

    from pactl.datasets import Manifest

FORMAT = "pactl.sweep"
VERSION = 1
INSTALL = "pip install 'pactl[sweep]'"
ALIASES = {"dim": "embedding_dim", "m": "m_per_class"}  # train's option names
STUDY = "sweep"


def settings_rule(swept: bool) -> Rule:
    """(setting, values) pairs when `swept`, (setting, value) pairs else: the names are a
    ModelConfig or TrainConfig field's (each value is checked when its point settles)."""
    return Rule(
        "(setting, values) pairs" if swept else "(setting, value) pairs",
        lambda v: (
            isinstance(v, tuple)
            and all(
                isinstance(p, tuple)
                and len(p) == 2
                and isinstance(p[0], str)
                and (isinstance(p[1], tuple) or not swept)
                for p in v
            )
        ),
    )


@dataclass(frozen=True)
class SweepConfig:
    source: str = setting(
        REQUIRED, text(), "Dataset name, folder or CSV, as `pactl train` takes it."
    )
    params: tuple[tuple[str, tuple[Any, ...]], ...] = setting(
        REQUIRED, settings_rule(swept=True), "Swept settings and their values.", option="--param"
    )
    fixed: tuple[tuple[str, Any], ...] = setting(
        (), settings_rule(swept=False), "Settings every point shares.", option="--set"
    )
    preset: str | None = setting(
        None, optional(text()), "As train's --preset; None: the source's own."
    )
    seeds: tuple[int, ...] = setting(
        (0,), integers(MAX_SEEDS, 0, MAX_SEED), "Every point is trained once per seed."
    )
    trials: int | None = setting(
        None, optional(integer(1)),
        "None: every point of the grid; N: a TPE search of N points.",
    )  # fmt: skip
    sampler_seed: int = setting(0, integer(0, MAX_SEED), "Seeds the TPE search.", cli=False)


def optuna_module() -> Any:
    try:
        import optuna
    except ImportError:
        raise PactlError(f"pactl sweep needs optuna: {INSTALL}") from None
    # Optuna's warnings are about its trials, which pactl reports itself: a point that fails
    # ends the sweep with pactl's one-line error, where Optuna would log its traceback first.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna


# ---------------------------------------------------------------------------- settings


def field_types() -> dict[str, Any]:
    """Each ModelConfig and TrainConfig field's type, by field name."""
    hints = typing.get_type_hints(ModelConfig) | typing.get_type_hints(TrainConfig)
    return {
        f.name: hints[f.name] for c in (ModelConfig, TrainConfig) for f in dataclasses.fields(c)
    }


def convert(key: str, text: str) -> Any:
    """`text` as a value of the setting `key` (int, float, bool, string, or a K list `1,2,4`)."""
    if key == "time_budget":  # 15m, as train's --time-budget takes it
        from pactl.budget import parse_duration

        return parse_duration(text)
    kind = field_types()[key]
    args = set(typing.get_args(kind)) - {type(None)}
    base = next(iter(args)) if args else kind
    if text.lower() in ("none", "null") and type(None) in typing.get_args(kind):
        return None
    if args == {float, str}:  # a number or a word (drop_noisy=0.2 or auto)
        return number_or_text(text)
    try:
        if base is bool:
            if text.lower() not in ("true", "false", "yes", "no", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "yes", "1")
        if base in (int, float):
            return base(text)
    except ValueError:
        raise UsageError(f"{key}={text!r}: not a {base.__name__}") from None
    return text


def parse_setting(text: str, many: bool) -> tuple[str, Any]:
    """`alpha=4,8,16` -> ("alpha", (4.0, 8.0, 16.0)) when `many`; `epochs=1` -> ("epochs", 1)."""
    key, sep, values = text.partition("=")
    key = ALIASES.get(key.strip().replace("-", "_"), key.strip().replace("-", "_"))
    if not sep or not values:
        raise UsageError(f"{text!r}: give KEY=VALUE{',VALUE...' if many else ''}")
    if key not in field_types():
        raise UsageError(
            f"{text!r}: {key} is not a setting (pactl train --print-config lists them)"
        )
    if key in ("eval_ks", "mean", "std"):
        raise UsageError(f"{key} cannot be swept or set here")
    if not many:
        return key, convert(key, values.strip())
    parts = tuple(convert(key, v.strip()) for v in values.split(","))
    if len(set(parts)) != len(parts):
        raise UsageError(f"{text!r}: a value is given twice")
    return key, parts


def point_settings(config: SweepConfig, params: dict[str, Any], seed: int) -> dict[str, Any]:
    """The settings one point and seed are given: --set, the swept values, the seed."""
    return {**dict(config.fixed), **params, "seed": seed}


def source_side(config: SweepConfig, data: Callable[[bool], Manifest] | None = None) -> int | None:
    """The typical short side of the sweep source's training images (pactl.datasets), from
    `data(follow_links)` or a quiet read of the source."""
    from pactl.datasets import load_source, typical_side

    follow_links = bool(dict(config.fixed).get("follow_links"))
    if data is not None:
        return typical_side(data(follow_links))
    return typical_side(load_source(config.source, QUIET, follow_links=follow_links))


def point_name(params: dict[str, Any], seed: int) -> str:
    """`alpha=16_delta=0.1-s0`: one plain folder name."""
    text = "_".join(f"{k}={_text(v)}" for k, v in sorted(params.items())) or "base"
    return re.sub(r"[^\w.=+-]", "_", text)[:200] + f"-s{seed}"


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def grid(config: SweepConfig) -> list[dict[str, Any]]:
    """Every combination of the swept values, in the order given."""
    points: list[dict[str, Any]] = [{}]
    for key, values in config.params:
        points = [{**p, key: v} for p in points for v in values]
    return points


# ---------------------------------------------------------------------------- the sweep folder


def write_sweep_json(folder: Path, config: SweepConfig) -> None:
    info = {"format": FORMAT, "version": VERSION, "config": to_dict(config)}
    atomic_write_text(folder / "sweep.json", json.dumps(info, indent=2) + "\n")


def read_sweep_json(folder: Path) -> SweepConfig:
    """The sweep a folder holds, checked; one line naming the file when it is none."""
    path = folder / "sweep.json"
    try:
        info = json.loads(path.read_bytes())
        if info.get("format") != FORMAT:
            raise ValueError(f"no 'format: {FORMAT}' entry")
        if not isinstance(info.get("version"), int) or info["version"] > VERSION:
            raise ValueError("written by a newer pactl; upgrade")
        raw = info["config"]
        config = SweepConfig(
            source=str(raw["source"]),
            params=tuple((str(k), tuple(v)) for k, v in raw["params"]),
            fixed=tuple((str(k), v) for k, v in raw["fixed"]),
            preset=raw.get("preset"),
            seeds=tuple(int(s) for s in raw["seeds"]),
            trials=raw.get("trials"),
            sampler_seed=int(raw.get("sampler_seed", 0)),
        )
        for name, wrong in problems(config)[:1]:
            raise ValueError(f"config.{name} {wrong}")
        return config
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise PactlError(f"{path} is not a pactl sweep ({e})") from None


def prepare_sweep(folder: Path, config: SweepConfig | None) -> SweepConfig:
    """A new sweep's folder (refused where one is), or the sweep a folder holds (`config`
    None: --resume)."""
    if config is None:
        if not (folder / "sweep.json").is_file():
            raise PactlError(f"nothing to resume in {folder}: no sweep.json")
        return read_sweep_json(folder)
    if folder.exists() and any(folder.iterdir()):
        raise PactlError(f"{folder} is not empty; continue its sweep with --resume {folder}")
    make_folder(folder / "points")
    write_sweep_json(folder, config)
    return config


def open_study(folder: Path, config: SweepConfig) -> optuna.Study:
    """The sweep's study in folder/journal.log: a grid sampler, or TPE for --trials."""
    optuna = optuna_module()
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(folder / "journal.log")))
    space = {k: list(v) for k, v in config.params}
    sampler = (
        optuna.samplers.GridSampler(space, seed=config.sampler_seed)
        if config.trials is None
        else optuna.samplers.TPESampler(seed=config.sampler_seed)
    )
    return optuna.create_study(
        study_name=STUDY,
        storage=storage,
        sampler=sampler,
        direction="maximize",
        load_if_exists=True,
    )


def requeue_stale(
    study: optuna.Study, folder: Path, config: SweepConfig, reporter: Reporter
) -> int:
    """Points a stopped sweep left unfinished, queued again: trials left RUNNING by a process
    that died (none holds their points' locks) are marked failed first, then every failed
    trial (killed, interrupted, or an error) whose point no trial has finished nor waits for is
    queued once more. Returns how many were queued."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        names = [point_name(trial.params, s) for s in config.seeds]
        if not any(is_locked(folder / "locks" / n) for n in names):  # else: being trained
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    kept = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING, TrialState.RUNNING)
    settled = {_key(t.params) for t in study.get_trials(deepcopy=False, states=kept)}
    queued = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        if trial.params and _key(trial.params) not in settled:
            study.enqueue_trial(trial.params, skip_if_exists=False)
            settled.add(_key(trial.params))
            queued += 1
    if queued:
        reporter.log(f"{queued} point(s) left unfinished by a stopped sweep: queued again")
    return queued


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def is_locked(lock_folder: Path) -> bool:
    if not lock_folder.is_dir():
        return False
    try:
        with writer_lock(lock_folder):
            return False
    except Busy:
        return True


# ---------------------------------------------------------------------------- running points


def finished(run: Path) -> bool:
    """Whether a point's run folder holds every epoch it planned (and its best.pt)."""
    from pactl.runs import read_metrics

    try:
        planned = json.loads((run / "config.json").read_bytes())["train_config"]["epochs"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not (run / "best.pt").is_file() or not (run / "metrics.csv").is_file():
        return False
    rows = read_metrics(run / "metrics.csv")
    return bool(rows) and max(int(r["epoch"]) for r in rows) >= planned


def score(best: dict[str, float]) -> float:
    """What the sweep maximises: validation Recall@1 where there are validation classes (a
    recipe is never chosen on the test classes), else test Recall@1."""
    value = best.get("val_recall@1", best.get("recall@1"))
    return float(value) if value is not None else math.nan


def best_of(run: Path) -> dict[str, float]:
    """The metrics of the epoch best.pt holds, read back from the run folder."""
    from pactl.runs import best_epoch, read_metrics, run_selection

    rows = read_metrics(run / "metrics.csv")
    chosen = best_epoch(rows, run_selection(run, set().union(*rows)))
    return next((r for r in rows if int(r["epoch"]) == chosen), rows[-1])


def run_point(
    folder: Path,
    name: str,
    configs: tuple[ModelConfig, TrainConfig],
    source: str,
    manifest: Manifest,
    reporter: Reporter,
) -> dict[str, float]:
    """One point and seed: read back when finished, resumed from its checkpoint, or trained.
    Busy when another process is training it."""
    from pactl.runs import prepare_run_dir, resumed_configs
    from pactl.training.loop import fit

    run, lock = folder / "points" / name, folder / "locks" / name
    make_folder(lock)
    with writer_lock(lock):
        if finished(run):
            reporter.log(f"{name}: finished before, read back")
            return best_of(run)
        resume = (run / "checkpoint.pt").is_file()
        reporter.log(f"{name}: {'resuming' if resume else 'training'}")
        prepare_run_dir(run, resume=resume, overwrite=not resume)
        if resume:  # the run's own settings: a time budget's plan is in them
            configs = resumed_configs(run)[1:]
        shared = folder / "cache"
        return fit(
            source, manifest, *configs, run, reporter, resume=resume, shared_start=shared
        ).best_metrics


def sweep_point_configs(
    config: SweepConfig,
    device_type: str,
    params: dict[str, Any],
    seed: int,
    side: Callable[[], int | None] | None = None,
) -> tuple[ModelConfig, TrainConfig]:
    """One point's configs, settled as `pactl train` settles the same settings given as its
    options (pactl.recipe.settle): --set and the swept values count as given."""
    recipe = settle(
        config.source,
        point_settings(config, params, seed),
        device_type,
        side or (lambda: source_side(config)),
        config.preset,
        name=lambda f: f"sweep setting {f}",
    )
    return recipe.model, recipe.train


def objective(
    folder: Path,
    config: SweepConfig,
    device_type: str,
    manifest: Manifest,
    reporter: Reporter,
    side: Callable[[], int | None],
) -> Any:
    """Optuna's objective: the point's seeds trained (or read back), their mean score."""
    pruned = optuna_module().TrialPruned

    def run_trial(trial: optuna.Trial) -> float:
        params = {k: trial.suggest_categorical(k, list(v)) for k, v in config.params}
        scores = []
        for seed in config.seeds:
            configs = sweep_point_configs(config, device_type, params, seed, side)
            try:
                best = run_point(
                    folder, point_name(params, seed), configs, config.source, manifest, reporter
                )
            except Busy:
                raise pruned("another process is training this point") from None
            scores.append(score(best))
        trial.set_user_attr("scores", scores)
        return float(sum(scores) / len(scores))

    return run_trial


@dataclass(frozen=True)
class SweepResult:
    folder: Path
    table: str  # pactl compare's table of the points
    written: tuple[Path, ...]


def run_sweep(
    folder: Path,
    config: SweepConfig | None,
    device_type: str,
    reporter: Reporter,
    fmt: str = "table",
) -> SweepResult:
    """Run (or, with `config` None, resume) the sweep in `folder` until every point is done,
    then the results: compare's table and files, and sweep.png."""
    from optuna.trial import TrialState

    from pactl.datasets import load_source
    from pactl.research.compare import compare

    optuna_module()
    config = prepare_sweep(folder, config)
    points = grid(config)
    data = functools.cache(lambda follow: load_source(config.source, reporter, follow_links=follow))
    side = functools.cache(lambda: source_side(config, data))  # the source read once in all
    for params in points:  # every point's settings checked before any training
        for seed in config.seeds:
            sweep_point_configs(config, device_type, params, seed, side)
    follow_links = bool(dict(config.fixed).get("follow_links"))
    manifest = data(follow_links)
    study = open_study(folder, config)
    requeue_stale(study, folder, config, reporter)
    run_trial = objective(folder, config, device_type, manifest, reporter, side)
    if config.trials is None:
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        seen = {_key(t.params) for t in complete}
        if len(seen) < len(points):  # the grid sampler stops once every point is done
            study.optimize(run_trial, catch=())
    else:
        done = len(study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED)))
        if config.trials > done:
            study.optimize(run_trial, n_trials=config.trials - done, catch=())
    result = compare([folder / "points"], fmt, folder)
    save_sweep_figure(folder, config)
    return SweepResult(folder, result.text, (*result.written, folder / "sweep.png"))


def save_sweep_figure(folder: Path, config: SweepConfig) -> None:
    from pactl.report import save_figure

    save_figure(sweep_figure(folder / "points", config), folder / "sweep.png")


def point_scores(points: Path, config: SweepConfig) -> list[tuple[dict[str, Any], float]]:
    """(settings, test Recall@1 of best.pt's epoch) of every finished point and seed."""
    found = []
    for params in grid(config):
        for seed in config.seeds:
            run = points / point_name(params, seed)
            if finished(run):
                found.append((params, float(best_of(run).get("recall@1", math.nan))))
    return found


def sweep_figure(points: Path, config: SweepConfig) -> Figure:
    """Recall@1 (test classes, at the epoch best.pt holds) against each swept setting, as the
    paper's Figures 5-7: a dot per point and seed, the line through each value's mean."""
    from matplotlib.figure import Figure

    keys = [k for k, _ in config.params]
    fig = Figure(figsize=(4.2 * max(len(keys), 1), 3.6), layout="constrained")
    axes = fig.subplots(1, max(len(keys), 1), squeeze=False)[0]
    scores = point_scores(points, config)
    for ax, (key, values) in zip(axes, config.params, strict=False):
        xs = list(range(len(values)))
        by_value = [[r for p, r in scores if p[key] == v and not math.isnan(r)] for v in values]
        for x, found in zip(xs, by_value, strict=True):
            ax.plot([x] * len(found), found, "o", color="tab:blue", alpha=0.5)
        means = [(x, sum(f) / len(f)) for x, f in zip(xs, by_value, strict=True) if f]
        if means:
            ax.plot(*zip(*means, strict=True), "-", color="tab:blue", gid="sweep-mean")
        ax.set_xticks(xs, [_text(v) for v in values])
        ax.set_xlabel(key)
        ax.set_ylabel("Recall@1 (test classes)")
    fig.suptitle(f"{config.source}: Recall@1 against each swept setting")
    return fig
