"""`pactl plot RUN`: pictures of a run's embedding space, like the paper's appendix.

tsne.png: a sample of the test embeddings (best.pt) in 2-D by scikit-learn's t-SNE, coloured by
class, with thumbnails of some images at their points and a legend naming the classes (or
saying how many there are, past the colours there are to tell them apart). retrieval.png:
queries from the same sample with their top 4 among it (the query itself left out), framed green
when of the query's class and red when not (pactl.report.retrieval_grid).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pactl.config import check_options, setting
from pactl.console import Reporter
from pactl.errors import PactlError, UsageError
from pactl.rules import MAX_WORKERS, device, integer, number

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class PlotConfig:
    points: int = setting(
        2000, integer(4, 20000), "Test images sampled for t-SNE and the retrieval figure."
    )
    thumbnails: int = setting(40, integer(0), "Images drawn at their t-SNE points.")
    queries: int = setting(8, integer(1), "Rows of the retrieval figure.")
    k: int = setting(4, integer(1), "Hits per query.", cli=False)
    perplexity: float = setting(
        30.0, number(0, 1e6, above=True), "t-SNE perplexity (lowered for small samples).",
        cli=False,
    )  # fmt: skip
    seed: int = setting(0, integer(0), "Seeds the sample, the queries and t-SNE.")
    device: str = setting("auto", device(), "Where the run's network embeds.")
    workers: int = setting(0, integer(0, MAX_WORKERS), "DataLoader worker processes.")


@dataclass(frozen=True)
class Sample:
    paths: list[str]
    labels: list[str]  # class names
    vectors: np.ndarray  # (N, D) float32 unit rows


def sample_test(run: Path, config: PlotConfig, reporter: Reporter) -> Sample:
    """Up to config.points images of the run's test split (a seeded sample), embedded by
    its best.pt (through the run's embeddings, pactl.embed.cache)."""
    from pactl.checkpoint import open_network
    from pactl.datasets import load_source
    from pactl.embed import embed_files
    from pactl.embed.cache import embed_cached, run_cache
    from pactl.runtime import resolve_device

    try:
        info = json.loads((run / "config.json").read_bytes())
        source = str(info["dataset"])
    except (OSError, ValueError, KeyError, TypeError):
        raise PactlError(f"{run} is not a run folder (no readable config.json)") from None
    if not (run / "best.pt").is_file():
        raise PactlError(f"{run} has no best.pt yet: let it train for an epoch")
    follow = bool(info.get("train_config", {}).get("follow_links", False))
    manifest = load_source(source, reporter, follow_links=follow)
    test = manifest.select(*manifest.eval_splits())
    rng = np.random.default_rng(config.seed)
    rows = np.sort(rng.permutation(len(test))[: config.points])
    part = test.subset(rows.tolist())
    model, network = open_network(run / "best.pt")
    device = resolve_device(config.device)
    model.to(device)
    cache = run_cache(run / "best.pt", network)  # the run's embeddings: eval's and index's too
    if cache is None:
        done = embed_files(
            model, part.files(), network.config, device, reporter, workers=config.workers,
            draft=False,
        )  # fmt: skip
    else:
        done = embed_cached(cache, model, part.files(), device, reporter, config.workers)
    paths = [str(part.files()[i]) for i in done.rows]
    labels = [part.class_names[i] for i in done.rows]
    return Sample(paths, labels, np.asarray(done.vectors, dtype=np.float32))


def tsne_points(vectors: np.ndarray, config: PlotConfig) -> np.ndarray:
    """(N, 2) t-SNE of unit rows (cosine distance); the perplexity is kept below N / 3."""
    from sklearn.manifold import TSNE

    n = len(vectors)
    if n < 4:
        raise PactlError(f"t-SNE needs at least 4 test images; the sample has {n}")
    perplexity = min(config.perplexity, (n - 1) / 3)
    tsne = TSNE(
        n_components=2,
        perplexity=perplexity,
        init="pca",
        metric="cosine",
        random_state=config.seed,
    )
    return np.asarray(tsne.fit_transform(vectors.astype(np.float64)))


def tsne_figure(sample: Sample, points: np.ndarray, config: PlotConfig) -> Figure:
    """The 2-D points coloured by class, and config.thumbnails images drawn at theirs."""
    from matplotlib.figure import Figure
    from matplotlib.offsetbox import AnnotationBbox, OffsetImage

    from pactl.images import ImageError, load_image
    from pactl.report import fit_tile

    classes = sorted(set(sample.labels))
    fig = Figure(figsize=(9, 9), layout="constrained")
    ax = fig.subplots()
    labels = np.asarray(sample.labels)
    beside: dict[str, Any] = {"bbox_to_anchor": (1.01, 1.0), "fontsize": "small"}
    if len(classes) <= NAMED_CLASSES:
        drawn = []
        for i, name in enumerate(classes):
            at = points[labels == name]
            drawn.append(ax.scatter(at[:, 0], at[:, 1], color=class_colour(i), s=8, alpha=0.8))
        names = [legend_text(name) for name in classes]  # given, not read: "_x" would hide
        ax.legend(drawn, names, loc="upper left", title="class", markerscale=2, **beside)
    else:
        codes = [classes.index(c) for c in sample.labels]
        ax.scatter(points[:, 0], points[:, 1], c=codes, cmap="tab20", s=8, alpha=0.8)
        many = f"{len(classes)} classes: too many to name"
        ax.legend(handles=[], loc="upper left", title=many, **beside)
    rng = np.random.default_rng(config.seed + 1)
    for i in rng.permutation(len(points))[: config.thumbnails]:
        try:
            image = fit_tile(load_image(Path(sample.paths[i]), target_size=48), 48)
        except ImageError:
            continue
        box = AnnotationBbox(
            OffsetImage(np.asarray(image), zoom=0.6), points[i], frameon=True, pad=0.1
        )
        box.set_gid("thumbnail")
        ax.add_artist(box)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"t-SNE of {len(points)} test embeddings, {len(classes)} classes")
    return fig


