"""The Python API under bad input: every argument of every public function and class is checked
as the CLI checks its options (one PactlError line, never a TypeError from deep inside); the
public losses give NaN for NaN embeddings (as pytorch-metric-learning's do) and refuse NaN
settings; Index.search refuses NaN, Inf and zero query rows and scores any other row as the
cosine of its direction; a run whose loss turns NaN stops in one line, saving nothing of it."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, make_class_folder, one_error, run_cli
from test_api import bundle  # noqa: F401  (the fixture: a bundle of tiny_run's network)

import pactl
from pactl.errors import PactlError

NAN = float("nan")


def one_line(e: pytest.ExceptionInfo[PactlError]) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: pactl.train("photos", name=123), "train: name must be a non-empty string"),
        (lambda: pactl.train(resume=123), "train: resume must be a path"),
        (lambda: pactl.evaluate(123), "evaluate: checkpoint must be a checkpoint's path"),
        (lambda: pactl.open_index(123), "open_index: path must be a path"),
        (lambda: pactl.open_index("b", device=7), "open_index: device must be auto, cpu"),
        (lambda: pactl.build_index("v", target_recall=NAN), "target_recall must be a number"),
        (lambda: pactl.build_index("v", bits="64"), "build_index: bits must be an integer"),
        (lambda: pactl.embed_folder("p", "m.pt", batch_size=0), "batch_size must be an integer"),
        (lambda: pactl.read_vectors(None), "read_vectors: folder must be a path"),
        (lambda: pactl.load_model(b"x.pt"), "load_model: checkpoint must be"),
        (lambda: pactl.evaluate("m.pt", ks=[1, "2"]), "evaluate: ks must be a list of integers"),
        (lambda: pactl.open_index("b", nonsense=1), "open_index: got an unexpected keyword"),
    ],
)
def test_a_wrong_argument_is_one_pactl_error_line_before_any_work(call, says: str) -> None:
    with pytest.raises(PactlError) as e:
        call()
    assert says in one_line(e)


def test_query_and_search_arguments_are_checked(bundle: Path) -> None:  # noqa: F811
    index = pactl.open_index(bundle)
    image = next(p for p in sorted((bundle.parent / "photos").rglob("*.png")))
    unit = np.eye(index.dimension, dtype=np.float32)[:1]
    for kwargs, says in (
        ({"k": "abc"}, "Index.query: k must be an integer of at least 1, not 'abc' (str)"),
        ({"k": 1.5}, "Index.query: k must be an integer of at least 1, not 1.5 (float)"),
        ({"k": 0}, "Index.query: k must be an integer of at least 1"),
        ({"rescore": "abc"}, "Index.query: rescore must be an integer of at least 0, or None"),
        ({"exclude_self": "yes"}, "Index.query: exclude_self must be true or false"),
    ):
        with pytest.raises(PactlError) as e:
            index.query(image, **kwargs)
        assert says in one_line(e)
    with pytest.raises(PactlError, match="Index.search: rescore must be an integer"):
        index.search(unit, rescore="abc")
    with pytest.raises(PactlError, match="Index.search: vectors must be"):
        index.search("not vectors")
    assert index.query(image, k=np.int64(2))[0][0].path == str(image)  # numpy's integers do


def test_search_refuses_nan_inf_and_zero_rows_and_scores_directions(bundle: Path) -> None:  # noqa: F811
    from PIL import Image

    index = pactl.open_index(bundle)
    items = index.bundle.items.paths.tolist()
    stored = index.vectors_of([Image.open(p) for p in items]).astype(np.float64)  # (N, D)
    queries = stored[:3].astype(np.float32)
    for value, says in (
        (NAN, "holds NaN or Inf"),
        (math.inf, "holds NaN or Inf"),
        (0, "is all zeros"),
    ):
        bad = queries.copy()
        bad[1] = 0.0
        bad[1, 0] = value
        with pytest.raises(PactlError, match=f"query vector 1 {says}"):
            index.search(bad, k=2)
    # ten times too long (and one a tenth): the cosines of their directions, by brute force
    scaled = queries * np.array([[10.0], [0.1], [3.0]], dtype=np.float32)
    found = index.search(scaled, k=3)
    direction = scaled.astype(np.float64)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    cosines = direction @ stored.T  # (3, N)
    for row, hits in enumerate(found):
        best = np.argsort(-cosines[row], kind="stable")[:3]
        assert [h.path for h in hits] == [items[i] for i in best]
        assert [h.score for h in hits] == pytest.approx(cosines[row, best].tolist(), abs=1e-4)


def test_every_public_function_and_class_checks_its_arguments() -> None:
    """Guards against a public name of the API left unchecked: each function, each loss's
    constructor and each Index method that takes arguments goes through pactl.arguments'
    decorator (which refuses, as pactl is imported, an argument without a rule)."""
    records = {"Hit", "Run", "Vectors"}  # results pactl makes, never made by a caller
    for name in sorted(set(pactl.__all__) - {"__version__"} - records):
        thing = getattr(pactl, name)
        if not inspect.isclass(thing):
            assert hasattr(thing, "__wrapped__"), name
            continue
        methods = [m for m in vars(thing).values() if inspect.isfunction(m)]
        taking = [m for m in methods if len(inspect.signature(m).parameters) > 1]
        unchecked = [m.__name__ for m in taking if not hasattr(m, "__wrapped__")]
        unchecked = [n for n in unchecked if not n.startswith("_") or n == "__init__"]
        assert not [n for n in unchecked if n not in ("forward", "reset_parameters")], name


LOSS_CASES = [
    lambda: pactl.ContrastiveLoss(),
    lambda: pactl.TripletMarginLoss(),
    lambda: pactl.TripletLoss(),
    lambda: pactl.CosineContrastiveLoss(),
    lambda: pactl.MultiSimilarityLoss(),
    lambda: pactl.MultiSimilarityLoss(epsilon=0.1),
    lambda: pactl.ProxyAnchorLoss(4, 8),
    lambda: pactl.ProxyNCALoss(4, 8),
]


@pytest.mark.parametrize("make", LOSS_CASES)
def test_a_nan_embedding_gives_a_nan_loss(make) -> None:  # type: ignore[no-untyped-def]
    """pytorch-metric-learning's losses give NaN for a NaN embedding; a finite loss with NaN
    gradients (a NaN distance taken for 0, a NaN pair mined away) trains on NaN unseen."""
    torch.manual_seed(0)
    embeddings = torch.randn(8, 8)
    embeddings[2, 3] = NAN
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert torch.isnan(make()(embeddings, labels))
    assert torch.isfinite(make()(torch.nan_to_num(embeddings), labels))


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: pactl.ProxyAnchorLoss(4, 8, alpha=NAN), "alpha must be a finite number above 0"),
        (lambda: pactl.ProxyAnchorLoss(4, 8, alpha=0), "alpha must be a finite number above 0"),
        (lambda: pactl.ProxyAnchorLoss(4, 8, margin=NAN), "margin must be a finite number"),
        (lambda: pactl.ProxyAnchorLoss(4.5, 8), "num_classes must be an integer"),
        (lambda: pactl.ProxyNCALoss(4, 8, softmax_scale=math.inf), "softmax_scale must be"),
        (lambda: pactl.MultiSimilarityLoss(beta=NAN), "beta must be a finite number above 0"),
        (lambda: pactl.TripletMarginLoss(margin="0.1"), "margin must be a finite number"),
        (lambda: pactl.ContrastiveLoss(neg_margin=NAN), "neg_margin must be a finite number"),
    ],
)
def test_loss_settings_are_checked(make, says: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PactlError) as e:
        make()
    assert says in one_line(e)


def test_the_pure_loss_refuses_nan_settings() -> None:
    from pactl.losses import proxy_anchor_loss

    x, p = torch.randn(4, 8), torch.randn(3, 8)
    for alpha, delta in ((NAN, 0.1), (32.0, NAN), (math.inf, 0.1)):
        with pytest.raises(ValueError, match="alpha must be > 0 and finite"):
            proxy_anchor_loss(x, torch.tensor([0, 1, 2, 0]), p, alpha, delta)


def test_a_run_whose_loss_turns_nan_stops_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loss made NaN from the third step on: the run stops at that step, saying so in one
    line, and leaves no checkpoint taken after it."""
    from pactl import losses

    steps = {"n": 0}
    real = losses.proxy_anchor_loss

    def turning_nan(*args, **kwargs):  # type: ignore[no-untyped-def]
        steps["n"] += 1
        loss = real(*args, **kwargs)
        return loss * NAN if steps["n"] >= 3 else loss

    monkeypatch.setattr(losses, "proxy_anchor_loss", turning_nan)
    make_class_folder(tmp_path / "imgs", classes=4, per_class=8)
    args = ["train", str(tmp_path / "imgs"), *TINY, "--epochs", "3", "--name", "nan"]
    code, out, err = run_cli([*args, "--quiet"], monkeypatch, capsys)
    assert code == 1 and "the loss became nan at epoch" in one_error(err), err
    assert steps["n"] == 3  # no step after the NaN one
    for saved in (tmp_path / "runs" / "nan").glob("*.pt"):
        state = torch.load(saved, weights_only=True)
        weights = state["model"].values()
        assert all(torch.isfinite(w).all() for w in weights if w.is_floating_point()), saved
