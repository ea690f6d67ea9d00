"""NumPy mirror of tformer.nn.positional: fixed sinusoids (§3.5) or a learned table."""

from __future__ import annotations

import math

import numpy as np

from tformer.config import check_positive
from tformer.reference.module import Module


def sinusoidal_table(n_positions: int, d_model: int) -> np.ndarray:
    """(N, D) float64: PE[pos, 2i] = sin(pos / 10000^(2i/D)), PE[pos, 2i+1] = cos(same)."""
    pos = np.arange(n_positions, dtype=np.float64)[:, None]  # (N, 1)
    inv_freq = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-math.log(10000.0) / d_model))
    angles = pos * inv_freq  # (N, ceil(D/2))
    table = np.zeros((n_positions, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return table


class SinusoidalPositionalEncoding(Module):
    """Fixed sinusoids (§3.5); no parameters. Extends past ``max_len`` by computing more rows."""

    def __init__(self, d_model: int, max_len: int):
        check_positive("d_model", d_model)
        check_positive("max_len", max_len)
        self.d_model, self.max_len = d_model, max_len
        self._table = sinusoidal_table(max_len, d_model)

    def forward(self, seq_len: int, offset: int = 0, dtype=np.float32) -> np.ndarray:
        """Returns (S, D) in ``dtype``: the rows of positions offset .. offset + S - 1."""
        end = offset + seq_len
        table = self._table if end <= len(self._table) else sinusoidal_table(end, self.d_model)
        return table[offset:end].astype(dtype)


class LearnedPositionalEmbedding(Module):
    """A trained (max_len, D) table, as in BERT; cannot go past max_len."""

    def __init__(self, max_len: int, d_model: int):
        check_positive("max_len", max_len)
        check_positive("d_model", d_model)
        self.max_len = max_len
        self.weight = np.zeros((max_len, d_model), np.float32)

    def forward(self, seq_len: int, offset: int = 0, dtype=None) -> np.ndarray:
        """Returns (S, D) in the table's dtype."""
        if offset + seq_len > self.max_len:
            raise ValueError(
                f"x: sequence length {offset + seq_len} exceeds max_len {self.max_len} "
                "of the learned positional embedding"
            )
        return self.weight[offset : offset + seq_len]

    def backward(self, dpos: np.ndarray, offset: int, grads: dict, prefix: str = "") -> None:
        """Rows offset..offset+S of the table were added to every sequence of the batch, so
        each row's gradient is dpos summed over the batch. Shape: dpos (B, S, D)."""
        s = dpos.shape[1]
        grads[prefix + "weight"][offset : offset + s] += dpos.sum(axis=0)


def plot_positions(d_model: int = 128, max_len: int = 100):
    """The sinusoidal encoding of Vaswani et al. 2017, §3.5: the (positions x dims) table,
    and a few dimensions as curves (each pair of dims is one frequency)."""
    from tformer.training.viz.plots import DPI, pyplot

    for name, value in (("d_model", d_model), ("max_len", max_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    table = sinusoidal_table(max_len, d_model)  # (max_len, D)
    plt = pyplot()
    fig, (heat, curves) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=DPI)
    im = heat.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    heat.set_xlabel("dimension")
    heat.set_ylabel("position")
    heat.set_title(f"sinusoidal positional encoding (d_model={d_model})")
    fig.colorbar(im, ax=heat)
    for dim in sorted(d for d in {0, 1, d_model // 8, d_model // 4, d_model // 2} if d < d_model):
        curves.plot(table[:, dim], label=f"dim {dim}")
    curves.set_xlabel("position")
    curves.set_ylabel("value")
    curves.set_title("a few dimensions: lower ones oscillate faster")
    curves.legend(fontsize=8)
    fig.tight_layout()
    return fig
