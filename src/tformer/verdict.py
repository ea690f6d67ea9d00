"""Whether a run learned: its test score against its trivial baseline (report.py says it after a
run, a model card says it with the weights). No torch: the card's module imports this."""

from __future__ import annotations

from typing import Any

# The best score of each main metric: a baseline that reaches it (copying the source, for the
# copy task) can be matched, not beaten.
PERFECT = {"accuracy": 1.0, "exact_match": 1.0, "mrr_at_10": 1.0, "bleu": 100.0}

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
