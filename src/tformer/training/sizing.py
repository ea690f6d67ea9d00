"""The model's size from the budget and this machine's speed, when the user gives no sizes.

With --max-minutes and no size option (--d-model, --n-heads, --d-ff, --n-layers,
--n-decoder-layers), a run from scratch takes the largest model of a ladder that still gets
MIN_STEPS updates in its training time, at this machine's measured speed: the smallest
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

from tformer.stats import flops_per_token

MIN_STEPS = 600  # updates the chosen model must get in the training time
PROBE_STEPS = 3  # timed steps of a probed model (after one warm-up step)
LADDER: tuple[dict[str, int], ...] = (
    {"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 2},
    {"d_model": 256, "n_heads": 4, "d_ff": 1024, "n_layers": 3},
    {"d_model": 384, "n_heads": 6, "d_ff": 1536, "n_layers": 4},
    {"d_model": 512, "n_heads": 8, "d_ff": 2048, "n_layers": 6},
)
# Above the ladder, on a CUDA GPU only (``rungs_for``): BERT-base's and BERT-large's shapes (Devlin
# et al. 2019). A GPU affords them: on an H200 a 12-layer BERT-base step of 32 x 128 tokens took
# 22-28 ms in bf16 (docs/gpu.md), some 2,000 updates a minute, where a 2-layer d_model 128 step
# took 12 (bound by kernel launches). Each rung is timed there (measures_rungs), not estimated.
GPU_RUNGS: tuple[dict[str, int], ...] = (
    {"d_model": 768, "n_heads": 12, "d_ff": 3072, "n_layers": 12},
    {"d_model": 1024, "n_heads": 16, "d_ff": 4096, "n_layers": 24},
)


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


def choose_size(config, objective_for, seconds: float, seconds_per_step,
                not_measured: str = "", measure_rungs: bool = False,
                extra_rungs: tuple[dict[str, int], ...] = ()) -> tuple[Any, str]:
    """(the config with the chosen sizes, why). `objective_for(config)` gives an objective,
    `seconds_per_step(objective)` times a few updates of its model (None: not measured, and the
    smallest rung stands; `not_measured` says why); `seconds`: the training time left.

    The larger rungs' steps are estimated from their FLOPs, or with `measure_rungs` timed too
    (where `seconds_per_step` can pay for it, else estimated): on a GPU a small model's step is
    bound by its kernel launches, not its FLOPs (on an H200 the steps of a 2-layer d_model 128
    seq2seq model averaged 12 ms, where its ~8 GFLOP need well under 1 ms), so the FLOPs
    estimate would overstate a larger rung's step many times. `extra_rungs` go on above the
    ladder (``rungs_for``: a GPU's)."""
    probe = objective_for(config.replace(**LADDER[0]))
    per_step = seconds_per_step(probe)
    chosen = LADDER[0]
    size = f"d_model {chosen['d_model']}, {chosen['n_layers']} layers"
    if per_step is None:
        return config.replace(**chosen), f"{size}: the smallest; the step time is {not_measured}"
    kind = probe.model_kind
    base_flops = flops_per_token(probe.model_config(), 64, kind)
    steps = seconds / per_step
    measured = f"the smallest measured {per_step * 1000:.0f} ms a step"
    for rung in (*LADDER[1:], *extra_rungs) if steps >= MIN_STEPS else ():  # short already: no probe
        candidate = objective_for(config.replace(**rung))
        rung_step = seconds_per_step(candidate) if measure_rungs else None
        timed = rung_step is not None
        if not timed:
            rung_step = per_step * flops_per_token(candidate.model_config(), 64, kind) / base_flops
        if seconds / rung_step < MIN_STEPS:
            break
        chosen, steps = rung, seconds / rung_step
        if timed:
            measured = f"this rung measured {rung_step * 1000:.0f} ms a step"
    size = f"d_model {chosen['d_model']}, {chosen['n_layers']} layers"
    if steps < MIN_STEPS:  # even the smallest rung falls short: say so, not "the largest that..."
        why = (f"{size}: the smallest, and even it gets only about {steps:,.0f} of the "
               f"{MIN_STEPS} updates wanted in {seconds / 60:.1f} min here ({measured}; a longer "
               "--max-minutes learns more)")
    else:
        why = (f"{size}: the largest that gets >= {MIN_STEPS} updates in {seconds / 60:.1f} min "
               f"here (about {steps:,.0f}; {measured})")
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


def wants_auto_length(config, resume: bool, world: int) -> bool:
    """--max-length is chosen for a new, timed, single-process run from scratch on data whose
    user gave none (resolve_config turns auto_length off when --max-length is given)."""
    return (config.auto_length and config.max_minutes is not None and config.from_pretrained is None
            and config.data is not None and not resume and world == 1)


def cut_share(longest: list[int], max_length: int) -> float:
    """The share of examples (their longest text's tokens, specials included) max_length cuts."""
    return sum(n >= max_length for n in longest) / max(len(longest), 1)


def choose_length(config, objective_for, pool: list, seconds: float, seconds_per_step,
                  train_examples: int, not_measured: str = "") -> tuple[Any, str]:
    """(the config with max_length and max_tokens chosen, why), from the preset's length up by
    doubling: the longest that still gets MIN_PASSES passes over `train_examples` and
    MIN_LENGTH_STEPS updates in `seconds` at this machine's measured speed. `objective_for(config)`
    gives an objective; `pool` is a sample of training records; `seconds_per_step(objective)`
    times a few updates of its model on its own batches (time_steps), for each longer length
    (None: not measured, and the doubling stops there; `not_measured` says why)."""
    probe_sizes = LADDER[0] if config.auto_size else {}
    longest = [ex.longest for ex in objective_for(config.replace(max_length=AUTO_LENGTH_LIMIT)).encode(pool)]
    chosen, passes, tried = config, None, []
    length = config.max_length
    while cut_share(longest, length) >= LENGTH_CUT and 2 * length <= AUTO_LENGTH_LIMIT:
        length *= 2
        candidate = config.replace(max_length=length)
        if config.max_tokens is None:  # batches of batch_size examples of this length's mean
            costs = [ex.cost for ex in objective_for(candidate).encode(pool)]
            candidate, _ = batch_tokens(candidate, costs)
        per_step = seconds_per_step(objective_for(candidate.replace(**probe_sizes)))
        if per_step is None:
            tried.append(f"{length}: {not_measured}")
            break
        steps = seconds / per_step
        passes = steps * config.batch_size / max(train_examples, 1)
        tried.append(f"{length}: about {passes:.1f} passes")
        if passes < MIN_PASSES or steps < MIN_LENGTH_STEPS:
            break
        chosen = candidate
    why = (f"{chosen.max_length} tokens, whole for {1 - cut_share(longest, chosen.max_length):.0%} "
           "of the training examples")
    if not tried:
        return chosen, f"{why} (the preset; a longer one would add little)"
    return chosen, (f"{why}: the longest that gets >= {MIN_PASSES:g} passes over the data in "
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


FINETUNE_LR = 1e-4  # at d_model 128; ~ 1 / sqrt(width) above it: 4.1e-5 at BERT-base's 768


def finetune_lr(config, d_model: int) -> tuple[Any, str]:
    """(the config with the fine-tuning learning rate for a model of width d_model, why).

    The BERT recipe's 2e-5..5e-5 is for d_model 768; narrower models take larger steps
    (measured: a d_model-128 encoder fine-tuned for 5 minutes reached test accuracy 0.785 at
    1e-4 and 0.728 at 3e-5; benchmarks/train_own_data.py). Scaling as 1/sqrt(width) joins the
    two: 1e-4 at 128, 5.8e-5 at 384 (MiniLM), 4.1e-5 at 768 (BERT-base)."""
    lr = FINETUNE_LR * math.sqrt(128 / max(d_model, 128))
    return config.replace(lr=lr), f"{lr:.2g} for a {d_model}-wide model (--lr sets it)"
