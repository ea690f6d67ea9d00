"""Resuming a run: its saved TrainConfig, with only the options a resume may change changed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tformer.errors import FieldError
from tformer.training.config import MODEL_OPTIONS, RESUMABLE, TrainConfig, check_keys, read_train_config


def resume_config(run_dir: str | Path, *layers: dict[str, Any]) -> TrainConfig:
    """The saved TrainConfig of `run_dir` with `layers` applied; only RESUMABLE options may
    change (the others define the experiment being continued)."""
    # Here: the checkpoint modules import torch, and this module must not (--engine numpy).
    from tformer.storage.checkpoint import check_run_dir
    from tformer.storage.files import read_json_object
    from tformer.storage.rundir import check_unlocked, finished, limits_of

    # A run in progress replaces its checkpoints while we read. Under torchrun only rank 0
    # looks: the lock is rank 0's to take, and a rank probing it while its peer did (or
    # already trained) was refused as "in use by another process" (tests/training/test_distributed).
    if int(os.environ.get("RANK", "0")) == 0:
        check_unlocked(run_dir)
    checkpoint = check_run_dir(run_dir)  # the newest checkpoint's files
    saved = read_train_config(checkpoint)
    changes: dict[str, Any] = {}
    for layer in layers:
        changes.update(layer)
    if changes.get("out") is not None and Path(changes["out"]).resolve() != Path(run_dir).resolve():
        raise FieldError("out", f"a resumed run stays in its directory ({run_dir}); expected no --out "
                         f"or that one, got {changes['out']}")  # (it was silently ignored)
    changes["out"] = str(Path(run_dir))
    check_keys(changes)
    if "dropout" in changes and saved.from_pretrained and saved.pretrained_dropout:
        raise FieldError("dropout", f"cannot change when resuming (the run trains with the dropout of "
                         f"{saved.from_pretrained}, got {changes['dropout']!r}); only "
                         f"{', '.join(RESUMABLE)} can")
    for name, value in changes.items():
        had = getattr(saved.model if name in MODEL_OPTIONS else saved, name)
        if name not in RESUMABLE and value != had:
            raise FieldError(
                name, f"cannot change when resuming (the run has {had!r}, "
                f"got {value!r}); only {', '.join(RESUMABLE)} can"
            )
    resumed = saved.replace(**changes)
    try:
        state = read_json_object(checkpoint / "trainer_state.json")
    except (OSError, ValueError):  # missing or damaged: the resume itself says so, in its words
        state = {}
    limits = limits_of(resumed)
    # A run that had ended prints its result and changes nothing; one on its way would be tested at
    # its step and saved as ended there, its own --steps replaced by the smaller one.
    step = state.get("step")
    if isinstance(step, int) and resumed.steps < step and not finished(state, limits):
        raise FieldError(
            "steps", f"expected at least {step}, the step of its checkpoint (the run was on its way to "
            f"{saved.steps}), got {resumed.steps}: a run does not train backwards; omit --steps to go on, "
            f"or score it as it is with `tformer eval {run_dir}`")
    return resumed
