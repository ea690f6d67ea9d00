"""Metrics: what a prediction is scored with, per objective.

seq2seq: BLEU and chrF with sacrebleu on detokenised text (Post 2018: scores comparable
across papers), plus exact match. classification: accuracy and macro-F1 (each label
counts the same, however rare), plus a confusion matrix. embedding: recall@1 and MRR@10
of each anchor retrieving its own positive among all the split's positives.
"""

from __future__ import annotations

import numpy as np
import sacrebleu
import torch
from torch import Tensor


def text_metrics(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    return text_scores(text_counts(hypotheses, references))


# What the corpus scores of outputs are computed from, one int64 array that adds: the counts of
# two sets of outputs sum to the counts of both, so an evaluation may take its outputs a window
# at a time (tformer eval --data) and still score the whole corpus. Laid out as sacrebleu's
# sentence statistics summed, BLEU's (hypothesis and reference lengths, then n-gram matches and
# totals per order: 2 + 2 x 4) then chrF's (hypothesis, reference and matched n-grams per order:
# 3 x 6), then exact matches and outputs. sacrebleu's corpus_score sums the same statistics
# (_aggregate_and_compute) and scores the sum.
def text_counts(hypotheses: list[str], references: list[str]) -> np.ndarray:
    """BLEU's and chrF's statistics, exact matches and pairs, summed over the pairs (layout above)."""
    metrics = _metrics()
    sums = [np.zeros(width, dtype=np.int64) for width in _widths(*metrics)]
    if hypotheses:
        sums = [np.sum(metric._extract_corpus_statistics(hypotheses, [references]), axis=0, dtype=np.int64)
                for metric in metrics]
    exact = sum(h == r for h, r in zip(hypotheses, references, strict=True))
    return np.concatenate([*sums, [exact, len(references)]])


def text_scores(counts: np.ndarray) -> dict[str, float]:
    """BLEU, chrF (sacrebleu: 0-100) and exact match of text_counts, summed over any windows."""
    bleu, chrf = _metrics()
    split = _widths(bleu, chrf)[0]
    exact, n = counts[-2:].tolist()
    return {
        "bleu": bleu._compute_score_from_stats(counts[:split].tolist()).score,
        "chrf": chrf._compute_score_from_stats(counts[split:-2].tolist()).score,
        "exact_match": exact / max(n, 1),
    }


def _metrics() -> tuple[sacrebleu.BLEU, sacrebleu.CHRF]:
    """sacrebleu's defaults, as corpus_bleu and corpus_chrf use them."""
    return sacrebleu.BLEU(), sacrebleu.CHRF()


def _widths(bleu: sacrebleu.BLEU, chrf: sacrebleu.CHRF) -> tuple[int, int]:
    """How many numbers a sentence's statistics hold: BLEU's, chrF's (the layout above)."""
    return 2 + 2 * bleu.max_ngram_order, 3 * (chrf.char_order + chrf.word_order)


def confusion(predicted: list[int], actual: list[int], n_classes: int) -> list[list[int]]:
    """matrix[true][predicted] counts."""
    m = [[0] * n_classes for _ in range(n_classes)]
    for p, a in zip(predicted, actual, strict=True):
        m[a][p] += 1
    return m


def classification_metrics(predicted: list[int], actual: list[int], n_classes: int) -> dict[str, float]:
    return confusion_metrics(confusion(predicted, actual, n_classes))


def confusion_metrics(m: list[list[int]] | np.ndarray) -> dict[str, float]:
    """Accuracy and macro-F1 of a confusion matrix (matrix[true][predicted] counts: matrices of
    two sets of predictions add up to the matrix of both)."""
    m = np.asarray(m, dtype=np.int64)
    n_classes = len(m)
    f1s = []
    for c in range(n_classes):
        tp = int(m[c, c])
        fp = int(m[:, c].sum()) - tp
        fn = int(m[c].sum()) - tp
        if tp + fp + fn:  # a label absent from both predictions and truth is left out
            f1s.append(2 * tp / (2 * tp + fp + fn))
    right = int(np.trace(m))
    return {"accuracy": right / max(int(m.sum()), 1), "macro_f1": sum(f1s) / max(len(f1s), 1)}


# Scores held at a time (64 MiB of float32) while anchors are ranked a block at a time, not the
# N x N of them (10^4 records held 1.7 GB, 2 x 10^4 5.5 GB: 10^5 would have needed over 100).
RANK_SCORES = 1 << 24


def retrieval_metrics(anchors: Tensor, positives: Tensor) -> dict[str, float]:
    """Anchor i should retrieve positive i among all positives (cosine similarity).

    A positive that scores the same as others is ranked as a random order of the tied ones
    would rank it, on average: recall@1 is 1 / (ties + 1) where none scores higher, MRR@10 the
    mean of the reciprocal ranks it could take. Counting ties in its favour gave a model that
    maps every text to one vector MRR@10 1.0, and token overlap (where an anchor sharing no
    token with any positive ties them all at 0) a baseline no model could beat.

    Every anchor is scored against every positive (N x N scores: the metric's own cost), a
    block of anchors at a time, so that at most RANK_SCORES scores are held.

    Shape:
        anchors, positives: (N, D), L2-normalised
    """
    # Filled in place, block by block: a small tensor kept per block (a list to concatenate)
    # stopped the allocator reusing the freed blocks of scores, +9 GB at 10^5 anchors of width 300.
    above = torch.empty(len(anchors), dtype=torch.long, device=anchors.device)  # (N,) ranked before it
    ties = torch.empty_like(above)  # (N,) the others scoring as it does
    block = max(1, RANK_SCORES // max(len(positives), 1))
    for start in range(0, len(anchors), block):
        scores = anchors[start : start + block] @ positives.T  # (b, N)
        rows = torch.arange(len(scores), device=scores.device)
        own = scores[rows, start + rows][:, None]  # (b, 1): each anchor's own positive
        above[start : start + block] = (scores > own).sum(dim=1)
        ties[start : start + block] = (scores == own).sum(dim=1) - 1
    # harmonic[n] = 1 + 1/2 + ... + 1/n, for the ranks 1..10 MRR@10 counts
    harmonic = torch.cat([torch.zeros(1, dtype=torch.float64),
                          (1.0 / torch.arange(1, 11, dtype=torch.float64)).cumsum(0)])
    first, last = above.clamp(max=10), (above + ties + 1).clamp(max=10)  # ranks first+1 .. last
    mrr = (harmonic[last] - harmonic[first]) / (ties + 1)  # (N,) the mean over the tied places
    recall = torch.where(above == 0, 1.0 / (ties + 1).double(), 0.0)
    return {"recall_at_1": recall.mean().item(), "mrr_at_10": mrr.mean().item()}
