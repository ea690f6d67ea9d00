"""Checks of what a user passes a model: each error names the argument, the expected and the
actual value, before anything is computed."""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.nn.kernels.tracing import values_readable


def check_token_ids(x: Tensor, vocab_size: int, name: str = "x") -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of token ids, got {type(x).__name__}")
    if x.dtype == torch.bool or x.is_floating_point() or x.is_complex():
        raise TypeError(f"{name}: expected integer token ids of shape (B, S), got dtype {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name}: expected token ids of shape (B, S), got shape {tuple(x.shape)}")
    # The range check reads the data: eager only. While tracing (compile, export) the ids are
    # symbolic, and on the meta device there are none; an out-of-range id then fails in the
    # embedding lookup instead.
    if x.numel() and values_readable(x):
        lo, hi = (int(v) for v in torch.aminmax(x))  # one pass over the ids
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name}: expected token ids in [0, {vocab_size}), got values in [{lo}, {hi}]")


def check_embeddings(x: Tensor, d_model: int, name: str = "x") -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape (B, S, D), got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"{name}: expected float embeddings of shape (B, S, D={d_model}), got dtype {x.dtype} "
            "(token ids need a config with vocab_size)"
        )
    if x.dim() != 3 or x.size(-1) != d_model:
        raise ValueError(
            f"{name}: expected shape (B, S, D) with D = {d_model}, got {tuple(x.shape)}"
        )


def one_input(x, input_ids):
    if x is not None and input_ids is not None:
        raise ValueError("input_ids: got both x and input_ids; pass the token ids once")
    if x is None and input_ids is None:
        raise ValueError("x: expected token ids (B, S) or embeddings (B, S, D), got None")
    return x if x is not None else input_ids
