"""The training plan: every choice a run makes before its first update, made once, with why.

    plan = make_plan(objective, resume=False, world=1, started=t0, log=print)
    plan.config        # the options as settled: learning rate, length, batch, sizes
    plan.precision     # "fp32", "bf16" (or "fp16": a CUDA GPU without bf16)
    plan.reasons       # (what, why) per choice, in the order made (the run prints them)

The choices, in order: the fine-tuning learning rate (from the width of the model that
trains), --max-length (a timed run from scratch on long texts: tformer.training.sizing),
the batch's tokens (--batch-size examples of the data's mean length), the model's size (a
timed run from scratch: the largest that gets enough updates), the precision (bf16 autocast
where a step of this very model is measured faster). The loop then builds the objective and
the model once, from the plan.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tformer.devices import half_name, resolve_device
from tformer.stats import check_fits
from tformer.storage.files import write_json_atomic
from tformer.training.distributed import any_rank
from tformer.training.objectives import Objective
from tformer.training.precision import choose_precision, confirm_bf16, step_class
from tformer.training.sizing import (
    batch_tokens,
    choose_length,
    choose_size,
    finetune_lr,
    time_steps,
    truncated,
    wants_auto_length,
    wants_auto_size,
)
from tformer.training.steps import probe_step


@dataclass(frozen=True)
class Plan:
    config: object  # the TrainConfig as settled
    precision: str  # "fp32", "bf16" or "fp16"
    reasons: tuple[tuple[str, str], ...] = ()  # (what was chosen, why), in the order chosen
    half: str = "bf16"  # the device's 16-bit autocast type (fp16 on a CUDA GPU without bf16)

    @property
    def bf16(self) -> bool:
        """16-bit autocast: bf16, or fp16 where the device has no bf16 (tformer.devices)."""
        return self.precision != "fp32"

    def why(self, what: str) -> str | None:
        return dict(self.reasons).get(what)


def make_plan(objective: Objective, resume: bool, world: int, started: float, log=print,
              run_dir: Path | None = None, device=None) -> tuple[Plan, Objective]:
    """The plan of a run of `objective` (its config as given), and the objective under it.
    Each choice is logged as it is made; choices that time steps measure on the run's device."""
    config = objective.config
    device = device or resolve_device(config.device)
    half = half_name(device)
    reasons: list[tuple[str, str]] = []

    def chose(what: str, why: str, note: str = "") -> None:
        reasons.append((what, why))
        log(f"{what}: {why}{note}")

    precision, why_precision = choose_precision(config.precision, device)  # the device's answer
    bf16 = precision != "fp32"  # 16-bit autocast: bf16, or fp16 on a GPU without it

    def seconds_left() -> float:  # training time the probes may plan for
        return 0.9 * (config.max_minutes * 60 - (time.perf_counter() - started))

    if config.lr is None:  # resumed runs saved theirs
        width = objective.model_width()
        config, why = finetune_lr(config, width)
        objective = objective.with_config(config)
        chose("learning rate", why)
    if wants_auto_length(config, resume, world):
        data = objective.source.data
        config, why = choose_length(config, objective.with_config, next(data.epoch_pools()),
                                    seconds_left(), partial(time_steps, step=probe_step(config, bf16)),
                                    objective.train_records or 1)
        objective = objective.with_config(config)
        if run_dir is not None:
            write_json_atomic(run_dir / "data.json", objective.source.data.describe())  # resuming reads it
        chose("max length", why, " (--max-length sets it)")
    if config.data is not None and (not resume or config.max_tokens is None):
        sample = objective.encode(next(objective.source.data.epoch_pools()))  # a sample of the file
        cut = truncated([ex.longest for ex in sample], objective.tokenizer.max_length)
        if cut and not resume:  # a resumed run said it when it started
            log(cut)
        if config.max_tokens is None:
            config, why = batch_tokens(config, [ex.cost for ex in sample])
            objective = objective.with_config(config)
            chose("batch", why)
    if wants_auto_size(config, resume, world):
        config, why = choose_size(config, objective.with_config, seconds_left(), objective.train_batches(0),
                                  probe_step(config, bf16))
        objective = objective.with_config(config)
        chose("model size", why, " (size options turn this off)")
    check_fits(objective.model_config(), objective.model_kind, training=True, what="model")
    if config.precision == "auto" and bf16 and not resume:  # generic product faster: this model too?
        # One batch, again and again: the steady state, not the first call of each new shape's
        # kernels (which bf16 pays more for); drawn only if the choice is not known yet.
        batch = functools.cache(lambda: next(objective.train_batches(0)))
        shape = f"{config.max_tokens} tokens" if config.max_tokens else (
            f"{config.batch_size} x {config.max_length}")
        if config.from_pretrained:  # its own shape, not the size options': named by its directory
            shape += f", from {Path(config.from_pretrained).resolve()}"
        bf16, why_precision = confirm_bf16(
            lambda b: time_steps(objective, probe_step(config, b), itertools.repeat(batch())),
            step_class(objective.model_kind, objective.model_config(), shape), device)
        bf16 = any_rank(bf16, world)  # every rank trains in the same precision
    reasons.append(("precision", why_precision))  # printed by the loop (a resumed run keeps its own)
    return Plan(config, half if bf16 else "fp32", tuple(reasons), half), objective
