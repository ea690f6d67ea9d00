"""The model's size from the budget and this machine's speed, when the user gives no sizes.

With --max-minutes and no size option (--d-model, --n-heads, --d-ff, --n-layers,
--n-decoder-layers), a run from scratch takes the largest model of a ladder that still gets
MIN_STEPS updates (times its kind's Objective.steps_factor) in its training time, less
what building and saving the model take (fixed_seconds), at this machine's measured speed: the smallest
rung's step is timed on real batches of the data, and the others' are estimated from their
FLOPs per token (matrix products are most of a step, and their time follows their FLOPs).

Why a step floor: on short budgets a model too big for the time sees too few updates to learn
anything, and one too small stops improving long before the deadline (measured on a held-out
English -> French set in 10 minutes on one thread: d_model 256 with 3+3 layers reached BLEU
25.4 in 783 steps where d_model 64 with 2+2 layers reached 12.2). The user's flags always win.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

MIN_STEPS = 600  # updates the chosen model must get in the training time
PROBE_STEPS = 3  # timed steps of a probed model (after one warm-up step)
LADDER: tuple[dict[str, int], ...] = (
    {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 2},
    {"d_model": 256, "n_heads": 4, "d_ff": 1024, "n_layers": 3},
    {"d_model": 384, "n_heads": 6, "d_ff": 1536, "n_layers": 4},
)
# Above the ladder, on a CUDA GPU only (``rungs_for``), each rung timed there (measures_rungs).
# d_model 512 with 6 layers was the CPU ladder's top rung until measured: a CPU budget that
# affords it gets too few updates for it to pass the 384 rung. From scratch at 10 minutes on 2
# cores it tested worse than the 384 rung's runs of 3-5 minutes on three sets (50 Debtags:
# micro-F1 0.420 against 0.618; pair scores, Spearman 0.315 against 0.544; package sizes, 0.401,
# at scratch_lr's rate, against 0.518), and at equal updates (1,200, its best rate) it never
# passed the 256 and 384 rungs (0.600 against 0.617 and 0.612; 0.781 against 0.796 and 0.788).
# Then BERT-base's and BERT-large's shapes (Devlin et al. 2019): on an H200 a 12-layer
# BERT-base step of 32 x 128 tokens took 22-28 ms in bf16 (docs/gpu.md), some 2,000 updates a
# minute, where a 2-layer d_model 128 step took 12 (bound by kernel launches).
GPU_RUNGS: tuple[dict[str, int], ...] = (
    {"d_model": 512, "n_heads": 8, "d_ff": 2048, "n_layers": 6},
    {"d_model": 768, "n_heads": 12, "d_ff": 3072, "n_layers": 12},
    {"d_model": 1024, "n_heads": 16, "d_ff": 4096, "n_layers": 24},
)


SAVE_BYTES_PER_SECOND = 100e6  # writing a checkpoint, at least (a busy disk; weights + 2 moments)
BUILD_SECONDS_PER_PARAMETER = 5e-8  # initialising a model (~1 s for 20 M parameters on one core)


def fixed_seconds(parameters: int) -> tuple[float, float]:
    """(building, saving): the seconds a model of `parameters` costs besides its updates, at the
    least: initialising it, and writing its first checkpoint and its last (weights and the
    optimizer's two moments in fp32, at SAVE_BYTES_PER_SECOND)."""
    return BUILD_SECONDS_PER_PARAMETER * parameters, 2 * (3 * 4 * parameters) / SAVE_BYTES_PER_SECOND


def rungs_for(device) -> tuple[dict[str, int], ...]:
    """The rungs above LADDER that `device` may take: GPU_RUNGS on a CUDA GPU, else none."""
    return GPU_RUNGS if device.type == "cuda" else ()


def wants_auto_size(config, resume: bool, world: int) -> bool:
    """Sizes are chosen for a new, timed, single-process run from scratch on data whose user
    gave none (resolve_config turns auto_size off when any size option is given)."""
    return (config.auto_size and config.max_minutes is not None and config.from_pretrained is None
            and config.data is not None and not resume and world == 1)


def measures_rungs(device) -> bool:
    """Whether every rung's step is timed on `device` rather than estimated from its FLOPs:
    off the CPU (``choose_size``)."""
    return device.type != "cpu"


def choose_size(config, seconds: float, seconds_per_step, not_measured: str = "",
                extra_rungs: tuple[dict[str, int], ...] = (), fixed=lambda config: 0.0,
                factor: float = 1.0) -> tuple[Any, str]:
    """(the config with the chosen sizes, why): the largest rung of LADDER, then of `extra_rungs`
    (``rungs_for``: a GPU's), whose step time (``seconds_per_step(config)``: seconds per update
    of that config's model, as the plan's speeds give it: estimated from FLOPs at this machine's
    rate, or timed on a GPU; None: not known, and the smallest rung stands, `not_measured`
    saying why) still buys `factor` x MIN_STEPS updates (a kind asks more with its
    Objective.steps_factor) in `seconds`, the training time left, less what
    its model costs besides its updates (``fixed(config)``: building and saving it; on an H200
    BERT-base's step afforded a 1-minute run 900 updates, but writing its checkpoints ~50 s)."""
    least = round(MIN_STEPS * factor)
    chosen = LADDER[0]
    per_step = seconds_per_step(config.replace(**chosen))
    size = f"d_model {chosen['d_model']}, {chosen['n_layers']} layers"
    if per_step is None:
        return config.replace(**chosen), f"{size}: the smallest; the step time is {not_measured}"
    steps, chosen_step = max(seconds - fixed(config.replace(**chosen)), 0.0) / per_step, per_step
    for rung in (*LADDER[1:], *extra_rungs) if steps >= least else ():  # short already: none larger
        rung_step = seconds_per_step(config.replace(**rung))
        rung_steps = None if rung_step is None else (seconds - fixed(config.replace(**rung))) / rung_step
        if rung_steps is None or rung_steps < least:
            break
        chosen, steps, chosen_step = rung, rung_steps, rung_step
    size = f"d_model {chosen['d_model']}, {chosen['n_layers']} layers"
    pace = f"{chosen_step * 1000:,.0f} ms a step"
    if steps < least:  # even the smallest rung falls short: say so, not "the largest that..."
        why = (f"{size}: the smallest, and even it gets only about {steps:,.0f} of the "
               f"{least:,} updates wanted in {seconds / 60:.1f} min here (about {pace}; a longer "
               "--max-minutes learns more)")
    else:
        why = (f"{size}: the largest that gets >= {least:,} updates in {seconds / 60:.1f} min "
               f"here (about {steps:,.0f}, {pace})")
    return config.replace(**chosen), why


# --max-length from the data and the budget (a timed run from scratch given none). Measured on
# man pages' DESCRIPTIONs (5,284 texts, 6 sections, median 128 words; 4,228 training texts),
# classification from scratch, 2 cores: at 3 minutes, 64 tokens 0.852 test accuracy (13 passes
# over the data), 128 0.848 (7), 256 0.892 (2.7), 512 0.784 (1.3); at 1.5 minutes, 64 0.812 (7)
# and 256 0.808 (1.4, macro-F1 0.62 against 0.80). Longer texts pay once the budget would
# otherwise go round the same short heads again and again, and cost when it cannot pass over the
# data twice: the longest length that still gets MIN_PASSES passes (and MIN_LENGTH_STEPS updates).
MIN_PASSES = 2.0
MIN_LENGTH_STEPS = 300
AUTO_LENGTH_LIMIT = 512  # the longest length tried (a learned position table of that many rows)
LENGTH_CUT = 0.05  # a longer length is tried only while the last one cuts this share of texts
# A fine-tune starts from a model that already reads: it needs fewer passes than one from
# scratch, and what it cuts of each text it cannot learn from at all. But not fewer updates: on
# man-page DESCRIPTIONs (all-MiniLM-L6-v2, 3 minutes, 1 thread) 128 tokens tested 0.863 after 218
# updates and 0.560 after 59 (its plan expected ~150), 256 tokens 0.782 after 89, 64 tokens
# 0.791-0.855 after 134-219.
FINETUNE_PASSES = 1.0
FINETUNE_LENGTH_STEPS = 300


def wants_auto_length(config, resume: bool, world: int) -> bool:
    """--max-length is chosen for a new, timed, single-process run on data whose user gave none
    (resolve_config turns auto_length off when --max-length is given), fine-tunes included."""
    return (config.auto_length and config.max_minutes is not None and config.data is not None
            and not resume and world == 1)


def cut_share(longest: list[int], max_length: int) -> float:
    """The share of examples (their longest text's tokens, specials included) max_length cuts."""
    return sum(n >= max_length for n in longest) / max(len(longest), 1)


def choose_length(config, cut_share_at, seconds: float, seconds_per_step, train_examples: int,
                  with_batch=lambda config: config, limit: int = AUTO_LENGTH_LIMIT,
                  pretrained: bool = False) -> tuple[Any, str]:
    """(the config with max_length chosen, why), from the preset's length up by doubling: the
    longest that still gets MIN_PASSES passes over `train_examples` and MIN_LENGTH_STEPS updates
    in `seconds` at ``seconds_per_step(config)`` (None: not known, and the doubling stops).
    `cut_share_at(length)`: the share of training examples that length cuts; `with_batch(config)`:
    the config with its batch's tokens for that length (--max-tokens given: as it is). A
    fine-tune (`pretrained`) needs fewer: FINETUNE_PASSES and FINETUNE_LENGTH_STEPS; `limit`:
    the longest length (a pretrained model's position table)."""
    chosen, tried = config, []
    length = config.max_length
    min_passes, min_steps = (FINETUNE_PASSES, FINETUNE_LENGTH_STEPS) if pretrained else (MIN_PASSES,
                                                                                        MIN_LENGTH_STEPS)
    while cut_share_at(length) >= LENGTH_CUT and 2 * length <= limit:
        length *= 2
        candidate = with_batch(config.replace(max_length=length))
        per_step = seconds_per_step(candidate)
        if per_step is None:
            tried.append(f"{length}: its step time unknown")
            break
        steps = seconds / per_step
        passes = steps * config.batch_size / max(train_examples, 1)
        tried.append(f"{length}: about {passes:.1f} passes")
        if passes < min_passes or steps < min_steps:
            break
        chosen = candidate
    whole = 1 - cut_share_at(chosen.max_length)
    why = f"{chosen.max_length} tokens, whole for {whole:.0%} of the training examples"
    if not tried:
        return chosen, f"{why} (the preset; a longer one would add little)"
    return chosen, (f"{why}: the longest that gets >= {min_passes:g} passes over the data in "
                    f"{seconds / 60:.1f} min here (from {config.max_length}, doubling; "
                    f"{'; '.join(tried)})")


class StepTimes(NamedTuple):
    step: float  # seconds per update, steady (the fastest timed)
    first: float  # the first update's seconds beyond a steady one: kernel creation, allocation


def time_steps(objective, step, batches: Iterator | None = None,
               deadline: float | None = None) -> StepTimes:
    """Seconds per update of `objective`'s model (`step(model, batch, objective)` runs one) on
    `batches`, by default its own: the fastest of PROBE_STEPS after one warm-up step (kernel
    creation, allocation; other work on the machine only ever adds time), and what the warm-up
    cost beyond that. Past the `deadline` (a time.perf_counter() reading) no more steps start,
    but one step after the warm-up always runs: the warm-up's time is never the answer (on an
    H200 a run's first step took 5.4 s, loading the GPU's kernels and libraries, and its steps
    then averaged 12 ms; timed as a step, it made a budgeted run pick the smallest model)."""
    model = objective.build_model()
    batches = objective.train_batches(0) if batches is None else batches
    times = []  # [warm-up, steps...]
    for _ in range(1 + PROBE_STEPS):
        if len(times) > 1 and deadline is not None and time.perf_counter() + min(times[1:]) > deadline:
            break
        t = time.perf_counter()
        step(model, next(batches), objective)
        times.append(time.perf_counter() - t)
    steady = min(times[1:])
    return StepTimes(steady, max(0.0, times[0] - steady))


def batch_tokens(config, costs: list[int]) -> tuple[Any, str]:
    """(the config with --max-tokens set from --batch-size, why): batch_size examples of the
    mean length of `costs` (padded tokens per example, from a sample of the training data), so
    that length-bucketed batches hold batch_size examples on average."""
    mean = sum(costs) / max(len(costs), 1)
    tokens = max(1, math.ceil(config.batch_size * mean))
    why = (f"{tokens} tokens: {config.batch_size} examples of the mean length here "
           f"({mean:.1f} tokens; --max-tokens sets it)")
    return config.replace(max_tokens=tokens), why


def truncated(longest: list[int], max_length: int) -> str | None:
    """A line naming the share of a sample of the training examples (their longest text's
    tokens, specials included) that max_length cuts, or None when it cuts under 1%."""
    cut = sum(n >= max_length for n in longest) / max(len(longest), 1)
    if cut < 0.01:
        return None
    return (f"max length: {max_length} tokens cut {cut:.0%} of the training examples (in a sample "
            f"of {len(longest):,}; --max-length sets it)")


# At d_model 128; ~ 1 / sqrt(width) above it: 1.2e-4 at MiniLM's 384, 8.2e-5 at BERT-base's 768.
# Doubled from 1e-4 by 3-minute fine-tunes of all-MiniLM-L6-v2 (tformer's defaults otherwise, two
# runs side by side, 1 thread each): 12 Debian sections 0.750 / 0.773 / 0.786 test accuracy at
# 5.8e-5 / 1.2e-4 / 2e-4, 6 man-page sections 0.714 / 0.748 / 0.735 (234 test examples).
FINETUNE_LR = 2e-4


# The kinds' learning rates from scratch (5e-4; seq2seq's 1e-3; the score kinds' 2.5e-4) were
# chosen on models up to 384 wide. A wider one takes smaller steps: measured on 29,940 package
# summaries -> 50 Debtags (multi-label, 1,200 updates of 400 tokens, linear decay; test micro-F1),
# d_model 256 / 3 layers at 5e-4 0.617 and 384 / 4 at 5e-4 0.612, but 512 / 6 at 5e-4 0.351 (its
# loss never settled), at 3.75e-4 0.542 and at 2.5e-4 0.600. At 5e-4 the ladder's 512 rung made
# 10-minute runs worse than shorter ones (micro-F1 0.420 against 5 minutes' 0.618; pair scores,
# Spearman 0.315 against 3 minutes' 0.544). (The CPU ladder now tops at 384; GPUs' rungs go wider.)
SCRATCH_LR_WIDTH = 384
SCRATCH_LR_POWER = 2


def scratch_lr(config) -> tuple[Any, str | None]:
    """(the config with the learning rate for its width from scratch, why; None where it stands):
    the kind's rate, x (SCRATCH_LR_WIDTH / d_model) ** SCRATCH_LR_POWER above SCRATCH_LR_WIDTH."""
    width = config.model.d_model
    if not config.auto_lr or config.lr is None or width <= SCRATCH_LR_WIDTH:
        return config, None
    lr = config.lr * (SCRATCH_LR_WIDTH / width) ** SCRATCH_LR_POWER
    # (auto_lr off: the rate is chosen; a saved config's command line gives it as --lr)
    why = (f"{lr:.2g} for a {width}-wide model from scratch (the kind's {config.lr:.2g} x "
           f"({SCRATCH_LR_WIDTH}/{width})^{SCRATCH_LR_POWER}; --lr sets it)")
    return config.replace(lr=lr, auto_lr=False), why


def finetune_lr(config, d_model: int) -> tuple[Any, str]:
    """(the config with the fine-tuning learning rate for a model of width d_model, why).

    The BERT recipe's 2e-5..5e-5 is for d_model 768; narrower models take larger steps
    (measured: a d_model-128 encoder fine-tuned for 5 minutes reached test accuracy 0.785 at
    1e-4 and 0.728 at 3e-5; benchmarks/train_own_data.py), and a budget of minutes takes larger
    ones still (FINETUNE_LR). Scaling as 1/sqrt(width): 2e-4 at 128, 1.2e-4 at 384 (MiniLM),
    8.2e-5 at 768 (BERT-base)."""
    lr = FINETUNE_LR * math.sqrt(128 / max(d_model, 128))
    return config.replace(lr=lr), f"{lr:.2g} for a {d_model}-wide model (--lr sets it)"


# A fine-tune's new head fitted to the pretrained features first (tformer.training.probe).
PROBE_SHARE = 0.05  # of the training time, at most, for the probe's forward passes
PROBE_MAX = 512  # examples (measured on man pages, the probe alone: 256 / 512 tested 0.77 / 0.80)
PROBE_MIN = 64  # fewer fit no head worth its time (a smaller training file: all of it)


def probe_plan(training: float, example_seconds: float | None, train_examples: int) -> tuple[int, str]:
    """(examples whose features fit the head, why): up to PROBE_MAX, as many as PROBE_SHARE of
    the `training` seconds pays for at `example_seconds` a forward (math.inf or None: untimed);
    0 (the head starts random) where that is fewer than PROBE_MIN and than the training file."""
    want = min(train_examples, PROBE_MAX)
    paid = want
    if math.isfinite(training) and example_seconds:
        paid = int(PROBE_SHARE * training / example_seconds)
    n = min(want, paid)
    if n < min(PROBE_MIN, train_examples) or n < 1:
        return 0, (f"random (fitting it to {min(PROBE_MIN, want):,} examples' features would take more "
                   f"than {PROBE_SHARE:.0%} of the training time)")
    cost = "" if not example_seconds else f", their forward passes ~{n * example_seconds:,.1f} s"
    return n, (f"fitted to the pretrained features of {n:,} training examples before the first "
               f"update (a linear probe{cost}; --head-init random starts it random)")
