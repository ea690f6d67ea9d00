"""The learning-rate schedules (torch-free: the NumPy engine uses them too)."""

from __future__ import annotations

import math

from tformer.training.config import TrainConfig

WARMUP_SHARE = 0.1  # warmup never takes more than this share of the planned steps


def learning_rate(config: TrainConfig, step: int, total: int | None = None) -> float:
    """The learning rate for the `step`-th update (1-based) of `total` planned (--steps,
    or what the run's budget allows: tformer.training.budget).

    inverse_sqrt: Vaswani et al. 2017, §5.3, lrate = d^-0.5 * min(step^-0.5, step *
    warmup^-1.5), rescaled so that its peak (at step = warmup) is `lr`:
    lr * min(step / warmup, sqrt(warmup / step)).
    cosine: linear warmup to `lr`, then a half cosine down to 0 at `steps`.
    linear: linear warmup, then linear decay to 0 at `steps` (BERT, Devlin et al. 2019).
    Warmup lasts --warmup steps, or WARMUP_SHARE of the planned steps if that is fewer.
    """
    total = config.steps if total is None else total
    warmup = max(min(config.warmup, round(WARMUP_SHARE * total)), 1)
    if step < warmup:
        return config.lr * step / warmup
    if config.schedule == "inverse_sqrt":
        return config.lr * math.sqrt(warmup / step)
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    if config.schedule == "linear":
        return config.lr * (1 - progress)
    return config.lr * 0.5 * (1 + math.cos(math.pi * progress))
