"""One process or many under `torchrun`: rank helpers and the global-batch all-gather."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.size > 1


def init_world(device_name: str) -> World:
    """Join the `torchrun` process group when launched by it (WORLD_SIZE > 1)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_name != "cpu" and torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(local_rank)
    return World(rank=rank, size=size, local_rank=local_rank)


def gather_batch(
    embeddings: torch.Tensor, labels: torch.Tensor, world: World
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every process's embeddings (with gradients) and labels, so the loss sees the global batch.

    Each rank computes the loss on the same global batch; DDP averages gradients across ranks,
    so the result equals one process holding the whole batch. Shares may differ in size (an
    image that failed to decode leaves its rank a row short): they are padded to the largest
    for the all-gather and the padding dropped after it.
    """
    if not world.enabled:
        return embeddings, labels
    counts = share_sizes(len(embeddings), world, embeddings.device)
    pad = max(counts) - len(embeddings)
    if pad:
        embeddings = torch.cat([embeddings, embeddings.new_zeros(pad, embeddings.shape[1])])
        labels = torch.cat([labels, labels.new_full((pad,), -1)])
    parts = GatherWithGradients.apply(embeddings)  # (world, max B, D), differentiable
    label_list = [torch.empty_like(labels) for _ in range(world.size)]
    dist.all_gather(label_list, labels)
    gathered = torch.cat([part[:n] for part, n in zip(parts, counts, strict=True)])
    return gathered, torch.cat([part[:n] for part, n in zip(label_list, counts, strict=True)])


class GatherWithGradients(torch.autograd.Function):
    """All ranks' (B, D) shares stacked as (world, B, D); backward sums, over the ranks, the
    gradient each one's loss sends to this rank's share (every rank's loss used every share),
    which DDP's averaging then turns into one process's gradient. Public collectives only:
    torch.distributed.nn.functional.all_gather, which did this, is deprecated."""

    @staticmethod
    def forward(ctx: Any, share: torch.Tensor) -> torch.Tensor:
        ctx.rank = dist.get_rank()
        parts = [torch.empty_like(share) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, share.contiguous())
        return torch.stack(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)  # sum over ranks; gloo has no reduce_scatter for every dtype
        return grad[ctx.rank]


def share_sizes(rows: int, world: World, device: torch.device) -> list[int]:
    """How many rows each rank holds this step (all ranks call it together)."""
    if not world.enabled:
        return [rows]
    mine = torch.tensor([rows], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world.size)]
    dist.all_gather(every, mine)
    return [int(n) for n in every]


def agree(world: World, values: list[float]) -> list[float]:
    """The first process's `values` on every process (all processes call it together): so that
    decisions made from timings, which differ between processes, are the same everywhere."""
    if not world.enabled:
        return values
    box: list[Any] = [values]
    dist.broadcast_object_list(box, src=0)
    return [float(v) for v in box[0]]


def barrier(world: World) -> None:
    if world.enabled:
        dist.barrier()
