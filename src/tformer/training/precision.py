"""The training precision: fp32, or bf16 autocast with fp32 master weights.

--precision auto (the default) trains in bf16 where the CPU computes it natively and it is
measured faster here, else fp32; the run prints what it chose and why. bf16 autocast runs the
matrix products in bfloat16 and keeps the weights, the optimizer, the norms and the loss in fp32
(1.9-2.5x faster steps on an AVX-512 bf16 / AMX CPU; on an AVX2-only CPU oneDNN has no bf16
kernels worth running).
"""

from __future__ import annotations

import functools

import torch

from tformer.config import TransformerConfig
from tformer.machine import NO_BF16, has_bf16
from tformer.model import Encoder
from tformer.precision import MIN_SPEEDUP, bf16_speedup


def choose_precision(requested: str) -> tuple[str, str]:
    """("fp32" or "bf16", why) for a run asking for `requested`."""
    if requested == "fp32":
        return "fp32", "asked for"
    if requested == "bf16":
        if not bf16_supported():
            raise ValueError("precision: this CPU cannot run bfloat16 matrix products under autocast "
                             "(oneDNN found no kernel); expected --precision fp32 or auto, got bf16")
        return "bf16", "asked for"
    if not has_bf16():
        return "fp32", NO_BF16
    speedup = bf16_speedup()
    if speedup < MIN_SPEEDUP or not bf16_supported():
        return "fp32", f"bf16 matrix products measured only {speedup:.2f}x fp32's here"
    return "bf16", f"native bf16, matrix products measured {speedup:.2f}x fp32's here"


@functools.cache
def bf16_supported() -> bool:
    """Whether a tiny encoder trains under bfloat16 CPU autocast here (oneDNN has no bfloat16
    kernels for some CPUs, e.g. AVX2-only ones)."""
    try:
        encoder = Encoder(TransformerConfig(d_model=8, n_heads=2, d_ff=16, n_layers=1, vocab_size=10))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = encoder(torch.ones(2, 3, dtype=torch.long)).last_hidden_state
        h.float().sum().backward()
    except RuntimeError:
        return False
    return True
