"""Inference precisions: fp32, bf16 matrix multiplies, or int8 ones (tformer.int8)."""

from __future__ import annotations

import torch
from torch import nn

from tformer import int8
from tformer.attention import MultiHeadAttention
from tformer.feedforward import FeedForward

PRECISIONS = ("fp32", "bf16", "int8")


def to_precision(model: nn.Module, precision: str) -> nn.Module:
    """Set a model's inference precision, in place.

    ``fp32``: every parameter float32. ``bf16``: the matrix multiplies of attention and the
    feed-forward network take bf16 weights and inputs; their results, the residual stream,
    the norms, the softmax and pooling stay float32 (min cosine to fp32 sentence embeddings
    0.99996 on all-MiniLM-L6-v2, where casting the whole model to bf16 gives 0.9964). It is
    faster only on CPUs with bf16 instructions (avx512_bf16, AMX); elsewhere slower.
    ``int8``: those multiplies take int8 weights and per-token int8 activations, after a
    rotation that spreads outliers (``tformer.int8``; min cosine 0.9984-0.9993 on
    all-MiniLM-L6-v2 with 8-bit activations). It is one-way: the int8 layers keep no float weights.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"dtype: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if any(isinstance(m, int8.Int8Linear) for m in model.modules()):
        raise ValueError(f"dtype: this model is already int8 and keeps no float weights; "
                         f"load it again for {precision!r}")
    model.float()
    if precision == "int8":
        return int8.quantize(model)
    if precision == "bf16":
        for module in model.modules():
            if isinstance(module, MultiHeadAttention | FeedForward):
                module.to(torch.bfloat16)  # the layers' own linears, run by kernels.linear
    return model
