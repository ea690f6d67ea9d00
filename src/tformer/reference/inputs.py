"""NumPy mirror of tformer.nn.inputs: checks of what a user passes a model."""

from __future__ import annotations

import numpy as np


def check_token_ids(x: np.ndarray, vocab_size: int, name: str = "x") -> None:
    if not np.issubdtype(x.dtype, np.integer):
        raise TypeError(f"{name}: expected integer token ids of shape (B, S), got dtype {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name}: expected token ids of shape (B, S), got shape {x.shape}")
    if x.size:
        lo, hi = int(x.min()), int(x.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name}: expected token ids in [0, {vocab_size}), got values in [{lo}, {hi}]")


def check_embeddings(x: np.ndarray, d_model: int, name: str = "x") -> None:
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(
            f"{name}: expected float embeddings of shape (B, S, D={d_model}), got dtype {x.dtype}"
        )
    if x.ndim != 3 or x.shape[-1] != d_model:
        raise ValueError(f"{name}: expected shape (B, S, D) with D = {d_model}, got {x.shape}")


def one_input(x, input_ids):
    if x is not None and input_ids is not None:
        raise ValueError("input_ids: got both x and input_ids; pass the token ids once")
    if x is None and input_ids is None:
        raise ValueError("x: expected token ids (B, S) or embeddings (B, S, D), got None")
    return x if x is not None else input_ids
