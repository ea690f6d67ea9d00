"""Data-parallel training across processes (torchrun, gloo): ranks, gradient averaging, and
decisions every rank must take together."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn


def rank_and_world() -> tuple[int, int]:
    """(rank, world size): from torchrun's environment, starting gloo once; (0, 1) alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.get_rank(), world


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def average_gradients(model: nn.Module, world: int) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])  # one all-reduce for all
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def sum_over_ranks(values: list[float]) -> list[float]:
    """Logged numbers of all ranks together: the loss curve is the global batch's."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return [float(v) for v in t]


def any_rank(flag: bool, world: int) -> bool:
    """True on every rank when it is true on any one (every rank stops at the same step)."""
    if world == 1:
        return flag
    t = torch.tensor([float(flag)])
    dist.all_reduce(t)
    return bool(t.item() > 0)
