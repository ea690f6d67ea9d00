"""Position-wise feed-forward network (Vaswani et al. 2017, §3.3): down(act(up(x)))."""

from __future__ import annotations

from torch import Tensor, nn

from tformer.config import ACTIVATIONS, check_positive
from tformer.nn import kernels


class FeedForward(nn.Module):
    """Two linear maps with an activation between, applied to each position alike.

    Shape:
        x: (..., D) -> (..., D), through (..., F) inside
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True):
        super().__init__()
        check_positive("d_model", d_model)
        check_positive("d_ff", d_ff)
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation: expected one of {', '.join(ACTIVATIONS)}; got {activation!r}"
            )
        self.activation = activation
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        h = kernels.linear(x, self.up, self.activation)  # (..., F), the activation fused
        return kernels.linear(h, self.down)  # (..., D)
