"""Whether a run learned: its test score against its trivial baseline (report.py says it after a
run, a model card says it with the weights). No torch: the card's module imports this."""

from __future__ import annotations

import math
from typing import Any

# The best score of each main metric: a baseline that reaches it (copying the source, for the
# copy task) can be matched, not beaten.
PERFECT = {"accuracy": 1.0, "exact_match": 1.0, "mrr_at_10": 1.0, "bleu": 100.0, "f1": 1.0}

# Fewer test examples than this tell nothing either way: no verdict of learning is drawn
# (a 40-pair file tested on 1 pair "beat" copying the source with BLEU 2.02 against 0.00).
MIN_VERDICT_EXAMPLES = 10


def too_few(record: dict[str, Any]) -> bool:
    """Whether a test record scored too few examples for a verdict on its baseline."""
    return record.get("examples", MIN_VERDICT_EXAMPLES) < MIN_VERDICT_EXAMPLES


def tested_as_it_was(record: dict[str, Any]) -> bool:
    """Whether a test record's weights are its pretrained model's as they were: a fine-tune
    validated at step 0 (its pretrained_validation) none of whose steps beat that on validation."""
    return "pretrained_validation" in record and record.get("tested_step") == 0


# The main metrics that are better lower (a masked LM's perplexity); every other is better higher.
LOWER_IS_BETTER = frozenset({"perplexity"})


def beats_baseline(value: float, baseline: float, key: str) -> bool:
    """Whether a test score beats its trivial baseline (higher is better, or lower for a metric
    of LOWER_IS_BETTER; a perfect baseline is matched by a perfect score)."""
    if key in LOWER_IS_BETTER:
        return value < baseline
    return value > baseline or value >= PERFECT.get(key, float("inf"))


# The verdict's margin. A score and its baseline measured on the same n examples differ by chance:
# on random labels, 1 seed in 8 "beat" the majority class (0.7059 against 0.6471 on 17 examples).
# Per example, a score in [0, 1] (accuracy, exact match, MRR@10; BLEU / 100, whose corpus score
# moves like a mean of its sentences') and the baseline's differ by D in [-1, 1], whose mean d is
# the gain; whatever the pairing, E[D^2] <= E|D| <= min(m + b, 2 - m - b) for means m and b, so
# the gain's standard error is at most sqrt((min(m + b, 2 - m - b) - d^2) / n). That bound needs
# only the two scores and n (no per-example scores), and is never smaller than the truth: a
# verdict drawn from it errs toward "cannot tell".
Z = 1.96  # a 95% interval
MIN_GAIN = 0.02  # "did not learn": the interval rules out a gain of more than 2 points
SCALE = {"bleu": 100.0, "chrf": 100.0}
LEARNED, NOT_LEARNED, CANNOT_TELL = "learned", "did not learn", "cannot tell"


def gain_interval(value: float, baseline: float, key: str, examples: int) -> tuple[float, float]:
    """The 95% interval of the gain over the baseline (in the metric's units), from the bound."""
    scale = SCALE.get(key, 1.0)
    m, b = min(max(value / scale, 0.0), 1.0), min(max(baseline / scale, 0.0), 1.0)
    d = m - b
    var = max(min(m + b, 2 - m - b) - d * d, 0.0)
    half = Z * (var / max(examples, 1)) ** 0.5
    return (d - half) * scale, (d + half) * scale


def judge(value: float, baseline: float, key: str, examples: int,
          spread: float | None = None) -> tuple[str, tuple[float, float]]:
    """(LEARNED, NOT_LEARNED or CANNOT_TELL, the gain's interval): learned only when the whole
    interval is above 0; did not learn only when it rules out a gain of MIN_GAIN; else cannot tell.
    A perfect baseline matched by a perfect score counts as learned (it cannot be beaten).
    A metric of LOWER_IS_BETTER is judged by ``spread`` (log_gain_se's) instead."""
    if key in LOWER_IS_BETTER:
        return _judge_lower(value, baseline, examples, spread)
    if baseline >= PERFECT.get(key, float("inf")) and value >= baseline:
        return LEARNED, (0.0, 0.0)
    low, high = gain_interval(value, baseline, key, examples)
    if examples < MIN_VERDICT_EXAMPLES:
        return CANNOT_TELL, (low, high)
    if low > 0:
        return LEARNED, (low, high)
    if high < MIN_GAIN * SCALE.get(key, 1.0):
        return NOT_LEARNED, (low, high)
    return CANNOT_TELL, (low, high)


def verdict_of(record: dict[str, Any]) -> str | None:
    """A test record's verdict: its own, else (records written before verdicts had a margin)
    from its beats_baseline; None where it has no baseline."""
    if record.get("verdict") in (LEARNED, NOT_LEARNED, CANNOT_TELL):
        return record["verdict"]
    if too_few(record):
        return CANNOT_TELL
    beats = record.get("beats_baseline")
    return None if beats is None else LEARNED if beats else NOT_LEARNED


# A perplexity is exp of a mean per-token loss (its log, the loss, is unbounded: the bound above
# does not hold). Per predicted token, the model's loss a and the baseline's b differ by D = b - a,
# whose mean d = log(baseline / value) is the log gain; whatever the pairing, sd(D) <= sd(a) + sd(b)
# (Cauchy-Schwarz), so its standard error is at most (sd(a) + sd(b)) / sqrt(tokens): the spreads a
# record carries ("loss_sd", "baseline_loss_sd", "masked_tokens"). The tokens of one text are taken
# as independent (15% of them, drawn at random, are predicted).
def log_gain_se(record: dict[str, Any]) -> float | None:
    """The bound on a LOWER_IS_BETTER metric's log gain's standard error; None where the record
    lacks the spreads (a record written before they were kept)."""
    sd, base_sd, n = (record.get(k) for k in ("loss_sd", "baseline_loss_sd", "masked_tokens"))
    if sd is None or base_sd is None or not n:
        return None
    return (sd + base_sd) / math.sqrt(n)


def _judge_lower(value: float, baseline: float, examples: int,
                 spread: float | None) -> tuple[str, tuple[float, float]]:
    """judge for a metric better lower: the interval is of value - baseline (below 0: better),
    from the log gain's d +- Z * spread; did not learn when it rules out a reduction of MIN_GAIN of
    the baseline; without a spread, cannot tell (an interval of -inf to inf)."""
    if spread is None:
        return CANNOT_TELL, (-math.inf, math.inf)
    d, half = math.log(baseline) - math.log(value), Z * spread
    low, high = baseline * math.expm1(-(d + half)), baseline * math.expm1(-(d - half))
    if examples < MIN_VERDICT_EXAMPLES:
        return CANNOT_TELL, (low, high)
    if high < 0:
        return LEARNED, (low, high)
    if low > -MIN_GAIN * baseline:
        return NOT_LEARNED, (low, high)
    return CANNOT_TELL, (low, high)
