"""AdamW and gradient-norm clipping in NumPy, step for step as torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_.

Parameters and gradients are dicts of arrays keyed as the state dict; parameters are
updated in place (``model.state_dict()`` returns the model's own arrays).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


class AdamW:
    """Adam (Kingma & Ba 2015) with decoupled weight decay (Loshchilov & Hutter 2019).

    For each parameter p with gradient g, at step t (1-based), in torch's order:
        p <- p * (1 - lr * wd)                      decay, not through the gradient
        m <- m + (1 - b1) (g - m)                   first moment  (torch: lerp)
        v <- b2 v + (1 - b2) g^2                    second moment
        p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    Dividing by 1 - b^t undoes the moments' bias toward their zero start.

    Args:
        params: the parameters, by key (their arrays are updated in place).
        weight_decay: one value for all, or a value per key.
    """

    def __init__(self, params: Mapping[str, np.ndarray], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float | Mapping[str, float] = 0.01) -> None:
        self.params = dict(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        if isinstance(weight_decay, Mapping):
            self.weight_decay = {k: float(weight_decay[k]) for k in self.params}
        else:
            self.weight_decay = dict.fromkeys(self.params, float(weight_decay))
        self.exp_avg = {k: np.zeros_like(p) for k, p in self.params.items()}
        self.exp_avg_sq = {k: np.zeros_like(p) for k, p in self.params.items()}
        self.step_count = 0

    def step(self, grads: Mapping[str, np.ndarray], lr: float | None = None) -> None:
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.step_count += 1
        t = self.step_count
        step_size = lr / (1 - b1**t)
        bias_correction2_sqrt = math.sqrt(1 - b2**t)
        for key, p in self.params.items():
            g = grads[key]
            m, v = self.exp_avg[key], self.exp_avg_sq[key]
            p *= 1 - lr * self.weight_decay[key]
            m += (1 - b1) * (g - m)
            v *= b2
            v += (1 - b2) * g * g
            denom = np.sqrt(v) / bias_correction2_sqrt + self.eps
            p -= step_size * (m / denom)


def clip_grad_norm_(grads: Mapping[str, np.ndarray], max_norm: float) -> float:
    """Scale all gradients together so their global L2 norm is at most `max_norm` (in place,
    as torch: by max_norm / (norm + 1e-6) when that is below 1). Returns the norm before."""
    norms = [np.linalg.norm(g.reshape(-1)) for g in grads.values()]
    total = float(np.linalg.norm(np.array(norms)))
    coef = min(max_norm / (total + 1e-6), 1.0)
    for g in grads.values():
        g *= g.dtype.type(coef)
    return total
