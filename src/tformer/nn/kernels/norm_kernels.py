"""The residual add and LayerNorm of a post-norm layer (``norm(x + y)``), as one compiled kernel
where that is measured faster here (tformer.nn.kernels.compiling), else as they are.

Why: with precision "bf16" a sub-layer's output ``y`` is bf16 and the residual stream ``x`` fp32,
so eagerly the add promotes (a pass writing an fp32 sum) and the norm reads it again; inductor
does both in one pass. Measured on an Intel Xeon with AMX (1 thread, 3,000 x 384): 2.1x eager's
speed for bf16 ``y``; for fp32 ``y`` eager's LayerNorm kernel was the faster (0.62-0.75x compiled),
so only the bf16 case is compiled. Inference only (no autograd): training's add and norm run as
they are.

Shape legend: N rows (tokens), D model dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.nn.kernels.compiling import Compiled


def _add_norm(x: Tensor, y: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """LayerNorm(x + y), the formula nn.LayerNorm computes. Shape: (..., D) -> (..., D)"""
    return F.layer_norm(x + y, (x.size(-1),), weight, bias, eps)


def _rows_class(x: Tensor, y: Tensor, weight, bias, eps) -> str:
    rows = max(x.numel() // max(x.size(-1), 1), 1)
    return f"{1 << (rows - 1).bit_length()}x{x.size(-1)}/{str(x.dtype).removeprefix('torch.')}+" \
           f"{str(y.dtype).removeprefix('torch.')}"


ADD_NORM = Compiled("add-norm", _add_norm, shape_class=_rows_class)


def add_norm(x: Tensor, y: Tensor, norm: nn.LayerNorm) -> Tensor:
    """norm(x + y): compiled where that is measured faster (``why_not_compiled_add_norm``;
    ADD_NORM itself runs eagerly where nothing may compile)."""
    if _why_not_candidate(x, y, norm) is None:
        return ADD_NORM(x, y, norm.weight, norm.bias, norm.eps)
    return norm(x + y)


def why_not_compiled_add_norm(x: Tensor, y: Tensor, norm: nn.Module) -> str | None:
    """Why ``norm(x + y)`` runs as it is, without a measured compiled kernel; None to measure."""
    return _why_not_candidate(x, y, norm) or ADD_NORM.why_not(x.device)


def _why_not_candidate(x: Tensor, y: Tensor, norm: nn.Module) -> str | None:
    if not isinstance(norm, nn.LayerNorm):
        return "not a LayerNorm"
    if torch.is_grad_enabled() and (x.requires_grad or y.requires_grad or norm.weight.requires_grad):
        return "autograd: training's add and norm run as they are"
    if not (y.dtype == torch.bfloat16 and x.dtype == torch.float32):
        return "only a bf16 sub-layer output on the fp32 residual stream gains (module docstring)"
    return None
