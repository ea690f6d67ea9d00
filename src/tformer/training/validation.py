"""Validation within a run: scoring the validation sample, keeping the best weights (by a
margin beyond the validation's noise), checkpoints, and how a fine-tune compares to its start."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import nn

from tformer.nn.kernels.autotune import seconds_measuring
from tformer.storage.checkpoint import save_checkpoint, weights_metadata
from tformer.storage.files import write_atomic
from tformer.storage.rundir import read_metrics
from tformer.training.budget import PROBE, PROBE_WARM_UP, Budget
from tformer.training.config import TrainConfig
from tformer.training.objective import Objective
from tformer.training.report import Progress


def score_validation(model: nn.Module, objective: Objective, budget: Budget,
                     bar: Progress, note=None) -> dict[str, float]:
    """Metrics on the validation sample; a timed run first times a few examples to size it
    (`note`: what says so where that moves the plan's validation line). What validation
    spends measuring new kernel choices counts in its time, not in its rate (the test's and
    later validations' estimates): those are made once."""
    examples = objective.examples("validation")
    deadline = budget.valid_deadline() if budget.timed else None
    budget.available = len(examples)
    if budget.needs_probe():
        bar.status("timing validation")
        # A model's first calls in evaluation (first shapes, first touch) are not its pace: a
        # 1-minute fine-tune's probe with them ran 22 ms an example where its validations ran
        # at 9, and validated 39 examples where the budget paid for 120. They run first, apart.
        t = time.perf_counter()
        objective.evaluate(model, "validation", examples=examples[:PROBE_WARM_UP], deadline=deadline)
        warm_up = time.perf_counter() - t
        probe = examples[PROBE_WARM_UP : PROBE_WARM_UP + PROBE] or examples[:PROBE]
        t, measuring = time.perf_counter(), seconds_measuring()
        objective.evaluate(model, "validation", examples=probe, deadline=deadline)
        seconds, measuring = time.perf_counter() - t, seconds_measuring() - measuring
        resized = budget.probed(seconds - measuring, len(probe), aside=warm_up + measuring)
        if resized and note is not None:
            note(resized)
    sample = examples[: budget.sample_size(len(examples))]
    t, measuring = time.perf_counter(), seconds_measuring()
    valid, _ = objective.evaluate(model, "validation", examples=sample, deadline=deadline,
                                  progress=lambda done, of: bar.status("validating", done, of))
    seconds, measuring = time.perf_counter() - t, seconds_measuring() - measuring
    budget.validated(seconds - measuring, valid["examples"], objective.loss_pass, aside=measuring,
                     growth=objective.growth)
    if not all(math.isfinite(v) for v in valid.values()):
        raise ValueError(f"validation: expected finite outputs, got {valid}; stopped, keeping the "
                         "last good checkpoint (if any); try a lower --lr")
    return valid


def selection(objective: Objective, valid: dict[str, float]) -> tuple[str, float]:
    """(what picks the best weights, its score: higher is better): the objective's ``best_by``
    (a sequence-to-sequence run's: its teacher-forced loss, lower is better)."""
    by = objective.best_by
    return by, -valid[by] if by == "loss" else valid[by]


def from_start(metrics_path: Path, objective: Objective) -> dict[str, Any]:
    """How a run validated at step 0 (``Objective.starts_complete``) compares to its start, for
    its test record: the main metric of the pretrained model as it was (pretrained_validation),
    whether that start had its new head fitted first (head_probed: the kind probes; it validates
    at step 0 only so), and of the best fine-tuned weights by the same selection
    (tuned_validation, at tuned_step; absent where no step was validated); {} for a run not
    validated at step 0."""
    validations = [r for r in read_metrics(metrics_path) if r.get("split") == "validation"]
    start = [r for r in validations if r["step"] == 0]
    if not start:
        return {}
    key = objective.main_metric
    # (a kind that probes validates at step 0 only with its head fitted: tformer.training.probe)
    found = {"pretrained_validation": start[-1][key], "head_probed": objective.probes_head}
    tuned = [r for r in validations if r["step"] > 0]
    if tuned:  # the first of the best, as _track_best keeps it
        best = max(tuned, key=lambda r: selection(objective, r)[1])
        found |= {"tuned_validation": best[key], "tuned_step": best["step"]}
    return found


def track_best(state: dict[str, Any], by: str, value: float, examples: int = 0) -> bool:
    """Record a new best validation score (higher is better); count validations since. A later
    validation takes the place of the best unless the best is better beyond the validation's
    noise (``noise``, on `examples` examples; 0 for a loss): with a schedule that decays to the
    budget's end, later weights are the better guess, and the highest of noisy scores is mostly
    noise (a fine-tune's tested weights were picked at 0.969 against 0.938 on 32 examples). A
    run resumed with another selection (a seq2seq run an older version picked by BLEU) starts over."""
    if state.get("best_by") != by:
        state["best"], state["best_by"] = None, by
    best = state.get("best")
    if best is None or value > best - noise(by, best, examples):
        state["best"], state["best_step"], state["since_best"] = value, state["step"], 0
        return True
    state["since_best"] = state.get("since_best", 0) + 1
    return False


def noise(by: str, score: float, examples: int) -> float:
    """How far apart two validations of a score in [0, 1] (accuracy, MRR@10) on `examples`
    examples may fall by chance: two standard errors of their difference; 0 for a loss or no count."""
    if by == "loss" or examples <= 0 or not 0.0 <= abs(score) <= 1.0:
        return 0.0
    p = abs(score)
    return 2.0 * math.sqrt(2.0 * max(p * (1 - p), 0.25 / examples) / examples)


def checkpoint(run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig,
                state: dict[str, Any], best: bool) -> None:
    """Every file the loop writes about the model: the checkpoint, then the best weights (a kill
    between them leaves a checkpoint at its best step, whose resume rewrites them)."""
    save_checkpoint(run_dir, model, optimizer, config, state, keep=config.keep)
    if best:
        save_best(run_dir, model)


def save_best(run_dir: Path, model: nn.Module) -> None:
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    write_atomic(run_dir / "best.safetensors", st_save(weights, metadata=weights_metadata(model)))
