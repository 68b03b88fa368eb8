"""The review page of `pactl serve --findings --decisions` (pactl.serve.review): an audit's
suspected labels with their evidence and neighbours; keep and reject, clicked in a real headless
browser (Debian's chromium, driven by Playwright), append decisions that `pactl audit
--write-manifest --relabel` applies. The routes pass the service's shared rules (token, origin,
media type) like every other."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import read_csv, run_cli
from test_serve import TOKEN, Service, _cli, build_bundle, start_service, stop_service

CHROMIUM = "/usr/bin/chromium"
AUDIT = ["--no-copies", "--no-checks", "--neighbours", "3", "-q"]
PLANTED = "class_1/1.png"  # the image given another class's label


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A bundle of 16 items audited into findings.jsonl (its top 6 suspects), served with the
    review page; decisions.jsonl not yet written."""
    root = tmp_path_factory.mktemp("review")
    build_bundle(root)
    images = sorted((root / "imgs").rglob("*.png"))
    labels = [p.parent.name for p in images]
    labels[5] = "class_0"  # a class_1 image given class_0's label
    rows = "".join(f"{p},{label}\n" for p, label in zip(images, labels, strict=True))
    (root / "labels.csv").write_text("path,label\n" + rows)
    findings = root / "findings.jsonl"
    source = ["--source", str(root / "labels.csv")]
    _cli(
        ["audit", str(root / "bundle"), *AUDIT, *source, "--top", "6", "--findings", str(findings)]
    )
    service = start_service(
        root, "--token", TOKEN, "--findings", str(findings), "--decisions", str(root / "d.jsonl")
    )
    yield service
    stop_service(service)


def suspects(service: Service) -> list[dict[str, Any]]:
    lines = (service.root / "findings.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "label"]


def test_the_routes_keep_the_services_rules_and_refuse_what_is_not_a_finding(
    reviewed: Service,
) -> None:
    rows = suspects(reviewed)
    with reviewed.client() as client:
        page = client.get("/review/findings", params={"limit": 2}).json()
        assert page["total"] == len(rows) == 6 and len(page["findings"]) == 2
        first = page["findings"][0]
        assert (first["id"], first["suggested"]) == (rows[0]["id"], rows[0]["suggested"])
        assert first["item"] is not None and len(first["neighbours"]) == 3
        assert all(n["item"] is not None for n in first["neighbours"])
        missing = client.post("/review/decisions", json={"id": 10_000, "decision": "keep"})
        assert missing.status_code == 404
        bad = client.post("/review/decisions", json={"id": rows[0]["id"], "decision": "maybe"})
        assert bad.status_code == 400
        plain = client.post(
            "/review/decisions", content=b'{"id": 1, "decision": "keep"}',
            headers={"Content-Type": "text/plain"},
        )  # fmt: skip
        assert plain.status_code == 415
        other_site = client.post(
            "/review/decisions", json={"id": rows[0]["id"], "decision": "keep"},
            headers={"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"},
        )  # fmt: skip
        assert other_site.status_code == 403
    with reviewed.client(token=None) as client:
        assert client.get("/review/findings").status_code == 401
    assert not (reviewed.root / "d.jsonl").exists()  # nothing refused was written


def test_keep_and_reject_in_the_browser_then_relabel(
    reviewed: Service, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no {CHROMIUM}: apt-get install chromium (.ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    rows = suspects(reviewed)
    assert rows[0]["path"].endswith(PLANTED) and rows[0]["suggested"] == "class_1"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(f"{reviewed.url}/review#token={TOKEN}")
            page.wait_for_function("document.querySelectorAll('.finding').length === 6")
            cards = page.query_selector_all(".finding")
            assert [int(c.get_attribute("data-id")) for c in cards] == [r["id"] for r in rows]
            cards[0].query_selector(".do-keep").click()
            page.wait_for_selector(".finding.keep")
            cards[1].query_selector(".do-reject").click()
            page.wait_for_selector(".finding.reject")
            page.wait_for_function(  # every picture of the first finding drawn
                "[...document.querySelectorAll('.finding')[0].querySelectorAll('img')]"
                ".every(i => i.complete && i.naturalWidth > 0)"
            )
            assert "2 of 6 decided" in page.inner_text("#status")
            page.screenshot(path=str(reviewed.root / "review.png"), full_page=True)
            if os.access("/tmp", os.W_OK):
                page.screenshot(path="/tmp/review.png", full_page=True)
        finally:
            browser.close()
    made = [json.loads(x) for x in (reviewed.root / "d.jsonl").read_text().splitlines()]
    assert [(d["id"], d["decision"]) for d in made] == [
        (rows[0]["id"], "keep"), (rows[1]["id"], "reject")
    ]  # fmt: skip
    assert made[0]["fingerprint"] == rows[0]["fingerprint"] and made[0]["path"] == rows[0]["path"]
    monkeypatch.chdir(reviewed.root)
    code, _, err = run_cli(
        ["audit", "bundle", *AUDIT, "--source", "labels.csv", "--relabel", "d.jsonl",
         "--write-manifest", "m.csv"],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0, err
    labels = {r["path"]: r["label"] for r in read_csv(Path("m.csv"))}
    assert len(labels) == 16
    assert labels[rows[0]["path"]] == "class_1"  # the planted label, put right
    assert labels[rows[1]["path"]] == rows[1]["label"]