NAMED_CLASSES = 20  # the classes a legend names: as many as tab20 has colours to tell apart


def class_colour(i: int) -> tuple[float, ...]:
    """The i-th class's colour (matplotlib's tab20, RGBA)."""
    from matplotlib import colormaps

    return tuple(colormaps["tab20"](i % 20))


def legend_text(name: str, most: int = 32) -> str:
    """A class name as a legend shows it: printable, cut at `most` characters, and `$` escaped,
    so a name is never read as mathtext."""
    from pactl.console import visible

    shown = visible(name)
    shown = shown if len(shown) <= most else shown[: most - 1] + "…"
    return shown.replace("$", r"\$")


Rows = list[tuple[str, str | None, list[tuple[str, str, float]]]]  # as retrieval_grid takes


def retrieval_rows(sample: Sample, queries: list[int], k: int) -> Rows:
    """Each query's top k among the sample by cosine, the query itself left out by index."""
    scores = sample.vectors[queries] @ sample.vectors.T  # (Q, N) cosine of unit rows
    scores[np.arange(len(queries)), queries] = -np.inf
    rows: Rows = []
    for q, row in zip(queries, scores, strict=True):
        top = np.argsort(-row, kind="stable")[:k]
        hits = [(sample.paths[j], sample.labels[j], float(row[j])) for j in top]
        rows.append((sample.paths[q], sample.labels[q], hits))
    return rows


PICTURES = ("tsne.png", "retrieval.png")  # what plot_run writes into its folder
READS = ("best.pt", "config.json")  # what it reads of the run: never an output


@dataclass(frozen=True)
class PlotResult:
    written: tuple[Path, ...]
    images: int  # test images embedded


def plot_run(run: Path, out: Path, config: PlotConfig, reporter: Reporter) -> PlotResult:
    """tsne.png and retrieval.png of the run in `out`."""
    from pactl.report import retrieval_grid, save_figure
    from pactl.store.generations import make_folder

    check_options(config, UsageError)
    make_folder(out)
    sample = sample_test(run, config, reporter)
    with reporter.bar(f"t-SNE of {len(sample.vectors)} test embeddings", total=None):
        points = tsne_points(sample.vectors, config)
    tsne, retrieval = (out / name for name in PICTURES)
    save_figure(tsne_figure(sample, points, config), tsne)
    rng = np.random.default_rng(config.seed + 2)
    queries = rng.permutation(len(sample.paths))[: config.queries].tolist()
    retrieval_grid(retrieval_rows(sample, queries, config.k), retrieval)
    return PlotResult((tsne, retrieval), len(sample.paths))
