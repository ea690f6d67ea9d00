"""Positional information: fixed sinusoids (Vaswani et al. 2017, §3.5) or a learned table.

Both return the (S, D) position vectors for positions offset .. offset + S - 1, which the
model adds to the token embeddings; the offset is the cache length when decoding step by step.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tformer.config import check_positive


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """(N, D) float64: PE[pos, 2i] = sin(pos / 10000^(2i/D)), PE[pos, 2i+1] = cos(same)."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (N, 1)
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model)
    )  # (ceil(D/2),)
    angles = pos * inv_freq  # (N, ceil(D/2))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoids; no parameters. Extends past ``max_len`` by computing more rows."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        check_positive("d_model", d_model)
        check_positive("max_len", max_len)
        self.d_model, self.max_len = d_model, max_len
        # A float64 constant, not a buffer: `model.double()` must not see float32-rounded
        # sinusoids, and nothing here belongs in a checkpoint.
        self._table = sinusoidal_table(max_len, d_model)

    def forward(
        self, seq_len: int, offset: int = 0, dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> Tensor:
        """Returns (S, D) in ``dtype`` (default float32) on ``device``."""
        end = offset + seq_len
        table = self._table if end <= self._table.size(0) else sinusoidal_table(end, self.d_model)
        return table[offset:end].to(device=device, dtype=dtype or torch.float32)


class LearnedPositionalEmbedding(nn.Module):
    """A trained (max_len, D) table, as in BERT; cannot go past max_len."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        check_positive("max_len", max_len)
        check_positive("d_model", d_model)
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(
        self, seq_len: int, offset: int = 0, dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> Tensor:
        """Returns (S, D); the table's own dtype and device (the arguments mirror the sinusoids')."""
        if offset + seq_len > self.max_len:
            raise ValueError(
                f"x: sequence length {offset + seq_len} exceeds max_len {self.max_len} "
                "of the learned positional embedding"
            )
        return self.weight[offset : offset + seq_len]
