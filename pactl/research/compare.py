"""`pactl compare`: runs side by side, seeds of one recipe folded into mean +- std.

Each run folder gives its config.json (what it trained) and metrics.csv (what it measured, one
row per epoch, epoch 0 before training). The table has one row per recipe
(pactl.research.aggregate: runs differing only by seed, their metrics averaged with the sample
standard deviation beside), laid out to fit the terminal; also CSV, Markdown or JSON. The figure
is the paper's Figure 1: Recall@1 against epochs and against wall time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pactl.errors import PactlError, UsageError
from pactl.research.aggregate import Group, Run, group_runs, isnan, pandas, summary
from pactl.runs import best_epoch, read_metrics, run_selection

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


OUTPUT_FILES = ("compare.csv", "compare.md", "compare.png")  # what --out holds
RUN_FILES = ("config.json", "metrics.csv")  # what compare reads of each run


def find_runs(paths: list[Path]) -> list[Path]:
    """Run folders (holding config.json); a folder of run folders (runs/, a sweep) adds each."""
    found: list[Path] = []
    for path in paths:
        if (path / "config.json").is_file():
            found.append(path)
            continue
        inner = sorted(p.parent for p in path.glob("*/config.json")) if path.is_dir() else []
        inner += sorted(p.parent for p in path.glob("*/*/config.json")) if path.is_dir() else []
        if not inner:
            raise UsageError(f"{path} is not a run folder (no config.json) and holds none")
        found.extend(inner)
    return list(dict.fromkeys(p.absolute() for p in found))


def read_run(path: Path) -> Run:
    """config.json and metrics.csv of one run; a missing or unreadable metrics.csv is a run
    with no epoch yet, an unreadable config.json one line naming it."""
    pd = pandas()
    try:
        info = json.loads((path / "config.json").read_bytes())
        model, train = info["model_config"], info["train_config"]
        dataset = str(info["dataset"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PactlError(f"{path / 'config.json'} is not a pactl run's config ({e})") from None
    settings = {f"model.{k}": _plain(v) for k, v in model.items()}
    settings |= {f"train.{k}": _plain(v) for k, v in train.items()}
    rows = read_metrics(path / "metrics.csv") if (path / "metrics.csv").is_file() else []
    frame = pd.DataFrame(rows)
    selection = run_selection(path, set().union(*rows) if rows else set())
    run = Run(path, dataset, settings, frame, selection)
    if rows:
        run.epochs_done = int(frame["epoch"].max())
        run.best = best_epoch(rows, selection)
    return run


def _plain(value: Any) -> Any:
    """A config value as one comparable, printable scalar (lists such as eval_ks as text)."""
    return ",".join(str(v) for v in value) if isinstance(value, list | tuple) else value


IDENTITY = ("run", "runs", "seeds", "status", "dataset", "loss", "backbone", "chosen by")


def published_column(frame: pd.DataFrame, groups: list[Group]) -> list[str]:
    """Per group, Kim et al.'s published Recall@1 for its dataset, backbone and sizes ('' when
    they published none)."""
    from pactl.research.published import published_cells, published_for

    cells = []
    for g in groups:
        s = g.runs[0].settings
        found = published_for(
            g.runs[0].dataset,
            str(s.get("model.backbone")),
            int(s.get("model.embedding_dim") or 0),
            int(s.get("model.image_size") or 0),
        )
        cells.append(" ".join(published_cells("recall@1", found)))
    return cells


def rendered(frame: pd.DataFrame, fmt: str, width: int | None = None) -> tuple[str, list[str]]:
    """The summary as text: table (aligned columns), markdown, csv or json, and the columns left
    out. csv and json keep every mean and std as numbers; table and markdown show `mean ± std`
    in one cell. A table given a `width` keeps the columns that fit it (fitted); the others
    give every column."""
    header, rows = shown_cells(frame)
    if fmt == "table" and width is not None:
        from pactl.output import format_rows

        numbers = sum(c.endswith(" mean") for c in frame.columns)
        kept, left_out = fitted(header, rows, width, len(header) - numbers)
        picked = [[row[i] for i in kept] for row in rows]
        return format_rows([header[i] for i in kept], picked, "text"), left_out
    return _every_column(frame, fmt), []


def _every_column(frame: pd.DataFrame, fmt: str) -> str:
    if fmt == "json":
        records = json.loads(frame.to_json(orient="records"))
        return json.dumps(records, indent=2) + "\n"
    if fmt == "csv":
        return str(frame.to_csv(index=False, float_format="%.6g"))
    header, rows = shown_cells(frame)
    if fmt == "markdown":
        lines = [header, ["---"] * len(header), *rows]
        return "".join("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |\n" for r in lines)
    from pactl.output import format_rows

    return format_rows(header, rows, "text")


# What a narrow table keeps first: the run, its key metrics, the settings and the identity
# columns that tell the rows apart, then the other numbers in this order (--at-epochs' where
# asked for).
KEY_METRICS = ("best recall@1", "best map@r")
THEN = ("published recall@1", " at ", "best epoch", "last recall@1", "seconds", "best ", "last ")


def fitted(
    header: list[str], rows: list[list[str]], width: int, first: int
) -> tuple[list[int], list[str]]:
    """The columns (indices, in table order) of an aligned table that fit in `width`
    characters, two spaces between columns, in the order of what matters: the run, the key
    metrics, the other columns before the numbers (which begin at `first`) whose cells differ
    between rows (not the counts of runs and seeds), then the numbers of THEN; and the names of
    the columns left out."""
    from pactl.console import visible

    sizes = [max(len(visible(c)) for c in [h, *(r[i] for r in rows)]) for i, h in enumerate(header)]
    differ = [
        i
        for i in range(1, first)  # the columns before the numbers: identity and settings
        if header[i] not in ("runs", "seeds") and len({r[i] for r in rows}) > 1
    ]
    wanted = [0, *(header.index(k) for k in KEY_METRICS if k in header), *differ]
    for word in THEN:
        wanted += [i for i in range(1, len(header)) if word in header[i]]
    kept: list[int] = []
    for i in dict.fromkeys(wanted):
        if not kept or sum(sizes[k] + 2 for k in kept) + sizes[i] <= width:
            kept.append(i)
    return sorted(kept), [h for i, h in enumerate(header) if i not in kept]


def shown_cells(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Header and rows with each `X mean` / `X std` pair folded into one `X` cell."""
    header = [c for c in frame.columns if not c.endswith(" mean") and not c.endswith(" std")]
    numbers = [c[: -len(" mean")] for c in frame.columns if c.endswith(" mean")]
    rows = []
    for _, row in frame.iterrows():
        cells = [_cell(row[c]) for c in header]
        cells += [_mean_std(row[f"{n} mean"], row[f"{n} std"], n) for n in numbers]
        rows.append(cells)
    return header + numbers, rows


