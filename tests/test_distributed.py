"""Two CPU processes (gloo) see the global batch: loss and gradients equal one process's,
with equal shares and with one rank a row short (an image that failed to decode).

Both sides run in float64: the two only sum the same terms in another order, so they agree to
about 1e-15, and the tolerance below (1e-9) fails on a real error, never on scheduling."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from pactl.config import ModelConfig
from pactl.losses import ProxyAnchorLoss
from pactl.model import build_model
from pactl.training.distributed import World, gather_batch

CONFIG = ModelConfig(backbone="small", weights="none", embedding_dim=8, image_size=8, resize_size=8)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(12, 3, 8, 8, generator=g, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 4, 4])
    return images, labels


def parts() -> tuple[nn.Module, ProxyAnchorLoss]:
    net, _ = build_model(CONFIG, seed=0)
    net.eval()  # BatchNorm on running statistics, as with --freeze-bn
    torch.manual_seed(1)
    return net.double(), ProxyAnchorLoss(5, 8).double()


def worker(rank: int, world_size: int, init_file: str, out: str, cut: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    net, criterion = parts()
    model = nn.parallel.DistributedDataParallel(net)
    images, labels = batch()
    bounds = [0, cut, len(labels)]  # two ranks: rows [0, cut) and [cut, 12)
    mine = slice(bounds[rank], bounds[rank + 1])
    embeddings, all_labels = gather_batch(
        model(images[mine]), labels[mine], World(rank, world_size, 0)
    )
    loss = criterion(embeddings, all_labels)
    loss.backward()
    if rank == 0:
        torch.save(
            {
                "loss": loss.detach(),
                "labels": all_labels,
                "head": net.embedding.weight.grad.clone(),
                "conv": next(net.backbone.parameters()).grad.clone(),
                "proxies": criterion.proxies.grad.clone(),
            },
            out,
        )
    dist.destroy_process_group()


@pytest.mark.parametrize("cut", [6, 7], ids=["equal shares", "one row short"])
def test_two_processes_equal_one(tmp_path: Path, cut: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    out = tmp_path / "rank0.pt"
    mp.start_processes(
        worker, args=(2, str(tmp_path / "init"), str(out), cut), nprocs=2, start_method="spawn"
    )
    got = torch.load(out, weights_only=True)

    net, criterion = parts()
    images, labels = batch()
    loss = criterion(net(images), labels)
    loss.backward()
    assert torch.equal(got["labels"], labels)
    close = {"rtol": 1e-9, "atol": 1e-12}
    assert got["loss"].dtype == torch.float64
    torch.testing.assert_close(got["loss"], loss.detach(), **close)
    torch.testing.assert_close(got["head"], net.embedding.weight.grad, **close)
    torch.testing.assert_close(got["conv"], next(net.backbone.parameters()).grad, **close)
    torch.testing.assert_close(got["proxies"], criterion.proxies.grad, **close)
