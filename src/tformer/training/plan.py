"""The training plan: every choice a run makes before its first update, made once, with why.

    plan = make_plan(objective, resume=False, world=1, started=t0, log=print)
    plan.config        # the options as settled: threads, learning rate, length, batch, sizes
    plan.precision     # "fp32", "bf16" (or "fp16": a CUDA GPU without bf16)
    plan.reasons       # (what, why) per choice, in the order made (the run prints them)

The choices, in order: the threads (one per core that other work leaves free), the fine-tuning
learning rate (from the width of the model that trains) and dropout (the pretrained model's
unless given), --max-length (a timed run from scratch on long texts: tformer.training.sizing),
the batch's tokens (--batch-size examples of the data's mean length), the model's size (a timed
run from scratch: the largest that gets enough updates), the precision (bf16 autocast where a
step of this very model is measured faster).
The loop then builds the objective and the model once, from the plan.

The choices that time steps on this machine (length, size, precision) are probes: together
they spend at most PROBE_SHARE of a timed run's budget, each is remembered per machine, thread
count and shape (tformer.kernels.autotune) so that a second run measures nothing, and one the
budget cannot pay for is not made: the default stands (the preset length, the smallest model,
fp32), and the line says so.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from tformer.devices import half_name, resolve_device
from tformer.formats.pretrained import pretrained_config
from tformer.kernels import autotune
from tformer.kernels.machine import free_threads, others_running
from tformer.stats import check_fits, flops_per_token
from tformer.storage.files import write_json_atomic
from tformer.training.distributed import any_rank
from tformer.training.objectives import Objective
from tformer.training.precision import ROUNDS, choose_precision, confirm_bf16, precision_why, step_class
from tformer.training.sizing import (
    PROBE_STEPS,
    batch_tokens,
    choose_length,
    choose_size,
    finetune_lr,
    measures_rungs,
    rungs_for,
    time_steps,
    truncated,
    wants_auto_length,
    wants_auto_size,
)
from tformer.training.steps import probe_step

PROBE_SHARE = 0.05  # of a timed run's budget, at most, for measuring steps before training
# What a probe is expected to cost before it runs (on 2 quiet cores, no kernel choice remembered):
# each new model's first step, its kernels chosen and its memory first touched, 2-3 s (until a
# probe has measured it on the run's device); then a step of the smallest seq2seq model
# (d_model 128, 2+2 layers) ~0.1 s, larger ones by their FLOPs.
FIRST_CALL_SECONDS = 3.0
BASE_STEP_SECONDS = 0.1
BASE_SIZES = {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 2, "n_decoder_layers": None}


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


class Probes:
    """The plan's measurements of this machine: PROBE_SHARE of `seconds` (the budget) at most,
    each remembered (a second run pays nothing). `slowdown`: how much slower than alone this
    process runs now (other work on its cores, ``choose_threads``): a step time is remembered
    as it would run alone (measured / slowdown) and used as it runs now (x slowdown)."""

    def __init__(self, seconds: float, slowdown: float = 1.0, device: torch.device | None = None) -> None:
        self.allowance, self.slowdown = PROBE_SHARE * seconds, slowdown
        self.device = device or torch.device("cpu")  # where the steps run; remembered per device
        self.spent = 0.0
        self.per_work: float | None = None  # measured seconds per step per unit of _work, now
        self.first_call: float | None = None  # measured: a new model's first step beyond a steady one
        self.probed = False  # whether a step was timed yet in this process

    def left(self) -> float:
        return self.allowance - self.spent

    def affords(self, objective: Objective, models: int = 1, steps: int = 1 + PROBE_STEPS) -> bool:
        """Whether timing `steps` updates of `models` new models of `objective` fits what is left."""
        per_step = (self.per_work or BASE_STEP_SECONDS * self.slowdown) * _work(objective)  # (as loaded)
        first = FIRST_CALL_SECONDS * self.slowdown if self.first_call is None else self.first_call
        return models * (first + steps * per_step) <= self.left()

    def step_seconds(self, objective: Objective, step, batches=None) -> float | None:
        """Seconds per update of `objective`'s model (``time_steps``) on this machine as loaded
        now: remembered (as it would run alone), else measured now if what is left pays for it,
        else None."""
        key = step_class(objective.model_kind, objective.model_config(), _batch(objective.config))
        known = autotune.known("train-step", key, device=self.device)
        if known is not None:
            return known["seconds"]["step"] * self.slowdown
        if not self.affords(objective):
            return None
        t = time.perf_counter()
        seconds, first = time_steps(objective, step, batches, deadline=t + self.left())
        spent = time.perf_counter() - t
        if self.device.type != "cpu" and not self.probed:
            # A GPU's first step in a process loads its kernels and libraries (5.4 s on an H200,
            # its steps then 12 ms): the run pays that once, probed or not, so the probes' share
            # is not charged for it, nor is it what the next model's first step will cost.
            spent = max(0.0, spent - first)
        else:
            self.first_call = first
        self.spent += spent
        self.probed = True
        self.per_work = seconds / _work(objective)
        alone = autotune.decision("measured", {"step": seconds / self.slowdown})
        remembered = autotune.recall("train-step", key, lambda: alone, device=self.device)
        return remembered["seconds"]["step"] * self.slowdown

    def not_paid(self) -> str:
        return (f"not measured: {PROBE_SHARE:.0%} of the budget ({self.allowance:.1f} s) pays for no more "
                "probes here; a run with a longer --max-minutes measures it, and runs after it reuse that")


def choose_threads(config, world: int) -> tuple[object, str | None, float]:
    """(the config with its threads, why or None where given, how much slower than alone this
    process will run): one thread per core that other processes leave free, at least one. Two
    threads sharing their cores with two busy processes made a training step 2-3x slower than one
    thread did (OpenMP's threads wait for the slowest at every product)."""
    cores = torch.get_num_threads()
    if config.threads is not None or world > 1:
        return config, None, 1.0
    others = others_running()
    threads = free_threads(cores, others)
    slowdown = max(1.0, (others + threads) / cores)
    if threads == cores:
        why = f"{threads}, one per core (--threads sets it)"
    else:
        why = (f"{threads} of {cores}: {others:g} threads of other processes are running on this "
               "machine's cores (--threads sets it)")
    return config.replace(threads=threads), why, slowdown


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

    config, why_threads, slowdown = choose_threads(config, world)
    if why_threads is not None:
        torch.set_num_threads(config.threads)
        objective = objective.with_config(config)
        chose("threads", why_threads)
    budget = config.max_minutes * 60 if config.max_minutes else math.inf
    # Other processes on the CPU's cores slow a CPU step; a GPU's step is its own.
    probes = Probes(budget, slowdown if device.type == "cpu" else 1.0, device)

    precision, why_precision = choose_precision(config.precision, device)  # the device's answer
    bf16 = precision != "fp32"  # 16-bit autocast: bf16, or fp16 on a GPU without it

    def seconds_left() -> float:  # training time the probes may plan for
        return 0.9 * (budget - (time.perf_counter() - started))

    if config.lr is None:  # resumed runs saved theirs
        width = objective.model_width()
        config, why = finetune_lr(config, width)
        objective = objective.with_config(config)
        chose("learning rate", why)
    if config.from_pretrained and config.pretrained_dropout and not resume:  # (given: the user knows it)
        own = pretrained_config(config.from_pretrained)
        chose("dropout", f"{own.dropout:g} (attention weights {own.attention_dropout:g}), the pretrained "
                         "model's own (--dropout sets it)")
    if wants_auto_length(config, resume, world):
        data = objective.source.data
        config, why = choose_length(config, objective.with_config, next(data.epoch_pools()), seconds_left(),
                                    partial(probes.step_seconds, step=probe_step(config, bf16)),
                                    objective.train_records or 1, probes.not_paid())
        objective = objective.with_config(config)
        if run_dir is not None:
            write_json_atomic(run_dir / "data.json", objective.source.data.describe())  # resuming reads it
        chose("max length", why, " (--max-length sets it)")
    untrained = getattr(getattr(objective.source, "data", None), "untrained", None)
    if untrained and not resume:
        names = ", ".join(f"{label!r} (only in {' and '.join(splits) or 'held-out records'})"
                          for label, splits in untrained.items())
        log(f"warning: no training record has the label {names}: the model cannot learn it; add "
            "training records of it, or give --valid/--test files")
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
        step = probe_step(config, bf16)
        config, why = choose_size(config, objective.with_config, seconds_left(),
                                  partial(probes.step_seconds, step=step, batches=objective.train_batches(0)),
                                  probes.not_paid(), measure_rungs=measures_rungs(device),
                                  extra_rungs=rungs_for(device))
        objective = objective.with_config(config)
        chose("model size", why, " (size options turn this off)")
    check_fits(objective.model_config(), objective.model_kind, training=True, what="model")
    if config.precision == "auto" and bf16 and not resume:  # generic product faster: this model too?
        bf16, why_precision = _confirm_bf16(objective, probes)
        bf16 = any_rank(bf16, world)  # every rank trains in the same precision
    reasons.append(("precision", why_precision))  # printed by the loop (a resumed run keeps its own)
    return Plan(config, half if bf16 else "fp32", tuple(reasons), half), objective


def _confirm_bf16(objective: Objective, probes: Probes) -> tuple[bool, str]:
    """16-bit autocast for this very model (bf16; fp16 on a GPU without it), or fp32:
    remembered, else measured on the run's device if the probes can pay for two models' steps
    (one batch, again and again: the steady state, not the first call of each new shape's
    kernels, which bf16 pays more for), else fp32."""
    config, device = objective.config, probes.device
    half = half_name(device)
    shape = _batch(config)
    if config.from_pretrained:  # its own shape, not the size options': named by its directory
        shape += f", from {Path(config.from_pretrained).resolve()}"
    key = step_class(objective.model_kind, objective.model_config(), shape)
    known = autotune.known("train-precision", key, {"fp32", half}, device)
    if known is not None:
        return known["choice"] == half, precision_why(known, half)
    if not probes.affords(objective, models=2, steps=1 + ROUNDS):
        return False, f"{half} for this model {probes.not_paid()}"
    batch = functools.cache(lambda: next(objective.train_batches(0)))

    def stepper(bf16: bool):
        model, step = objective.build_model(), probe_step(config, bf16)
        return lambda: step(model, batch(), objective)

    t = time.perf_counter()
    decision = confirm_bf16(stepper, key, deadline=t + probes.left(), device=device)
    probes.spent += time.perf_counter() - t
    return decision


def _batch(config) -> str:
    if config.max_tokens:
        return f"{config.max_tokens} tokens"
    return f"{config.batch_size} x {config.max_length}"


def _work(objective: Objective) -> float:
    """A step's FLOPs per token against the smallest seq2seq model's (a probe's unit of work)."""
    c = objective.model_config()
    if objective.config.from_pretrained:  # its own sizes
        c = pretrained_config(objective.config.from_pretrained)
    base = flops_per_token(c.replace(**BASE_SIZES), 64, "seq2seq")
    return flops_per_token(c, 64, objective.model_kind) / base
