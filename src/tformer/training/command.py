"""The `tformer train` command line that trains a saved TrainConfig again (model cards show it).

    train_command(read_train_config(RUN))   # "tformer train --data x.jsonl --d-model 192 ..."
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from tformer.training.config import MODEL_OPTIONS, TrainConfig, resolve_config

# What a `tformer train` command line starts from: the options that choose the preset.
COMMAND_BASE = ("data", "task", "from_pretrained", "max_minutes", "columns", "valid", "test")


def train_command(config: TrainConfig, objective=None) -> str:
    """A `tformer train` command that trains ``config`` again: the options that choose the
    preset, then every option whose value differs from what those alone resolve to (a choice
    the run made itself, such as the size picked for --max-minutes, as the option it became).
    ``objective``: a data run's Objective class (its kind's preset; its data file need not be
    there any more)."""
    base = {k: getattr(config, k) for k in COMMAND_BASE if getattr(config, k) is not None}
    base.pop("task" if config.data is not None else "data", None)
    default = resolve_config(base, objective=objective if config.data is not None else None)
    words = ["tformer", "train"] + [w for k, v in base.items() for w in _option(k, v)]
    for name in [f.name for f in dataclasses.fields(TrainConfig)] + list(MODEL_OPTIONS):
        if name in COMMAND_BASE or name in ("model", "out"):
            continue
        ours, theirs = (getattr(c.model if name in MODEL_OPTIONS else c, name) for c in (config, default))
        if ours != theirs:
            words += _option(name, ours)
    return shlex.join(words)


def _option(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    return [flag, "none" if value is None else str(value)]


