"""Metrics: what a prediction is scored with, per objective.

seq2seq: BLEU and chrF with sacrebleu on detokenised text (Post 2018: scores comparable
across papers), plus exact match. classification: accuracy and macro-F1 (each label
counts the same, however rare), plus a confusion matrix. embedding: recall@1 and MRR@10
of each anchor retrieving its own positive among all the split's positives.
"""

from __future__ import annotations

import sacrebleu
import torch
from torch import Tensor


def text_metrics(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
        "exact_match": sum(h == r for h, r in zip(hypotheses, references, strict=True))
        / max(len(references), 1),
    }


def confusion(predicted: list[int], actual: list[int], n_classes: int) -> list[list[int]]:
    """matrix[true][predicted] counts."""
    m = [[0] * n_classes for _ in range(n_classes)]
    for p, a in zip(predicted, actual, strict=True):
        m[a][p] += 1
    return m


def classification_metrics(predicted: list[int], actual: list[int], n_classes: int) -> dict[str, float]:
    m = confusion(predicted, actual, n_classes)
    f1s = []
    for c in range(n_classes):
        tp = m[c][c]
        fp = sum(m[a][c] for a in range(n_classes)) - tp
        fn = sum(m[c]) - tp
        if tp + fp + fn:  # a label absent from both predictions and truth is left out
            f1s.append(2 * tp / (2 * tp + fp + fn))
    right = sum(m[c][c] for c in range(n_classes))
    return {"accuracy": right / max(len(actual), 1), "macro_f1": sum(f1s) / max(len(f1s), 1)}


def retrieval_metrics(anchors: Tensor, positives: Tensor) -> dict[str, float]:
    """Anchor i should retrieve positive i among all positives (cosine similarity).

    A positive that scores the same as others is ranked as a random order of the tied ones
    would rank it, on average: recall@1 is 1 / (ties + 1) where none scores higher, MRR@10 the
    mean of the reciprocal ranks it could take. Counting ties in its favour gave a model that
    maps every text to one vector MRR@10 1.0, and token overlap (where an anchor sharing no
    token with any positive ties them all at 0) a baseline no model could beat.

    Shape:
        anchors, positives: (N, D), L2-normalised
    """
    scores = anchors @ positives.T  # (N, N)
    own = scores.diagonal()[:, None]  # (N, 1)
    above = (scores > own).sum(dim=1)  # (N,) positives ranked before it
    ties = (scores == own).sum(dim=1) - 1  # (N,) the others scoring as it does
    # harmonic[n] = 1 + 1/2 + ... + 1/n, for the ranks 1..10 MRR@10 counts
    harmonic = torch.cat([torch.zeros(1, dtype=torch.float64),
                          (1.0 / torch.arange(1, 11, dtype=torch.float64)).cumsum(0)])
    first, last = above.clamp(max=10), (above + ties + 1).clamp(max=10)  # ranks first+1 .. last
    mrr = (harmonic[last] - harmonic[first]) / (ties + 1)  # (N,) the mean over the tied places
    recall = torch.where(above == 0, 1.0 / (ties + 1).double(), 0.0)
    return {"recall_at_1": recall.mean().item(), "mrr_at_10": mrr.mean().item()}
