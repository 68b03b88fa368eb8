"""The Python API (pactl.api) against the CLI it shares its library calls with, and the code
blocks of docs/api.md run as they are written."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

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
    what the page names: photos/, new_photos/, runs/demo/best.pt."""
    tiny_run(tmp_path)
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    (tmp_path / "best.pt").rename(tmp_path / "runs" / "demo" / "best.pt")
    make_class_folder(tmp_path / "new_photos", classes=2, per_class=2, seed=3)
    blocks = code_blocks(DOCS.read_text(encoding="utf-8"))
    assert len(blocks) >= 3
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(DOCS), "exec"), namespace)  # noqa: S102
    assert "photos" in capsys.readouterr().out
