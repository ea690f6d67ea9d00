"""Position-wise feed-forward network (Vaswani et al. 2017, §3.3): down(act(up(x)))."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact: x * Phi(x), with the erf (Hendrycks & Gimpel 2016)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class FeedForward(nn.Module):
    """Two linear maps with an activation between, applied to each position alike.

    Shape:
        x: (B, S, D) -> (B, S, D), through (B, S, F) inside
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation: expected one of {', '.join(ACTIVATIONS)}; got {activation!r}"
            )
        self.activation = activation
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(ACTIVATIONS[self.activation](self.up(x)))  # (B, S, F) -> (B, S, D)
