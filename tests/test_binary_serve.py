"""`pactl serve` on a binary bundle: the same answers as a local `pactl query`, by default and
with ?rescore= (`pactl query --server --rescore`), and a float service refusing rescore."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from test_serve import TOKEN, Service, _cli, build_bundle, start_service, stop_service, upload


@pytest.fixture(scope="module")
def binary_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A service of root/bundle: build_bundle's images and network, indexed with --binary."""
    root = tmp_path_factory.mktemp("binary-serve")
    build_bundle(root)
    shutil.rmtree(root / "bundle")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        args = ["index", "imgs", "--checkpoint", "best.pt", "--out", "bundle", "--quiet"]
        _cli([*args, "--binary", "--bits", "16", "--rotation", "none"])
    service = start_service(root, "--token", TOKEN)
    yield service
    stop_service(service)


@pytest.mark.parametrize("rescore", [[], ["--rescore", "0"], ["--rescore", "3"]])
def test_a_binary_service_prints_what_a_local_query_prints(
    binary_service: Service, rescore: list[str], monkeypatch: Any, capsys: Any
) -> None:
    images = [str(binary_service.root / "imgs" / "class_2")]
    common = ["--k", "4", "--format", "csv", "--exclude-self", *rescore]
    local = ["query", *images, "--index", str(binary_service.bundle), *common]
    code, want, err = run_cli(local, monkeypatch, capsys)
    assert code == 0, err
    remote = ["query", *images, "--server", binary_service.url, "--token", TOKEN, *common]
    code, got, err = run_cli(remote, monkeypatch, capsys)
    assert code == 0, err
    assert got == want and len(want.splitlines()) == 1 + 4 * 4


def test_rescore_is_refused_by_a_float_service_and_out_of_range(tmp_path: Path) -> None:
    build_bundle(tmp_path)
    service = start_service(tmp_path, "--token", TOKEN)
    try:
        image = tmp_path / "imgs" / "class_0" / "0.png"
        with service.client() as client:
            reply = client.post("/query", params={"rescore": 2}, files=[upload(image)])
            assert reply.status_code == 400 and "binary bundles" in reply.json()["detail"]
            reply = client.post("/query", params={"rescore": -1}, files=[upload(image)])
            assert reply.status_code == 422
    finally:
        stop_service(service)


def test_health_gives_the_float_dimension(binary_service: Service) -> None:
    with binary_service.client() as client:
        health = client.get("/health").json()
    assert health["dimension"] == 16 and health["items"] == 16
