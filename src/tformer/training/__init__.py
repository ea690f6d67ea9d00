"""Training: config, data, sources, the objective every kind shares, the plan, the loop,
evaluation, report. What is kind-specific lives in each kind's module (tformer.kinds).

    from tformer.kinds import resolve_config, train
    record = train(resolve_config({"data": "train.jsonl", "max_minutes": 10}))

Names are imported on first use, so ``tformer.training.config`` stays torch-free (the NumPy
engine, ``tformer train --engine numpy``, reads the same TrainConfig without torch).
"""

from __future__ import annotations

import importlib

# public name -> module that defines it
_LAZY = {
    "PRESETS": "presets", "RESUMABLE": "config",
    "SCHEDULES": "config", "TrainConfig": "config", "load_config_file": "config",
    "resume_config": "resuming", "learning_rate": "schedule",
    "make_optimizer": "steps", "make_plan": "plan",
    "Objective": "objective", "evaluating": "objective", "forward_loss": "losses",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"tformer.training.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tformer.training' has no attribute {name!r}")
