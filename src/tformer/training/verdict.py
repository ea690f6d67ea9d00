"""Whether a run learned: its test score against its trivial baseline (report.py says it after a
run, a model card says it with the weights). No torch: the card's module imports this."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# The best score of each main metric: a baseline that reaches it (copying the source, for the
# copy task) can be matched, not beaten.
PERFECT = {"accuracy": 1.0, "exact_match": 1.0, "mrr_at_10": 1.0, "bleu": 100.0, "f1": 1.0}

# Fewer test examples than this tell nothing either way: no verdict of learning is drawn
# (a 40-pair file tested on 1 pair "beat" copying the source with BLEU 2.02 against 0.00).
MIN_VERDICT_EXAMPLES = 10


def too_few(record: dict[str, Any]) -> bool:
    """Whether a test record scored too few examples for a verdict on its baseline."""
    return record.get("examples", MIN_VERDICT_EXAMPLES) < MIN_VERDICT_EXAMPLES


PRETRAINED = "the pretrained model"
PROBED = "the pretrained encoder and a head fitted to its features"  # (tformer.training.probe)


def started_from(record: dict[str, Any]) -> str:
    """What a fine-tune validated at step 0 started from: PRETRAINED (as it was) or PROBED."""
    return PROBED if record.get("head_probed") else PRETRAINED


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


def judge(value: float, baseline: float, key: str, examples: int, spread: float | None = None,
          interval: tuple[float, float] | None = None) -> tuple[str, tuple[float, float]]:
    """(LEARNED, NOT_LEARNED or CANNOT_TELL, the gain's interval): learned only when the whole
    interval is above 0; did not learn only when it rules out a gain of MIN_GAIN; else cannot tell.
    A perfect baseline matched by a perfect score counts as learned (it cannot be beaten).
    The interval is the bound's (gain_interval), or ``interval`` where the scorer drew one by a
    paired bootstrap (a metric that is no mean of per-example scores: f1_interval,
    spearman_interval). A metric of LOWER_IS_BETTER is judged by ``spread`` (log_gain_se's)."""
    if key in LOWER_IS_BETTER:
        return _judge_lower(value, baseline, examples, spread)
    low, high = gain_interval(value, baseline, key, examples) if interval is None else interval
    if examples < MIN_VERDICT_EXAMPLES:  # (a perfect score on 1 example matched its baseline's too)
        return CANNOT_TELL, (low, high)
    if baseline >= PERFECT.get(key, float("inf")) and value >= baseline:
        return LEARNED, (0.0, 0.0)
    if low > 0:
        return LEARNED, (low, high)
    if high < MIN_GAIN * SCALE.get(key, 1.0):
        return NOT_LEARNED, (low, high)
    return CANNOT_TELL, (low, high)


# Metrics that are no mean of per-example scores: an F1 over counts summed over the examples (a
# tagger's entity F1, a multi-label model's micro-F1) and a rank correlation. An example with 5
# entities weighs 5 times one with 1 in the F1, so the bound above, made for a mean of scores in
# [0, 1], can be narrower than the truth. Their interval is drawn instead by a paired bootstrap:
# the test's examples drawn again with replacement (each example's model and baseline together,
# so that what the two share cancels), the gain recomputed on each draw, and its 2.5th and 97.5th
# percentiles taken. Efron & Tibshirani, "An Introduction to the Bootstrap" (1993), ch. 13; the
# F1's draws are Poisson(1) weights per example (Hanley & MacGibbon 2006), the same for large n.
DRAWS = 1000
MIN_DRAWS = 200  # a large test's: fewer draws, its interval narrow anyway (at most WORK x draws)
WORK = 50_000_000  # example draws in all (a million-line `tformer eval` draws 200 x 10^6, seconds)
CHUNK = 10_000_000  # example draws held at once (x 8 bytes, a few arrays of them)


def _draws(n: int, draws: int | None) -> tuple[int, int]:
    """(draws, draws computed at once) for a test of n examples."""
    if draws is None:
        draws = int(min(DRAWS, max(MIN_DRAWS, WORK // max(n, 1))))
    return draws, max(1, min(100, CHUNK // max(n, 1)))


def _percentiles(gains: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(gains, [100 * (1 - 0.95) / 2, 100 * (1 + 0.95) / 2])
    return float(low), float(high)


def f1_interval(model: np.ndarray, baseline: np.ndarray, draws: int | None = None,
                seed: int = 0) -> tuple[float, float]:
    """The 95% interval of F1(model) - F1(baseline), F1 = 2 correct / (true + predicted) of the
    counts summed over the examples, by a paired bootstrap.

    Shape:
        model, baseline: (N, 3): per example, its true items (spans, labels), the items predicted,
        and those predicted right.
    """
    counts = np.concatenate([np.asarray(model, np.float64), np.asarray(baseline, np.float64)], 1)  # (N, 6)
    draws, chunk = _draws(len(counts), draws)
    rng = np.random.default_rng(seed)
    gains = []
    for first in range(0, draws, chunk):
        weights = rng.poisson(1.0, (min(chunk, draws - first), len(counts)))  # (D, N)
        t, p, c, bt, bp, bc = (weights @ counts).T  # (D,) each
        gains.append(2 * c / np.maximum(t + p, 1) - 2 * bc / np.maximum(bt + bp, 1))
    return _percentiles(np.concatenate(gains))


def _correlations(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row by row, the correlation coefficient of x and y (0 where either row is constant).

    Shape:
        x, y: (D, N) -> (D,)
    """
    dx, dy = x - x.mean(1, keepdims=True), y - y.mean(1, keepdims=True)
    norm = np.sqrt((dx * dx).sum(1) * (dy * dy).sum(1))
    return np.where(norm > 0, (dx * dy).sum(1) / np.where(norm > 0, norm, 1.0), 0.0)


def spearman_interval(ranked: np.ndarray, truth: np.ndarray, baselines: list[np.ndarray],
                      draws: int | None = None, seed: int = 0) -> tuple[float, float]:
    """The 95% interval of the Spearman correlation of the model's scores with the truth minus
    the best baseline's (each baseline's scores; a constant one correlates 0), by a paired
    bootstrap of the examples. Each draw correlates the examples' ranks in the whole test
    (the bootstrap of a rank statistic on fixed ranks: no re-ranking of each draw's ties).

    Shape:
        ranked, truth: (N,) the ranks of the model's scores and of the true ones
        baselines: each (N,), the ranks of a baseline's scores
    """
    n = len(truth)
    draws, chunk = _draws(n, draws)
    rng = np.random.default_rng(seed)
    gains = []
    for first in range(0, draws, chunk):
        idx = rng.integers(0, n, (min(chunk, draws - first), n))  # (D, N)
        t = truth[idx]
        best = np.zeros(len(idx))
        for b in baselines:
            best = np.maximum(best, _correlations(b[idx], t))
        gains.append(_correlations(ranked[idx], t) - best)
    return _percentiles(np.concatenate(gains))


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
