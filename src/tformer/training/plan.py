"""The training plan: every choice a run makes before its first update, made once, with why.

    plan = make_plan(config, data, speeds, seconds)   # pure: a data summary and a machine's speeds in
    plan.config        # the options as settled: length, batch, sizes
    plan.precision     # "fp32", "bf16" (or "fp16": a CUDA GPU without bf16)
    plan.reasons       # (what, why) per choice, in the order made (the run prints them)
    plan.validations, plan.valid_sample, plan.test_seconds, plan.step_seconds

``make_plan`` measures nothing: what it knows of the machine comes in `speeds` (``Speeds``: the
seconds a step of a given model takes, and the precision), what it knows of the data in `data`
(``DataSummary``: each sampled example's token counts, the splits' sizes, the model as
configured). tformer.training.planning gathers both for a real run (estimates from FLOPs at
the rate this machine's own steps measured, remembered across runs) and the loop runs the plan;
tests hand it made-up speeds and assert on the choices.

The choices, in order: --max-length (a timed run on long texts: the longest that still passes
over the data often enough, tformer.training.sizing), the batch's tokens (--batch-size examples
of the data's mean length at that length), the model's size (a timed run from scratch: the
largest that gets enough updates), the precision (the speeds' answer: remembered, or predicted
where bf16 products are faster and then confirmed by the run's first real steps), validation
(how often and on how many examples: enough for a choice between checkpoints to mean something)
and the time kept back for the final test.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Protocol

from tformer.config import TransformerConfig
from tformer.config.sizes import parameter_count
from tformer.training.sizing import (
    AUTO_LENGTH_LIMIT,
    LADDER,
    batch_tokens,
    choose_length,
    choose_size,
    fixed_seconds,
    probe_plan,
    scratch_lr,
    wants_auto_length,
    wants_auto_size,
)

SIZES = ("d_model", "n_heads", "d_ff", "n_layers", "n_decoder_layers")
# Validation. A choice between two checkpoints on n examples is noise unless they differ by more
# than ~2 sqrt(2 p (1 - p) / n): 0.2 at n = 32 (a fine-tune's tested weights were picked at 0.969
# against 0.938), 0.06 at n = 300. So each validation scores at least VALID_MIN examples (all of a
# smaller split), and a short run validates fewer times rather than on fewer examples.
VALID_SHARE = 0.05  # validations' share of the training time, at most (about)
VALID_MIN = 300
VALID_MAX = 500
VALIDATIONS = 5  # the most a timed run makes (the last at the end of training)
MIN_VALIDATIONS = 2  # the fewest: one mid-way and the last
TEST_SHARE = 0.15  # the final test's share of the budget, at most
TEST_MARGIN = 2.5  # the test's examples at ~2.5x a prediction each: its loss pass, then predictions
# A predicted 16-bit precision is confirmed by the run's first updates (CONFIRM_ROUNDS of each,
# tformer.training.first_steps) only where fp32's take at most CONFIRM_SHARE of the training time:
# a 1-minute MiniLM reranking fine-tune (bf16 products 12x faster here) spent its budget timing
# fp32 updates of 20 passages a query and made 2 updates.
CONFIRM_ROUNDS = 3
CONFIRM_SHARE = 0.05
# Predicting one example against a training step's share of one: a forward is ~1/3 of a step's
# FLOPs (an objective whose predictions cost more says so: Objective.predict_cost).
PREDICT_COST_DEFAULT = 0.5


@dataclass(frozen=True)
class DataSummary:
    """What the plan knows of the data: `texts`, a sample of training examples, each the token
    counts of its texts (specials included, uncut up to AUTO_LENGTH_LIMIT); the splits' sizes;
    `model`, the model as configured (a fine-tune's: the pretrained one, whose sizes stand)."""

    kind: str  # what tformer.config.sizes sizes: "seq2seq", "classifier" or "encoder"
    model: TransformerConfig
    texts: tuple[tuple[int, ...], ...]
    train_examples: int
    valid_examples: int
    test_examples: int
    pretrained: bool = False
    predict_cost: float = PREDICT_COST_DEFAULT  # one example's prediction, in a step's share of one
    steps_factor: float = 1.0  # the updates its model must get, in MIN_STEPS (Objective.steps_factor)
    probes: bool = False  # a fine-tune's new head is fitted to its features first (tformer.training.probe)

    def cut_share(self, length: int) -> float:
        """The share of the sampled examples whose longest text `length` cuts."""
        return sum(max(t) >= length for t in self.texts) / max(len(self.texts), 1)

    def mean_cost(self, length: int) -> float:
        """Tokens per example at `length` (each text cut there): what a batch's tokens count."""
        return sum(sum(min(n, length) for n in t) for t in self.texts) / max(len(self.texts), 1)

    def keys(self, length: int) -> float:
        """The keys a token attends to at `length`, on average (each text cut there, a sequence
        of its own): its text's length, weighted by the text's tokens. What a step's attention
        costs goes with its tokens x this, not x the mean length: a batch holds fewer long texts,
        so more batches hold them. Man pages' DESCRIPTIONs at 512 tokens: 257 tokens a text,
        ~390 keys a token; the plan expected 795 ms a step of a d_model-128 classifier on 8,235
        tokens, and its first 60 steps averaged 1.1 s."""
        cut = [min(n, length) for t in self.texts for n in t]
        return sum(n * n for n in cut) / max(sum(cut), 1)

    def model_for(self, config) -> TransformerConfig:
        """The model `config` trains: its sizes (a fine-tune keeps the pretrained model's)."""
        if self.pretrained:
            return self.model
        return self.model.replace(**{k: getattr(config.model, k) for k in SIZES},
                                  max_len=config.max_length)


class Speeds(Protocol):
    """What a plan knows of the machine (tformer.training.planning.MachineSpeeds measures it)."""

    def step_seconds(self, config, model: TransformerConfig, kind: str, tokens: float, length: float,
                     precision: str) -> float | None:
        """Seconds an update of `model` takes on batches of `tokens` tokens, each attending to
        `length` keys on average (DataSummary.keys), as the machine runs now; None where not
        known (and too dear to find out)."""

    def precision(self, config, model: TransformerConfig, kind: str) -> tuple[str, str, bool]:
        """(the precision, why, whether the run's first steps should confirm it)."""


@dataclass(frozen=True)
class Plan:
    config: object  # the TrainConfig as settled
    precision: str  # "fp32", "bf16" or "fp16"
    reasons: tuple[tuple[str, str], ...] = ()  # (what was chosen, why), in the order chosen
    half: str = "bf16"  # the device's 16-bit autocast type (fp16 on a CUDA GPU without bf16)
    confirm_precision: bool = False  # the first real steps time both precisions, then keep the faster
    step_seconds: float | None = None  # an update's expected seconds (the re-plan compares the real ones)
    example_seconds: float | None = None  # a validation or test example's expected seconds
    validations: int = VALIDATIONS  # a timed run's validations (the last at its end)
    valid_sample: int | None = None  # examples each validation scores (None: sized by the loop's probe)
    test_seconds: float | None = None  # kept back for the final test from the start
    sized: bool = False  # the model's size was chosen here (a re-plan may choose again)
    probe_sample: int = 0  # training examples whose features fit a fine-tune's new head (0: none)
    extra: dict = field(default_factory=dict, compare=False)  # for the re-plan: the budget it planned for

    @property
    def bf16(self) -> bool:
        """16-bit autocast: bf16, or fp16 where the device has no bf16 (tformer.nn.devices)."""
        return self.precision != "fp32"

    def why(self, what: str) -> str | None:
        return dict(self.reasons).get(what)


def make_plan(config, data: DataSummary, speeds: Speeds, seconds: float, resume: bool = False,
              world: int = 1, half: str = "bf16", rungs: tuple[dict[str, int], ...] = ()) -> Plan:
    """The plan of a run of `config` on `data` on a machine of `speeds`, with `seconds` left of
    its budget (math.inf: untimed). Measures nothing; `config` has its threads and learning rate;
    `rungs`: the sizes above the ladder this device may take (tformer.training.sizing.rungs_for)."""
    reasons: list[tuple[str, str]] = []
    start = config  # (a re-plan plans again from here)
    timed = math.isfinite(seconds)
    training = 0.9 * seconds if timed else math.inf  # (the rest: validations, the test, saving)
    precision, why_precision, confirm = speeds.precision(config, data.model_for(config), data.kind)

    def with_batch(c):
        return c if config.max_tokens is not None else batch_tokens(c.replace(max_tokens=None),
                                                                    [data.mean_cost(c.max_length)])[0]

    def step(c, precision: str = precision) -> float | None:
        tokens = c.max_tokens if c.max_tokens else c.batch_size * data.mean_cost(c.max_length)
        return speeds.step_seconds(c, data.model_for(c), data.kind, tokens, data.keys(c.max_length),
                                   precision)

    if wants_auto_length(config, resume, world) and data.texts:
        limit = min(AUTO_LENGTH_LIMIT, data.model.max_len) if data.pretrained else AUTO_LENGTH_LIMIT
        sized = config.replace(**LADDER[0]) if wants_auto_size(config, resume, world) else config
        chosen, why = choose_length(sized, data.cut_share, training, step, data.train_examples or 1,
                                    with_batch, limit=limit, pretrained=data.pretrained)
        config = config.replace(max_length=chosen.max_length)
        reasons.append(("max length", why))
    if config.max_tokens is None and data.texts:
        config, why = batch_tokens(config, [data.mean_cost(config.max_length)])
        reasons.append(("batch", why))
    sized = wants_auto_size(config, resume, world)
    if sized:
        config, why = choose_size(config, training, step, "not known on this machine", rungs,
                                  lambda c: sum(fixed_seconds(parameter_count(data.model_for(c), data.kind))),
                                  data.steps_factor)
        reasons.append(("model size", why))
    if not resume and not data.pretrained:  # (a resumed run keeps the rate it saved)
        config, why = scratch_lr(config)
        if why:
            reasons.append(("learning rate", why))
    fp32 = step(config, "fp32") if confirm and timed and data.texts else None
    if fp32 is not None and CONFIRM_ROUNDS * fp32 > CONFIRM_SHARE * training:
        confirm = False
        why_precision += (f"; not timed against fp32 by the first updates: {CONFIRM_ROUNDS} fp32 updates "
                          f"would take ~{CONFIRM_ROUNDS * fp32:,.1f} s, more than {CONFIRM_SHARE:.0%} of "
                          "the training time")
    reasons.append(("precision", why_precision))
    per_step = step(config) if data.texts else None  # (a synthetic task's: measured as it runs)
    share = data.predict_cost
    # A batch holds batch_size examples, or fewer where its tokens hold fewer (a reranking batch
    # of 4,096 tokens holds ~2 queries of 20 passages: the validation planned at 32 examples a
    # step took 24% of a fine-tune's time, not 5%, and the test scored 19 of 50 queries).
    held = config.max_tokens / max(data.mean_cost(config.max_length), 1e-9) if config.max_tokens else math.inf
    per_example = None if per_step is None else share * per_step / max(min(config.batch_size, held), 1e-3)
    validations, sample, test = VALIDATIONS, None, None
    if timed and per_example is not None:
        validations, sample, why = validation_plan(training, per_example, data.valid_examples)
        reasons.append(("validation", why))
        test = min(data.test_examples * per_example * TEST_MARGIN, TEST_SHARE * seconds)
    probe = 0
    if data.probes and not resume:
        probe, why = probe_plan(training, per_example, data.train_examples)
        reasons.append(("head", why))
    return Plan(config, precision, tuple(reasons), half, confirm, per_step, per_example, validations,
                sample, test, sized, probe, {"seconds": training, "rungs": rungs, "config": start})


def validation_plan(training: float, per_example: float, available: int,
                    extra: int = 0) -> tuple[int, int, str]:
    """(validations, examples each, why) for a run of `training` seconds whose examples take
    `per_example` seconds to validate: as many validations (at most VALIDATIONS, at least
    MIN_VALIDATIONS) of at least VALID_MIN examples (all of a smaller split; at most VALID_MAX)
    as VALID_SHARE of the time pays for; at the least, MIN_VALIDATIONS of what it pays for.
    `extra`: validations beyond those (a fine-tune's of its starting model) the share also pays for."""
    want = min(available, VALID_MAX)
    floor = min(available, VALID_MIN)
    paid = VALID_SHARE * training / max(per_example, 1e-9)  # examples the share pays for in all
    count = max(MIN_VALIDATIONS, min(VALIDATIONS, int(paid // max(floor, 1))))
    sample = max(1, min(want, int(paid // (count + extra))))
    note = "" if sample >= floor else f" (fewer than {floor}: the budget pays for no more)"
    why = (f"{count} times, on {sample:,} examples each{note}: about {VALID_SHARE:.0%} of the "
           f"training time at ~{per_example * 1000:,.1f} ms an example")
    return count, sample, why


def replan(plan: Plan, data: DataSummary, speeds: Speeds, measured: float, seconds: float,
           done: int = 0) -> Plan | None:
    """A new plan once the run's first real steps (`done` updates so far) took `measured`
    seconds each where the plan expected plan.step_seconds, with `seconds` of training time
    left; None when the plan stands: its size was not chosen here, the two agree within
    REPLAN_RATIO, the same size and length are chosen again at the real pace, or it is too late
    for starting over to pay (``_pays``). The first plan's rules (make_plan), with every step
    estimate scaled to the pace the real steps showed, so the length is chosen again with the
    size: beside two busy processes a plan that expected 145 ms a step at 512 tokens got 1,066
    and made 17 updates in a minute, the smallest model and the length it had kept."""
    expected, start = plan.step_seconds, plan.extra.get("config")
    if not plan.sized or expected is None or start is None or not math.isfinite(seconds):
        return None
    ratio = measured / expected
    if 1 / REPLAN_RATIO <= ratio <= REPLAN_RATIO:
        return None
    early = seconds >= 0.5 * plan.extra.get("seconds", 0.0)
    if not early and ratio < 1:  # a larger model started late gets too few updates to pass it
        return None
    # The same machine at the pace the real steps showed. Speeds that learned that pace already
    # estimate the planned size at it (MachineSpeeds.learned): scaling their estimates by the
    # plan's miss again chose a model 10x too slow (65 ms measured where 1,364 were planned: a 46 M
    # parameter model estimated at 91 ms a step ran 935).
    now = speeds.step_seconds(plan.config, data.model_for(plan.config), data.kind, plan.config.max_tokens,
                              data.keys(plan.config.max_length), plan.precision)
    new = make_plan(start, data, _AtPace(speeds, measured / now if now else ratio, plan), seconds,
                    half=plan.half, rungs=plan.extra.get("rungs", ()))
    if new.config.max_length == plan.config.max_length and \
            all(getattr(new.config.model, k) == getattr(plan.config.model, k) for k in SIZES):
        return None
    if not early and not _pays(new, measured, seconds, done):
        return None
    kept = tuple((w, y) for w, y in new.reasons if w != "precision") + (("precision", plan.why("precision")),)
    return dataclasses.replace(new, reasons=kept, extra={**plan.extra, **new.extra})


def _pays(new: Plan, measured: float, seconds: float, done: int) -> bool:
    """Does starting over under `new` (its steps estimated at the real pace) end the run with at
    least RESTART_GAIN times the updates that going on gives (`done` so far, then `seconds` at
    `measured` each)? Past half of the training time a re-plan starts over only so: beside two
    busy processes a fresh machine's first updates (its kernels measured, fp32 timed) took half
    a 1-minute budget, and the run went on at 512 tokens, 1.3 s a step, 10x its plan, for 21
    updates."""
    if not new.step_seconds:
        return False
    return seconds / new.step_seconds >= RESTART_GAIN * (done + seconds / max(measured, 1e-9))


class _AtPace:
    """A machine's speeds at the pace a run's first steps showed (every estimate x `scale`), in
    the precision the run kept (tformer.training.plan.Speeds)."""

    def __init__(self, speeds: Speeds, scale: float, plan: Plan) -> None:
        self.speeds, self.scale, self.plan = speeds, scale, plan

    def step_seconds(self, config, model, kind, tokens, length, precision) -> float | None:
        base = self.speeds.step_seconds(config, model, kind, tokens, length, self.plan.precision)
        return None if base is None else base * self.scale

    def precision(self, config, model, kind) -> tuple[str, str, bool]:
        return self.plan.precision, self.plan.why("precision") or "", False


REPLAN_RATIO = 1.5  # real steps this much slower (or faster) than planned: the size is chosen again
RESTART_GAIN = 2.0  # late in the training time, a re-plan starts over only for this many times the updates
