"""Several processes at once (torchrun, one node or many): ranks, gradient averaging, and
decisions every rank must take together; also what `tformer embed` and `index build` gather.

The process group talks NCCL between GPUs and gloo between CPU processes (NCCL moves tensors
GPU to GPU, over NVLink or InfiniBand where there is one; gloo is PyTorch's CPU backend). Each
process uses the GPU of its local rank (tformer.nn.devices.resolve_device), so on a node of 8
GPUs, ``torchrun --nproc_per_node 8`` runs one process per GPU; across nodes torchrun's
rendezvous joins them (``--nnodes N --rdzv-endpoint HOST:PORT``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import nn


def backend_for(device: torch.device) -> str:
    """The process group's backend for processes whose tensors live on `device`."""
    return "nccl" if device.type == "cuda" else "gloo"


def rank_and_world(device: torch.device | None = None) -> tuple[int, int]:
    """(rank, world size): from torchrun's environment, starting the process group once (its
    backend chosen by `device`, the CPU when None); (0, 1) alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not dist.is_initialized():
        device = device or torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's collectives run on this process's own GPU
        dist.init_process_group(backend_for(device))
    return dist.get_rank(), world


@contextlib.contextmanager
def process_group(device: torch.device | None = None) -> Iterator[tuple[int, int]]:
    """(rank, world) for the duration of a command. When it ends without an error, every rank
    waits for the others (rank 0 may still be writing) and the group is taken down before the
    process exits, as torch asks: a group left to the interpreter's exit aborted a rank whose
    peer had gone first (SIGABRT, one run in a few, two CPU ranks)."""
    rank, world = rank_and_world(device)
    yield rank, world
    finish(world)


def finish(world: int) -> None:
    """Wait for every rank, then take the process group down (see ``process_group``)."""
    if world > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _collective_device() -> torch.device:
    """Where tensors handed to a collective must live: NCCL's on this process's GPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def average_gradients(model: nn.Module, world: int) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.flatten() for g in grads])  # one all-reduce for all, on the gradients' device
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def sum_over_ranks(values: list[float]) -> list[float]:
    """Logged numbers of all ranks together: the loss curve is the global batch's."""
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t)
    return [float(v) for v in t.cpu()]


def any_rank(flag: bool, world: int) -> bool:
    """True on every rank when it is true on any one (every rank stops at the same step)."""
    if world == 1:
        return flag
    t = torch.tensor([float(flag)], device=_collective_device())
    dist.all_reduce(t)
    return bool(t.item() > 0)


def broadcast_int(value: int, world: int) -> int:
    """Rank 0's value, on every rank."""
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.long, device=_collective_device())
    dist.broadcast(t, src=0)
    return int(t.item())


def all_gather_rows(rows: np.ndarray, world: int) -> list[np.ndarray]:
    """Every rank's (n_r, D) float32 rows, in rank order, on every rank (n_r may differ, 0
    included). Two collectives: the counts, then the rows padded to the largest count.

    Shape: rows (n, D) -> world arrays (n_r, D)
    """
    if world == 1:
        return [rows]
    device = _collective_device()
    counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([len(rows)], dtype=torch.long, device=device))
    n = [int(c.item()) for c in counts]
    padded = torch.zeros(max(n), rows.shape[1], dtype=torch.float32, device=device)  # (max n_r, D)
    padded[: len(rows)] = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)).to(device)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return [g[:k].cpu().numpy() for g, k in zip(gathered, n, strict=True)]