def _cell(value: Any) -> str:
    if value is None or isnan(value):
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _mean_std(mean: float, std: float, name: str) -> str:
    if isnan(mean):
        return ""
    digits = 0 if name in ("epochs done", "best epoch", "seconds") else 4
    text = f"{mean:.{digits}f}"
    return text if isnan(std) else f"{text} ± {std:.{digits}f}"


def curves(run: Run, key: str = "recall@1") -> tuple[list[float], list[float], list[float]]:
    """(epochs, wall seconds at the end of each epoch, Recall@1) of the epochs evaluated; epoch
    0 at 0 s (its evaluation is no training), each later epoch adding its own seconds."""
    frame = run.metrics
    if frame.empty or key not in frame:
        return [], [], []
    frame = frame.sort_values("epoch")
    spent = frame["seconds"].where(frame["epoch"] > 0, 0.0) if "seconds" in frame else None
    clock = spent.fillna(0.0).cumsum() if spent is not None else frame["epoch"] * math.nan
    kept = frame[key].notna()
    return (
        frame["epoch"][kept].tolist(),
        clock[kept].tolist(),
        frame[key][kept].tolist(),
    )


def figure(groups: list[Group]) -> Figure:
    """Recall@1 of the test classes against epochs and against wall time: a line per group (the
    mean of its runs at each epoch they all reached), a band of +- one std over its seeds."""
    from matplotlib.figure import Figure

    pd = pandas()
    fig = Figure(figsize=(11, 4), layout="constrained")
    by_epoch, by_time = fig.subplots(1, 2, sharey=True)
    for g in groups:
        series = [curves(r) for r in g.runs]
        frames = [pd.DataFrame({"t": t, "r": v}, index=e) for e, t, v in series if e]
        if not frames:
            continue
        joined = pd.concat(frames, axis=1, keys=range(len(frames)), join="inner")
        mean_r = joined.xs("r", axis=1, level=1).mean(axis=1)
        std_r = joined.xs("r", axis=1, level=1).std(axis=1).fillna(0.0)
        mean_t = joined.xs("t", axis=1, level=1).mean(axis=1)
        label = f"{g.name} ({g.runs[0].settings.get('train.loss')}"
        label += f", {len(g.runs)} seeds)" if len(g.runs) > 1 else ")"
        for ax, x in ((by_epoch, mean_r.index.to_numpy()), (by_time, mean_t.to_numpy())):
            (line,) = ax.plot(x, mean_r.to_numpy(), marker="o", label=label)
            if len(frames) > 1:
                low, high = (mean_r - std_r).to_numpy(), (mean_r + std_r).to_numpy()
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, gid="seed-band")
    from matplotlib.ticker import MaxNLocator

    by_epoch.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    by_epoch.set_xlabel("epoch")
    by_time.set_xlabel("wall time (s)")
    by_epoch.set_ylabel("Recall@1 (test classes)")
    for ax in (by_epoch, by_time):
        if ax.get_lines():
            ax.legend(loc="lower right", fontsize="small")
    fig.suptitle("Recall@1 against epochs and against training time")
    return fig


@dataclass(frozen=True)
class CompareResult:
    text: str  # the table in the format asked for
    written: tuple[Path, ...]  # files under --out
    left_out: tuple[str, ...] = ()  # columns a table of a given width has no room for


def compare(
    paths: list[Path],
    fmt: str = "table",
    out: Path | None = None,
    at: tuple[int, ...] = (),
    width: int | None = None,
) -> CompareResult:
    """The comparison of the runs under `paths` as `fmt` (with Recall@1 and MAP@R after each
    epoch of `at`), a table within `width` characters where one is given (rendered); with
    `out`, also compare.csv, compare.md (every column) and compare.png (the figure)."""
    from pactl.report import save_figure
    from pactl.store.generations import atomic_write_text, make_folder

    runs = [read_run(p) for p in find_runs(paths)]
    groups = group_runs(runs)
    frame = summary(groups, at)
    published = published_column(frame, groups)
    if any(published):
        frame.insert(len(IDENTITY), "published recall@1", published)
    written: list[Path] = []
    if out is not None:
        make_folder(out)
        table, markdown, picture = (out / name for name in OUTPUT_FILES)
        for path, kind in ((table, "csv"), (markdown, "markdown")):
            atomic_write_text(path, _every_column(frame, kind))
            written.append(path)
        save_figure(figure(groups), picture)
        written.append(picture)
    text, left_out = rendered(frame, fmt, width)
    return CompareResult(text, tuple(written), tuple(left_out))
