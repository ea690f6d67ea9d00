"""Beam search's selection: each row's k largest values, by torch.topk or by a two-stage
selection over chunks of columns, chosen by measuring each shape class on this machine.

Shape legend: N rows (beams), V columns (the vocabulary), k the beam size.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from tformer.nn.kernels import autotune
from tformer.nn.kernels.switch import is_readable
from tformer.nn.kernels.tracing import tracing

# Columns per chunk of the two-stage selection: a multiple of the vector width, small enough that
# the k chunks gathered in the second stage are a few hundred values.
CHUNK = 64


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest values of each row and their columns, largest first: torch.topk's values
    (the columns equal too, unless two values tie), by the kernel measured faster here.

    Shape: x (N, V) -> values (N, k), indices (N, k)
    """
    if why_not_chunked_topk(x, k) is None and autotune.choose(
            "topk", _topk_shape(x, k), lambda: {"topk": lambda: x.topk(k, dim=-1),
                                                "chunked": lambda: chunked_topk(x, k)}) == "chunked":
        return chunked_topk(x, k)
    return x.topk(k, dim=-1)


def chunked_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """torch.topk in two stages: the maximum of every chunk of CHUNK columns (one vectorised pass,
    where topk copies each row into (value, index) pairs and sorts them: 2x slower at (256, 8000)
    on an Intel Xeon, 2 threads), then topk over the columns of the k chunks whose maxima are
    largest, and of the last V mod CHUNK columns. Exact: a value among its row's k largest has
    at most k - 1 larger values, so at most k - 1 chunks have a larger maximum than its chunk.

    Shape: x (N, V) -> values (N, k), indices (N, k)
    """
    n, v = x.shape
    whole = v - v % CHUNK
    maxima = x[:, :whole].view(n, whole // CHUNK, CHUNK).amax(dim=-1)  # (N, V // CHUNK)
    chunks = maxima.topk(k, dim=-1).indices  # (N, k)
    cols = (chunks[:, :, None] * CHUNK + torch.arange(CHUNK, device=x.device)).view(n, k * CHUNK)
    if whole < v:  # the last, partial chunk is always a candidate
        tail = torch.arange(whole, v, device=x.device).expand(n, v - whole)
        cols = torch.cat([cols, tail], dim=1)  # (N, k * CHUNK + V mod CHUNK)
    values, at = x.gather(1, cols).topk(k, dim=-1)  # (N, k)
    return values, cols.gather(1, at)


def why_not_chunked_topk(x: Tensor, k: int) -> str | None:
    """Why the selection must be torch.topk's, or None to measure the two-stage one."""
    if is_readable():
        return "kernels.readable() asks for the plain kernels"
    if x.dim() != 2 or x.size(1) < (k + 1) * CHUNK:
        return "fewer than k + 1 chunks of columns: nothing to skip"
    if x.requires_grad and torch.is_grad_enabled():
        return "autograd: torch.topk's backward"
    if tracing() or is_in_torch_dispatch_mode():
        return "compilers and exporters know torch.topk"
    if x.device.type != "cpu":
        return "choices are measured on CPU only"
    return None


def _topk_shape(x: Tensor, k: int) -> str:
    """The shape class: powers of two of the rows and the columns, k and the dtype."""
    n, v = x.shape
    return f"{1 << (n - 1).bit_length()}x{1 << (v - 1).bit_length()}/k{k}/" \
           f"{str(x.dtype).removeprefix('torch.')}"
