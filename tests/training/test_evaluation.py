"""Metrics as counts that add (tformer.training.evaluation): the counts of windows of outputs,
summed, score exactly as the whole list does, so an evaluation may stream its outputs."""

import random

import numpy as np
import sacrebleu
from text_fixtures import WORDS

from tformer.tasks.base import sequence_counts, sequence_metrics, sequence_scores
from tformer.text.specials import EOS
from tformer.training.evaluation import (
    classification_metrics,
    confusion,
    confusion_metrics,
    text_counts,
    text_metrics,
    text_scores,
)


def windows(n: int, rng: random.Random) -> list[slice]:
    """Uneven windows covering range(n), one of them empty."""
    cuts = sorted({0, n, *(rng.randrange(n) for _ in range(6))})
    return [slice(0, 0)] + [slice(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]


def test_text_counts_of_windows_add_up_to_sacrebleus_corpus_scores():
    rng = random.Random(0)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))) for _ in range(300)]
    hyps = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 9))) for _ in range(300)]
    hyps[:20] = refs[:20]  # some exact matches, and n-grams of every order
    counts = sum(text_counts(hyps[w], refs[w]) for w in windows(len(refs), rng))
    scores = text_scores(counts)
    assert scores == text_metrics(hyps, refs)  # exactly: one implementation
    assert scores["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score > 0
    assert scores["chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score > 0
    assert scores["exact_match"] == sum(h == r for h, r in zip(hyps, refs, strict=True)) / len(refs)
    assert text_scores(text_counts([], [])) == {"bleu": 0.0, "chrf": 0.0, "exact_match": 0.0}


def test_confusion_matrices_of_windows_add_up_to_the_metrics_of_all():
    rng = random.Random(1)
    predicted = [rng.randrange(4) for _ in range(200)]
    actual = [rng.choice([0, 0, 1, 3]) for _ in range(200)]  # label 2 never true
    summed = sum(np.array(confusion(predicted[w], actual[w], 4)) for w in windows(200, rng))
    assert confusion_metrics(summed) == classification_metrics(predicted, actual, 4)


def test_sequence_counts_of_windows_add_up_to_the_metrics_of_all():
    rng = random.Random(2)
    targets = [[rng.randrange(5, 9) for _ in range(rng.randint(1, 5))] for _ in range(100)]
    preds = [t + [EOS] if rng.random() < 0.3 else [rng.randrange(5, 9) for _ in range(3)] for t in targets]
    summed = sum(sequence_counts(preds[w], targets[w]) for w in windows(100, rng))
    assert sequence_scores(summed) == sequence_metrics(preds, targets)
    assert 0 < sequence_scores(summed)["exact_match"] < 1
