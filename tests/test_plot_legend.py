"""pactl plot's t-SNE map names its classes in a legend, each beside its points' colour, or says
how many there are when there are more than its colours can tell apart."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.collections import PathCollection

from pactl.research.plot import NAMED_CLASSES, PlotConfig, Sample, tsne_figure

LONG = "a class named at much greater length than a legend has room for"


def sample_of(names: list[str], per_class: int = 3) -> tuple[Sample, np.ndarray]:
    """A sample of `per_class` points per class (the t-SNE points given, not computed)."""
    labels = [name for name in names for _ in range(per_class)]
    rng = np.random.default_rng(0)
    points = rng.standard_normal((len(labels), 2))
    vectors = np.zeros((len(labels), 2), dtype=np.float32)
    return Sample(["unused.png"] * len(labels), labels, vectors), points


def test_the_legend_names_each_class_beside_its_points_colour() -> None:
    names = ["cat", "_hidden", "$\\frac$", LONG, "dog"]
    sample, points = sample_of(names)
    fig = tsne_figure(sample, points, PlotConfig(thumbnails=0))
    ax = fig.axes[0]
    legend = ax.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    # Sorted; shown as pactl shows names (a backslash doubled) and "$" escaped, so a name is
    # no mathtext; "_hidden" kept (matplotlib drops labels that start with "_" when it collects
    # them itself); the long name cut with an ellipsis.
    assert texts == ["\\$\\\\frac\\$", "_hidden", LONG[:31] + "…", "cat", "dog"]
    assert legend.get_title().get_text() == "class"
    labels = np.asarray(sample.labels)
    collections = [c for c in ax.collections if isinstance(c, PathCollection)]
    colours = []
    for name, handle in zip(sorted(names), legend.legend_handles, strict=True):
        mine = points[labels == name]
        (drawn,) = [c for c in collections if np.array_equal(c.get_offsets(), mine)]
        assert np.allclose(handle.get_facecolor()[0][:3], drawn.get_facecolor()[0][:3])
        colours.append(tuple(np.round(drawn.get_facecolor()[0][:3], 4)))
    assert len(set(colours)) == len(names)
    fig.savefig(io.BytesIO(), format="png")  # "$\frac$" unescaped fails to draw as mathtext


def test_too_many_classes_to_name_are_counted() -> None:
    sample, points = sample_of([f"c{i}" for i in range(NAMED_CLASSES + 5)], per_class=2)
    fig = tsne_figure(sample, points, PlotConfig(thumbnails=0))
    legend = fig.axes[0].get_legend()
    assert legend.get_title().get_text() == f"{NAMED_CLASSES + 5} classes: too many to name"
    assert legend.get_texts() == []
    sample, points = sample_of([f"c{i}" for i in range(NAMED_CLASSES)], per_class=2)
    named = tsne_figure(sample, points, PlotConfig(thumbnails=0)).axes[0].get_legend()
    assert len(named.get_texts()) == NAMED_CLASSES
