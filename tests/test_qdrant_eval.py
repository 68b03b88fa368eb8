"""`pactl eval --qdrant`: the recall@10 of a collection's search, measured against pactl's exact
neighbours over the vectors it holds, checked against a float64 brute force of ours; the
collection's tuned search is what a server is sent; the figures sit beside eval's own rows.

qdrant-client's local mode searches exactly, so a search that misses points (as a graph search
may) is stood in for by a client that drops some ids from every answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import one_error, run_cli, unit

pytest.importorskip("qdrant_client")

from pactl.config import QdrantConfig  # noqa: E402
from pactl.interop import qdrant  # noqa: E402
from pactl.store.item_table import ItemTable  # noqa: E402

N, DIM, K = 300, 16, 10  # fewer points than the 1,000 queries asked: every point is a query
IDS = 3 * np.arange(N, dtype=np.int64) + 5  # point ids are not rows


class Dropping:
    """A local-mode client whose search never finds the points `hidden` names, as a graph
    search can miss them; each request's search parameters are recorded and not passed on
    (local mode compares every point whatever it is told)."""

    def __init__(self, client: Any, hidden: set[int]) -> None:
        self.client, self.hidden = client, hidden
        self.params: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def query_batch_points(self, name: str, requests: list[Any]) -> list[Any]:
        self.params += [r.params for r in requests]
        wider = [r.model_copy(update={"limit": r.limit + len(self.hidden), "params": None})
                 for r in requests]  # fmt: skip
        answers = self.client.query_batch_points(name, requests=wider)
        for request, answer in zip(requests, answers, strict=True):
            kept = [p for p in answer.points if int(p.id) not in self.hidden]
            answer.points = kept[: request.limit]
        return answers


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    """A local-mode folder holding collection "c": N random unit vectors, ids IDS."""
    folder = tmp_path_factory.mktemp("qdrant") / "qd"
    x = unit(np.random.default_rng(7).standard_normal((N, DIM))).astype(np.float32)
    items = ItemTable(IDS, [f"img/{i}.png" for i in IDS], [str(i % 5) for i in IDS])
    qdrant.export_vectors(x, items, str(folder), QdrantConfig(collection="c"))
    return str(folder), x


def brute_force_recall(x: np.ndarray, hidden: set[int]) -> float:
    """float64: each point's 10 nearest others, against the 10 nearest others not hidden."""
    scores = x.astype(np.float64) @ x.astype(np.float64).T
    np.fill_diagonal(scores, -np.inf)  # a query's own point is not its neighbour
    truth = np.argsort(-scores, axis=1, kind="stable")[:, :K]
    scores[:, [i for i, point in enumerate(IDS) if int(point) in hidden]] = -np.inf
    found = np.argsort(-scores, axis=1, kind="stable")[:, :K]
    return float(np.mean([len(set(t) & set(f)) / K for t, f in zip(truth, found, strict=True)]))


def test_the_recall_reported_is_the_searchs_against_brute_force(
    collection: tuple[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, x = collection
    hidden = {int(i) for i in IDS[::4]}
    stand_in = Dropping(qdrant.connect(folder), hidden)
    monkeypatch.setattr(qdrant, "connect", lambda target: stand_in)
    figures = qdrant.eval_collection(folder, "c")
    want = brute_force_recall(x, hidden)
    assert 0.5 < want < 0.9  # the stand-in does miss neighbours
    assert figures["qdrant_recall@10"] == pytest.approx(want, abs=1e-9)
    assert figures["qdrant_ms_per_query"] > 0
    assert stand_in.params and all(p is None for p in stand_in.params)  # local mode: none sent


def test_a_server_is_sent_the_tuned_search_of_the_collections_metadata(
    collection: tuple[str, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, x = collection
    stand_in = Dropping(qdrant.connect(folder), set())
    monkeypatch.setattr(qdrant, "connect", lambda target: stand_in)
    tuned = stand_in.get_collection("c").config.metadata["pactl_search"]
    assert tuned["hnsw_ef"] is not None and tuned["oversampling"] is not None
    figures = qdrant.eval_collection("http://stand-in:6333", "c")
    assert figures["qdrant_recall@10"] == pytest.approx(brute_force_recall(x, set()), abs=1e-9)
    assert len(stand_in.params) == N
    for params in stand_in.params:
        assert params.hnsw_ef == tuned["hnsw_ef"] and params.exact is not True
        assert params.quantization.oversampling == tuned["oversampling"]


def test_eval_prints_the_qdrant_figures_beside_the_networks(
    collection: tuple[str, np.ndarray],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from conftest import make_class_folder

    folder, _ = collection
    imgs = make_class_folder(tmp_path / "imgs", classes=4, per_class=3, seed=2)
    model = ["--backbone", "small", "--weights", "none", "--image-size", "16"]
    args = ["eval", str(imgs), *model, "--report", str(tmp_path / "e.csv"), "--overwrite"]
    code, out, err = run_cli([*args, "--qdrant", folder, "--collection", "c"], monkeypatch, capsys)
    assert code == 0, err
    values = {line.split()[0]: float(line.split()[1]) for line in out.splitlines()}
    assert {"recall@1", "map@r", "qdrant_recall@10", "qdrant_ms_per_query"} <= set(values)
    assert values["qdrant_recall@10"] == 1.0  # local mode searches exactly
    header = (tmp_path / "e.csv").read_text().splitlines()[0]
    assert header.endswith("qdrant_recall@10,qdrant_ms_per_query")
    code, out, err = run_cli([*args, "--qdrant", folder, "--collection", "nope"], monkeypatch,
                             capsys)  # fmt: skip
    assert code == 1 and out == "" and "has no Qdrant collection 'nope'" in one_error(err)
    code, _, err = run_cli([*args, "--collection", "c"], monkeypatch, capsys)
    assert code == 2 and "--collection goes with --qdrant" in one_error(err)
