"""The paper's published Recall@K, shown beside a measured run of the same setting."""

from __future__ import annotations

import pytest
from conftest import run_cli

from pactl.config import ModelConfig
from pactl.research.published import published_cells, published_for


def test_published_figures_match_only_their_own_setting() -> None:
    # Kim et al. 2020, BN-Inception 512-d at 224 px (paper) and the official README.
    cub = published_for("cub200", "bn_inception", 512, 224)
    assert [p.source for p in cub] == ["paper", "README"]
    assert published_cells("recall@1", cub) == ["paper 0.684", "README 0.691"]
    assert published_cells("recall@8", cub) == ["README 0.912"]
    assert published_cells("map@r", cub) == []
    paper = {d: published_for(d, "bn_inception", 512, 224)[0].recall(1) for d in
             ("cub200", "cars196", "sop", "inshop")}  # fmt: skip
    assert paper == pytest.approx(
        {"cub200": 0.684, "cars196": 0.861, "sop": 0.791, "inshop": 0.915}
    )
    assert published_for("cub200", "bn_inception", 64, 224) == []
    assert published_for("cub200", "bn_inception", 512, 256) == []
    assert published_for("my_photos", "resnet50", 512, 224) == []


def test_eval_prints_the_published_figures_beside_the_measured_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pactl.verbs.evaluate

    measured = {"recall@1": 0.65, "recall@2": 0.75, "map@r": 0.25}
    network = ModelConfig(backbone="bn_inception", embedding_dim=512, image_size=224)
    monkeypatch.setattr(
        pactl.verbs.evaluate, "eval_checkpoint", lambda *a, **k: (measured, network)
    )
    code, out, err = run_cli(["eval", "cub200", "--backbone", "bn_inception"], monkeypatch, capsys)
    assert code == 0, err
    lines = [line.split() for line in out.splitlines()]
    assert lines[0] == ["recall@1", "0.6500", "paper", "0.684", "README", "0.691"]
    assert lines[1] == ["recall@2", "0.7500", "README", "0.789"]
    assert lines[2] == ["map@r", "0.2500"]
    assert "Kim et al., CVPR 2020" in err
