"""The Python API (pactl.api) against the CLI it shares its library calls with, and the code
blocks of docs/api.md run as they are written."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_class_folder, run_cli
from PIL import Image

DOCS = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def tiny_run(root: Path) -> Path:
    """root/photos (4 classes x 4 images) and root/best.pt, an untrained TINY network made in a
    fraction of a second."""
    import torch

    from pactl import checkpoint
    from pactl.config import ModelConfig
    from pactl.model import build_model

    make_class_folder(root / "photos", classes=4, per_class=4)
    config = ModelConfig(
        backbone="small", weights="none", embedding_dim=16, image_size=16, resize_size=16
    )
    torch.manual_seed(0)
    net, filled = build_model(config)
    weights = checkpoint.clean_state_dict(net)
    payload = checkpoint.export_payload(weights, filled, [f"class_{c}" for c in range(4)], 1, {})
    checkpoint.save(root / "best.pt", payload)
    return root / "best.pt"


@pytest.fixture
def bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    tiny_run(tmp_path)
    code, _, err = run_cli(
        ["index", "photos", "--checkpoint", "best.pt", "--out", "bundle", "--quiet"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    return tmp_path / "bundle"


def cli_hits(args: list[str], monkeypatch, capsys) -> list[list[tuple[int, str, str, float]]]:
    code, out, err = run_cli(["query", *args, "--format", "jsonl", "--quiet"], monkeypatch, capsys)
    assert code == 0, err
    rows: dict[str, list[tuple[int, str, str, float]]] = {}
    for line in out.splitlines():
        row = json.loads(line)
        rows.setdefault(row["query"], []).append(
            (row["id"], row["path"], row["label"], row["score"])
        )
    return list(rows.values())


def test_api_answers_as_pactl_query_does(bundle: Path, monkeypatch, capsys) -> None:
    import pactl

    queries = sorted(str(p) for p in Path("photos").glob("class_*/[01].png"))
    index = pactl.open_index(bundle)
    for extra in ([], ["--exclude-self"]):
        api = index.query(queries, k=5, exclude_self=bool(extra))
        want = cli_hits([*queries, "--k", "5", "--index", str(bundle), *extra], monkeypatch, capsys)
        got = [[(h.id, h.path, h.label, round(h.score, 6)) for h in row] for row in api]
        assert got == [[(i, p, lab, round(s, 6)) for i, p, lab, s in row] for row in want]
    assert [row[0].path for row in index.query(queries)] == [os.path.abspath(q) for q in queries]


def test_pil_images_and_tensors_find_what_their_files_find(bundle: Path) -> None:
    import pactl

    index = pactl.open_index(bundle)
    files = sorted(Path("photos").glob("class_2/*.png"))[:3]
    by_path = index.query(files, k=3)
    pictures = [Image.open(f) for f in files]
    by_picture = index.query(pictures, k=3)
    by_tensor = index.query(__import__("torch").stack([index.preprocess(p) for p in pictures]), k=3)
    for a, b, c in zip(by_path, by_picture, by_tensor, strict=True):
        assert [h.id for h in a] == [h.id for h in b] == [h.id for h in c]
        np.testing.assert_allclose([h.score for h in a], [h.score for h in c], atol=1e-5)


def test_exact_scores_are_inner_products_of_the_embedded_vectors(bundle: Path) -> None:
    """The reference: brute-force inner products over the vectors folder the bundle came from."""
    import pactl

    index = pactl.open_index(bundle)
    stored = pactl.read_vectors(bundle / "vectors")
    query = stored.vectors[5:6]
    expected = np.argsort(-(stored.vectors.astype(np.float64) @ query[0]))[:4]
    hits = index.search(query, k=4)[0]
    assert [h.id for h in hits] == stored.items.ids[expected].tolist()


def test_read_vectors_returns_the_record_the_library_reads(bundle: Path) -> None:
    """pactl.read_vectors hands on the library's own reading, not a copy of another type: one
    Vectors record from every reader, with names and unpacking as `vectors, items, meta`."""
    import pactl
    from pactl.embed import read_embedded
    from pactl.verbs.vector_sources import gather_vectors

    got = pactl.read_vectors(bundle / "vectors")
    one = read_embedded(bundle / "vectors")
    assert type(got) is type(gather_vectors(bundle / "vectors")) is type(one) is pactl.Vectors
    vectors, items, meta = got
    assert vectors is got.vectors and items is got.items and meta is got.meta
    np.testing.assert_array_equal(vectors, one.vectors)
    assert items.paths.tolist() == one.items.paths.tolist() and meta == one.meta


def test_add_and_delete_switch_generations_like_the_cli(bundle: Path, monkeypatch, capsys) -> None:
    import pactl

    index = pactl.open_index(bundle)
    before = len(index)
    make_class_folder(Path("more"), classes=1, per_class=3, seed=7)
    done = index.add("more")
    assert done == {"added": 3, "replaced": 0, "count": before + 3}
    assert len(index) == before + 3
    gone = str(next(Path("more").rglob("*.png")).resolve())
    assert index.delete(paths=[gone]) == 1
    assert gone not in [h.path for h in index.query(gone, k=len(index))[0]]
    cli = cli_hits([gone, "--index", str(bundle), "--k", "50"], monkeypatch, capsys)[0]
    assert len(cli) == before + 2 and gone not in [path for _, path, _, _ in cli]
    assert json.loads((bundle / "meta.json").read_text())["count"] == before + 2


def test_unreadable_query_file_is_one_error(bundle: Path) -> None:
    import pactl
    from pactl.errors import PactlError

    Path("broken.png").write_bytes(b"not a png")
    with pytest.raises(PactlError, match="broken.png"):
        pactl.open_index(bundle).query("broken.png")


def test_load_model_is_the_network_that_made_the_vectors(bundle: Path) -> None:
    import torch

    import pactl

    model = pactl.load_model("best.pt")
    assert isinstance(model, torch.nn.Module) and not model.training
    index = pactl.open_index(bundle)
    picture = Image.open(sorted(Path("photos").glob("class_1/*.png"))[0])
    with torch.no_grad():
        mine = model(index.preprocess(picture)[None]).numpy()
    np.testing.assert_allclose(mine, index.vectors_of([picture]), atol=1e-5)


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_docs_api_page_runs(tmp_path: Path, capsys) -> None:
    """Every ```python block of docs/api.md, in order, in one namespace, in a folder holding
    what the page names: photos/, new_photos/, runs/demo/best.pt; what the blocks print and
    leave behind is what the page says, checked against the files and a brute-force search."""
    import pactl

    tiny_run(tmp_path)
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    (tmp_path / "best.pt").rename(tmp_path / "runs" / "demo" / "best.pt")
    make_class_folder(tmp_path / "new_photos", classes=2, per_class=2, seed=3)
    blocks = code_blocks(DOCS.read_text(encoding="utf-8"))
    assert len(blocks) >= 3
    namespace: dict[str, Any] = {}
    for block in blocks:
        exec(compile(block, str(DOCS), "exec"), namespace)  # noqa: S102
    lines = capsys.readouterr().out.splitlines()
    first = tmp_path.resolve() / "photos" / "class_0" / "0.png"
    # Embed: 4 classes x 4 images of the 16-d network; the first item and its class folder.
    assert lines[:2] == ["(16, 16) 16", f"{first} class_0"]
    assert lines[2] == "Index('bundle', 16 items, dimension 16) 16 16"
    # Query: the 4 nearest to photos/class_0/0.png but itself, as brute force ranks them.
    vectors = pactl.read_vectors(tmp_path / "vectors")
    paths = [str(Path(p).resolve()) for p in vectors.items.paths]
    scores = vectors.vectors.astype(np.float64) @ vectors.vectors[paths.index(str(first))]
    scores[paths.index(str(first))] = -np.inf
    best = np.argsort(-scores, kind="stable")[:5]
    assert scores[best[3]] - scores[best[4]] > 1e-4  # the top 4 is not a tie with the 5th
    hits = [line.split() for line in lines[3:7]]
    assert [h[0] for h in hits] == ["1", "2", "3", "4"]
    assert {h[2] for h in hits} == {paths[i] for i in best[:4]}
    for _, id_, path, label, score in hits:
        row = paths.index(path)
        assert int(id_) == int(vectors.items.ids[row]) and label == Path(path).parent.name
        assert float(score) == pytest.approx(scores[row], abs=6e-4)  # printed to 3 places
    several = namespace["several"]
    assert [len(row) for row in several] == [2, 2]
    for row, name in zip(several, ("class_1", "class_2"), strict=True):  # itself, first
        assert Path(row[0].path).resolve() == tmp_path.resolve() / "photos" / name / "0.png"
        assert row[0].score == pytest.approx(1.0, abs=1e-5)
    # Add and delete: 4 new images, one deleted again by the id its own query found.
    assert lines[7:9] == ["4 added, 20 in all", "19 items"]
    gone = namespace["gone"]
    assert Path(gone.path).resolve() == tmp_path.resolve() / "new_photos" / "class_0" / "0.png"
    again = pactl.open_index(tmp_path / "bundle")
    left = again.search(vectors.vectors[:1], k=20)
    assert len(again) == 19 and gone.id not in {h.id for h in left[0]}
    # A checkpoint as a torch module: two unit rows of 16.
    assert lines[9] == "torch.Size([2, 16])"  # what the blocks after print: test_api_train.py
    import torch

    with torch.no_grad():
        out = namespace["model"](namespace["x"])
    np.testing.assert_allclose(out.norm(dim=1).numpy(), 1.0, atol=1e-5)
