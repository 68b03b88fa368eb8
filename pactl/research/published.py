"""Recall@K that Kim et al. (CVPR 2020, arXiv 2003.13911) published for Proxy-Anchor, so that
`pactl eval` and `pactl compare` can show them beside a measured run of the same dataset,
backbone, embedding size and crop size.

Two sources: the paper's tables (Recall@1 of BN-Inception, 512-d, 224 px crops) and the
official code's README (github.com/tjddus9597/Proxy-Anchor-CVPR2020), whose released models
were trained with larger batches and report every K of the paper's protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER = "paper"  # Kim et al. 2020, Tables 2 (CUB, Cars) and 3 (SOP), 4 (In-Shop)
README = "README"  # the official code's README, released models
SOURCES = {
    PAPER: "Kim et al., CVPR 2020, Tables 2-4",
    README: "official code's README (github.com/tjddus9597/Proxy-Anchor-CVPR2020)",
}


@dataclass(frozen=True)
class Published:
    dataset: str  # a name in pactl's dataset catalog
    backbone: str  # a name in pactl.backbones.BACKBONES
    embedding_dim: int
    image_size: int  # the training and test crop side
    source: str  # PAPER | README
    recalls: tuple[tuple[int, float], ...]  # (K, Recall@K as a fraction)

    def recall(self, k: int) -> float | None:
        return dict(self.recalls).get(k)


def _row(dataset: str, backbone: str, source: str, *pairs: tuple[int, float]) -> Published:
    return Published(dataset, backbone, 512, 224, source, tuple((k, v / 100) for k, v in pairs))


PUBLISHED: tuple[Published, ...] = (
    _row("cub200", "bn_inception", PAPER, (1, 68.4)),
    _row("cars196", "bn_inception", PAPER, (1, 86.1)),
    _row("sop", "bn_inception", PAPER, (1, 79.1)),
    _row("inshop", "bn_inception", PAPER, (1, 91.5)),
    _row("cub200", "bn_inception", README, (1, 69.1), (2, 78.9), (4, 86.1), (8, 91.2)),
    _row("cub200", "resnet50", README, (1, 69.9), (2, 79.6), (4, 86.6), (8, 91.4)),
    _row("cars196", "bn_inception", README, (1, 86.4), (2, 91.9), (4, 95.0), (8, 97.0)),
    _row("cars196", "resnet50", README, (1, 87.7), (2, 92.7), (4, 95.5), (8, 97.3)),
    _row("sop", "bn_inception", README, (1, 79.2), (10, 90.7), (100, 96.2), (1000, 98.6)),
    _row(
        "inshop", "bn_inception", README, (1, 91.9), (10, 98.1), (20, 98.7), (30, 99.0), (40, 99.1)
    ),
)


def published_for(
    dataset: str, backbone: str, embedding_dim: int, image_size: int
) -> list[Published]:
    """The published results of this exact setting (paper first), none for any other."""
    return [
        p
        for p in PUBLISHED
        if (p.dataset, p.backbone, p.embedding_dim, p.image_size)
        == (dataset, backbone, embedding_dim, image_size)
    ]


def published_cells(metric: str, found: list[Published]) -> list[str]:
    """`paper 0.684`, `README 0.691` for a `recall@K` metric that was published; [] else."""
    if not metric.startswith("recall@") or not metric[len("recall@") :].isdigit():
        return []
    k = int(metric[len("recall@") :])
    return [f"{p.source} {value:.3f}" for p in found if (value := p.recall(k)) is not None]
