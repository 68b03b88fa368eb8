"""`pactl serve SET`: a bundle set served by a real `pactl serve` process on 127.0.0.1 answers
POST /query (the search page's call: uploads, and ?id= with exclude_self) with the hits
`pactl query` gives on the one bundle over the same items; a set whose shard was damaged after
it was built makes serve refuse to start, in one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import one_error, run_cli
from test_serve import (
    Service,
    _cli,
    free_port,
    local_jsonl,
    same_hits,
    start_service,
    stop_service,
    tiny_images_and_checkpoint,
)

from pactl.store.generations import current_dir

pytest.importorskip("fastapi")

SHARD_ITEMS = 6  # 16 items: shard bundles of 6, 6 and 4


def build_set_and_bundle(root: Path) -> None:
    """root/imgs (4 classes x 4 images), root/best.pt (an untrained tiny network),
    root/vectors (its embeddings), root/set (a bundle set of them, three shard bundles) and
    root/one (the one bundle of the same vectors)."""
    tiny_images_and_checkpoint(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACTL_HOME", str(root / "home"))
        patch.chdir(root)
        _cli(["embed", "imgs", "--checkpoint", "best.pt", "--out", "vectors", "--quiet"])
        _cli(["index", "vectors", "--shard-items", str(SHARD_ITEMS), "--out", "set", "--quiet"])
        _cli(["index", "vectors", "--out", "one", "--quiet"])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve-set")
    build_set_and_bundle(root)
    return root


@pytest.fixture(scope="module")
def served_set(built: Path) -> Any:
    service = start_service(built, served="set")
    yield service
    stop_service(service)


def test_serve_answers_a_set_as_query_answers_the_one_bundle(
    served_set: Service, monkeypatch: Any, capsys: Any
) -> None:
    root = served_set.root
    one = Service(served_set.url, served_set.process, root, served_set.log, served="one")
    with served_set.client(token=None) as client:
        health = client.get("/health").json()
        assert health["items"] == 16
        picks = served_set.images[::3]  # items of every shard bundle
        reply = client.post("/query", params={"k": 8}, files=[upload(p) for p in picks])
        assert reply.status_code == 200, reply.text
        reference = local_jsonl(one, picks, monkeypatch, capsys, "--k", "8")
        for picked, result in zip(picks, reply.json()["results"], strict=True):
            same_hits(result["hits"], reference[str(picked)])
            # 8 hits: more than one shard bundle (of at most 6 items) holds them
            assert len({h["id"] // SHARD_ITEMS for h in result["hits"]}) > 1
        for item_id in (1, 7, 15):  # one of each shard bundle, by id as the page asks
            item = client.get(f"/items/{item_id}").json()
            reply = client.post("/query", params={"k": 5, "id": item_id, "exclude_self": "true"})
            assert reply.status_code == 200, reply.text
            hits = reply.json()["results"][0]["hits"]
            args = ("--k", "5", "--exclude-self")
            own = local_jsonl(one, [Path(item["path"])], monkeypatch, capsys, *args)
            same_hits(hits, own[item["path"]])
            assert item_id not in [h["id"] for h in hits]


def upload(path: Path) -> tuple[str, tuple[str, bytes, str]]:
    return ("files", (path.name, path.read_bytes(), "image/png"))


def test_serve_refuses_a_set_whose_shard_was_damaged(
    built: Path, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """A byte of a shard bundle's index.faiss changed, its size kept (so only its checksum
    can tell): `pactl serve SET` exits non-zero with one line naming that shard, before it
    listens."""
    shutil.copytree(built / "set", tmp_path / "set", symlinks=True)
    shard = "shards/00001-of-00003"
    index_file = current_dir(tmp_path / "set" / shard) / "index.faiss"
    data = bytearray(index_file.read_bytes())
    data[-8] ^= 0xFF  # inside the last vector's floats
    index_file.write_bytes(bytes(data))
    port = free_port()
    command = [sys.executable, "-m", "pactl", "serve", "set", "--port", str(port)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stderr
    line = one_error(done.stderr)
    assert f"shard bundle {shard} is damaged" in line and "index.faiss" in line, line
    assert line.endswith("rebuild the set with `pactl index VECTORS --keep-shards`"), line
    shutil.rmtree(tmp_path / "set" / shard)
    code, _, err = run_cli(["serve", "set", "--port", str(port)], monkeypatch, capsys)
    assert code != 0 and f"shard bundle {shard} is missing" in one_error(err)
