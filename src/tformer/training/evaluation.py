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

# A token shared by more than 1 / DENSE_PAIRS of all (anchor, positive) pairs is counted by a
# matrix product (~10^10 multiply-adds a second on 2 cores) rather than scattered adds (~10^8):
# a ratio, not a tuning, and either way the counts are the same.
DENSE_PAIRS = 100


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
    def scores(start: int, stop: int) -> Tensor:  # (b, N)
        return anchors[start:stop] @ positives.T

    return ranked(scores, len(anchors), len(positives), anchors.device)


def token_overlap_metrics(anchors: list[set[int]], positives: list[set[int]]) -> dict[str, float]:
    """retrieval_metrics of texts as sets of tokens, scored by the cosine of their 0/1 bags:
    shared tokens / sqrt(the two sizes) (0 where a text has none).

    The bags are never held dense, (N, V) of them: 10^5 records over a 3 x 10^4-token
    vocabulary would be 12 GB. Shared tokens are counted a block of anchors at a time, two
    ways that give the same whole numbers: the most frequent tokens (where nearly every pair
    shares some) as a matrix product of their dense columns, the rest through an inverted index
    (token -> the positives that hold it), whose work is the pairs that do share a token. An
    anchor's positives are ranked by shared^2 / the positive's size, in float64: the cosine's
    square times the anchor's size, the same along the anchor's row, so the same order; and a
    correctly rounded division of whole numbers, so equal cosines tie exactly (float32 bags
    scored 2/sqrt(24) and 3/sqrt(54) one ulp apart).
    """
    n_anchors, n = len(anchors), len(positives)
    vocab = {t: i for i, t in enumerate(sorted(set().union(*anchors, *positives)))}
    anchor_ids = [np.fromiter((vocab[t] for t in a), dtype=np.int64, count=len(a)) for a in anchors]
    lengths = np.array([len(p) for p in positives], dtype=np.int64)  # (N,)
    owner = np.repeat(np.arange(n), lengths)  # (nnz,) each positive token's positive
    tokens = np.fromiter((vocab[t] for p in positives for t in p), dtype=np.int64,
                         count=int(lengths.sum()))
    order = np.argsort(tokens, kind="stable")
    holders = owner[order]  # positives, grouped by token
    # token t's positives: holders[starts[t] : starts[t + 1]]
    starts = np.searchsorted(tokens[order], np.arange(len(vocab) + 1))
    # A dense column costs a block's b x N multiply-adds at GEMM speed; the index, one scattered
    # add per sharing pair. Columns go dense, most shared first, while a pair count is worth it,
    # and no more than fit RANK_SCORES (the (N, F) dense positives).
    in_anchors = np.bincount(np.concatenate([*anchor_ids, np.zeros(0, np.int64)]), minlength=len(vocab))
    pairs = in_anchors * np.diff(starts)  # (V,) the sharing pairs each token makes
    by_pairs = np.argsort(-pairs, kind="stable")[: RANK_SCORES // max(n, 1)]
    dense = by_pairs[pairs[by_pairs] * DENSE_PAIRS > n_anchors * n]  # (F,)
    column = np.full(len(vocab), -1)
    column[dense] = np.arange(len(dense))
    dense_positives = torch.zeros(n, len(dense))  # (N, F)
    is_dense = column[tokens] >= 0
    dense_positives[torch.from_numpy(owner[is_dense]), torch.from_numpy(column[tokens[is_dense]])] = 1.0
    sizes = torch.from_numpy(lengths).double().clamp(min=1)  # (N,) an empty text scores 0

    def scores(start: int, stop: int) -> Tensor:  # (b, N)
        block = anchor_ids[start:stop]
        sparse = [np.concatenate([holders[starts[t] : starts[t + 1]] for t in ids if column[t] < 0]
                                 or [np.zeros(0, np.int64)]) + row * n for row, ids in enumerate(block)]
        shared = torch.from_numpy(np.bincount(np.concatenate(sparse), minlength=len(block) * n)
                                  .reshape(len(block), n)).double()  # (b, N) tokens in common
        if len(dense):
            bags = torch.zeros(len(block), len(dense))  # (b, F)
            for row, ids in enumerate(block):
                bags[row, torch.from_numpy(column[ids][column[ids] >= 0])] = 1.0
            shared += bags @ dense_positives.T  # whole numbers below 2^24: exact
        return shared.square_().div_(sizes)  # (b, N), in place: blocks are large

    # A block holds its counts (int64), its scores (float64) and the dense part's product.
    return ranked(scores, n_anchors, 5 * n)


def ranked(scores, n_anchors: int, width: int, device: torch.device | str = "cpu") -> dict[str, float]:
    """recall@1 and MRR@10 of anchor i retrieving item i (ties as retrieval_metrics says), from
    scores(start, stop) -> (stop - start, N): anchors start..stop against every item, called on
    blocks of anchors that hold at most RANK_SCORES numbers of `width` per anchor."""
    # Filled in place, block by block: a small tensor kept per block (a list to concatenate)
    # stopped the allocator reusing the freed blocks of scores, +9 GB at 10^5 anchors of width 300.
    above = torch.empty(n_anchors, dtype=torch.long, device=device)  # (N,) ranked before it
    ties = torch.empty_like(above)  # (N,) the others scoring as it does
    block = max(1, RANK_SCORES // max(width, 1))
    for start in range(0, n_anchors, block):
        block_scores = scores(start, min(start + block, n_anchors))  # (b, N)
        rows = torch.arange(len(block_scores), device=block_scores.device)
        own = block_scores[rows, start + rows][:, None]  # (b, 1): each anchor's own item
        above[start : start + block] = (block_scores > own).sum(dim=1)
        ties[start : start + block] = (block_scores == own).sum(dim=1) - 1
    # harmonic[n] = 1 + 1/2 + ... + 1/n, for the ranks 1..10 MRR@10 counts
    harmonic = torch.cat([torch.zeros(1, dtype=torch.float64),
                          (1.0 / torch.arange(1, 11, dtype=torch.float64)).cumsum(0)])
    first, last = above.clamp(max=10), (above + ties + 1).clamp(max=10)  # ranks first+1 .. last
    mrr = (harmonic[last] - harmonic[first]) / (ties + 1)  # (N,) the mean over the tied places
    recall = torch.where(above == 0, 1.0 / (ties + 1).double(), 0.0)
    return {"recall_at_1": recall.mean().item(), "mrr_at_10": mrr.mean().item()}
