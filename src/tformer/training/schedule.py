"""The learning-rate schedules (torch-free: the NumPy engine uses them too)."""

from __future__ import annotations

import math

from tformer.training.config import TrainConfig


def learning_rate(config: TrainConfig, step: int) -> float:
    """The learning rate for the `step`-th update (1-based).

    inverse_sqrt: Vaswani et al. 2017, §5.3, lrate = d^-0.5 * min(step^-0.5, step *
    warmup^-1.5), rescaled so that its peak (at step = warmup) is `lr`:
    lr * min(step / warmup, sqrt(warmup / step)).
    cosine: linear warmup to `lr`, then a half cosine down to 0 at `steps`.
    linear: linear warmup, then linear decay to 0 at `steps` (BERT, Devlin et al. 2019).
    """
    warmup = max(config.warmup, 1)
    if step < warmup:
        return config.lr * step / warmup
    if config.schedule == "inverse_sqrt":
        return config.lr * math.sqrt(warmup / step)
    progress = min((step - warmup) / max(config.steps - warmup, 1), 1.0)
    if config.schedule == "linear":
        return config.lr * (1 - progress)
    return config.lr * 0.5 * (1 + math.cos(math.pi * progress))
