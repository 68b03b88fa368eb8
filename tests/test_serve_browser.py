"""The page of `pactl serve` in a real headless browser (Debian's chromium, driven by
Playwright): upload a query, see k result tiles with scores and labels, click one, see the
results for the clicked item. The answers are checked against the JSON API's."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_serve import TOKEN, Service, shared_service, upload

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"no {CHROMIUM}: apt-get install chromium (.ci/run does)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Service:
    return shared_service(tmp_path_factory, request.session)


@pytest.fixture(scope="module")
def page(served: Service) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            tab = browser.new_page()
            tab.set_default_timeout(60_000)
            yield tab
        finally:
            browser.close()


def tile_ids(page: Any) -> list[int]:
    return [int(t.get_attribute("data-id")) for t in page.query_selector_all("#results .tile")]


def wait_for_ids(page: Any, ids: list[int]) -> None:
    page.wait_for_function(
        "want => [...document.querySelectorAll('#results .tile')]"
        ".map(t => t.dataset.id).join(',') === want",
        arg=",".join(map(str, ids)),
    )


def test_upload_see_k_results_click_one(served: Service, page: Any) -> None:
    query = served.images[5]
    with served.client() as client:
        expected = client.post("/query", params={"k": 4}, files=[upload(query)]).json()
    first = expected["results"][0]["hits"]

    page.goto(f"{served.url}/#token={TOKEN}")
    page.fill("#k", "4")
    page.set_input_files("#file", str(query))
    wait_for_ids(page, [h["id"] for h in first])
    tiles = page.query_selector_all("#results .tile")
    assert len(tiles) == 4
    for tile, hit in zip(tiles, first, strict=True):
        assert tile.query_selector(".score").inner_text() == f"{hit['score']:.4f}"
        assert tile.query_selector(".label").inner_text() == hit["label"]
        assert re.fullmatch(r"class_\d", hit["label"])
    page.wait_for_function(
        "[...document.querySelectorAll('#results .tile img')]"
        ".every(i => i.complete && i.naturalWidth > 0)"
    )

    clicked = first[1]
    with served.client() as client:
        params = {"k": 4, "id": clicked["id"], "exclude_self": "true"}
        then = client.post("/query", params=params).json()["results"][0]["hits"]
    tiles[1].click()
    wait_for_ids(page, [h["id"] for h in then])
    # The clicked query is shown as its results are: folder and name, the whole path on hover.
    shown = "/".join(clicked["path"].split("/")[-2:])
    assert page.inner_text("#query-name") == shown
    assert page.get_attribute("#query-name", "title") == clicked["path"]
    tiles_shown = [t.inner_text() for t in page.query_selector_all("#results .path")]
    assert tiles_shown and all(s.count("/") == 1 for s in tiles_shown), tiles_shown
    assert clicked["id"] not in tile_ids(page)
    scores = [t.inner_text() for t in page.query_selector_all("#results .score")]
    assert scores == [f"{h['score']:.4f}" for h in then]


def test_page_asks_for_the_token(served: Service, page: Any) -> None:
    page.evaluate("sessionStorage.clear()")
    page.goto(f"{served.url}/")
    page.wait_for_selector("#token-form:not([hidden])")
    assert "token" in page.inner_text("#about")
    page.fill("#token", TOKEN)
    page.click("#token-form button")
    page.wait_for_function("document.querySelector('#about').textContent.includes('items')")
    with served.client() as client:
        count = client.get("/health").json()["items"]
    assert page.inner_text("#about").startswith(f"{count:,} items")


def test_labels_are_shown_as_text(served: Service, page: Any, tmp_path: Path) -> None:
    """A label is data: markup in it shows as characters, never as elements."""
    hostile = tmp_path / "<b>x<img src=x onerror=alert(1)>"
    hostile.mkdir()
    image = hostile / "q.png"
    image.write_bytes(served.images[0].read_bytes())
    with served.client() as client:
        added = client.post("/add", files=[upload(image)], data={"label": hostile.name[:3]})
    assert added.status_code == 200, added.text
    page.goto(f"{served.url}/#token={TOKEN}")
    page.fill("#k", "4")
    page.set_input_files("#file", str(image))
    page.wait_for_function("document.querySelectorAll('#results .tile').length == 4")
    assert "<b>" in page.inner_text("#results")
    assert page.query_selector("#results b") is None
