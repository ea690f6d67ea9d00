"""F1 scores of label sets (multi-label classification) and the per-label thresholds that choose
them, in NumPy: what tformer.kinds' multi-label kind scores with.

    thresholds = choose_thresholds(probs, truth)          # (N, C) probabilities and truth -> (C,)
    counts = Counts.of(probs >= thresholds, truth)        # counts of windows add: counts + more
    counts.metrics()     # {"micro_f1", "macro_f1", "samples_f1"}
    counts.top_k()       # the baseline: the best micro-F1 of giving every example the k most frequent labels
    micro_f1_interval(chosen, truth)   # the verdict's: the gain over that baseline, 95%, paired bootstrap

A threshold is a probability: a label is chosen where its probability is at least its threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tformer.training.verdict import f1_interval

# A label's own threshold is chosen where the validation split has at least this many records of
# it; below, the one threshold best for micro-F1 over all labels (benchmarks/README.md: measured).
MIN_POSITIVES = 5


def best_cut(probs: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(threshold, F1) of the cut of ``probs`` (M,) that maximises F1 against ``truth`` (M,)
    bool: the k most probable predicted positive, k chosen; the threshold lies halfway between
    the k-th and the next probability (the lowest probability: every one chosen). F1 0 where
    ``truth`` has no positive."""
    positives = int(truth.sum())
    if positives == 0 or len(probs) == 0:
        return 0.5, 0.0
    order = np.argsort(-probs, kind="stable")
    p, y = probs[order].astype(np.float64), truth[order]
    tp = np.cumsum(y)  # (M,) true positives among the first k + 1
    f1 = 2 * tp / (np.arange(1, len(p) + 1) + positives)
    f1[:-1][p[:-1] == p[1:]] = -1.0  # a cut between equal probabilities is not a threshold
    k = int(np.argmax(f1))
    threshold = (p[k] + p[k + 1]) / 2 if k + 1 < len(p) else p[k]
    return float(threshold), float(f1[k])


def choose_thresholds(probs: np.ndarray, truth: np.ndarray, min_positives: int = MIN_POSITIVES) -> np.ndarray:
    """Per-label thresholds (C,) for ``probs`` (N, C) against ``truth`` (N, C) bool: each label's
    F1-best cut (``best_cut``) where ``truth`` holds at least ``min_positives`` of it and that cut
    finds some; else the one cut of all N x C probabilities best for micro-F1."""
    shared, _ = best_cut(probs.ravel(), truth.ravel())
    out = np.full(probs.shape[1], shared)
    for c in range(probs.shape[1]):
        if truth[:, c].sum() >= min_positives:
            threshold, f1 = best_cut(probs[:, c], truth[:, c])
            if f1 > 0:
                out[c] = threshold
    return out


@dataclass
class Counts:
    """What the F1 scores of label sets add up from (counts of windows of examples add): per
    label, true positives, false positives and false negatives (C,); the sum of each example's
    F1 and the examples."""

    tp: np.ndarray
    fp: np.ndarray
    fn: np.ndarray
    samples_f1: float
    n: int

    @classmethod
    def of(cls, chosen: np.ndarray, truth: np.ndarray) -> Counts:
        """Of (N, C) bool predictions and truth. An example with no label that is given none
        scores F1 1 (nothing to find, nothing wrongly found)."""
        tp = (chosen & truth).sum(0)
        fp = (chosen & ~truth).sum(0)
        fn = (~chosen & truth).sum(0)
        row_tp = (chosen & truth).sum(1)
        denominator = chosen.sum(1) + truth.sum(1)  # (N,)
        row_f1 = np.where(denominator > 0, 2 * row_tp / np.maximum(denominator, 1), 1.0)
        return cls(tp, fp, fn, float(row_f1.sum()), len(chosen))

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn,
                      self.samples_f1 + other.samples_f1, self.n + other.n)

    def metrics(self) -> dict[str, float]:
        """micro-F1 (of the counts summed over labels), macro-F1 (the mean of each label's F1; a
        label neither held nor chosen is left out, as classification's macro-F1 leaves it) and
        samples-F1 (the mean of each example's F1)."""
        tp, fp, fn = int(self.tp.sum()), int(self.fp.sum()), int(self.fn.sum())
        present = (self.tp + self.fp + self.fn) > 0
        per_label = 2 * self.tp[present] / (2 * self.tp[present] + self.fp[present] + self.fn[present])
        return {"micro_f1": 2 * tp / max(2 * tp + fp + fn, 1),
                "macro_f1": float(per_label.mean()) if present.any() else 0.0,
                "samples_f1": self.samples_f1 / max(self.n, 1)}

    def top_k(self) -> tuple[float, int]:
        """(the best micro-F1 of giving every example the k labels most frequent in them, that k):
        k labels holding T_k of the T labels held give TP = T_k, FP = k n - T_k, FN = T - T_k."""
        held = np.sort(self.tp + self.fn)[::-1]  # (C,) records holding each label, most first
        total = int(held.sum())
        best, best_k = 0.0, 0
        for k in range(1, len(held) + 1):
            tp = int(held[:k].sum())
            f1 = 2 * tp / max(k * self.n + total, 1)
            if f1 > best:
                best, best_k = f1, k
        return best, best_k


def example_rows(chosen: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per example: (labels held, labels chosen, chosen right), of (N, C) bool predictions and
    truth -> (N, 3): summed, the counts of micro-F1."""
    return np.stack([truth.sum(1), chosen.sum(1), (chosen & truth).sum(1)], 1)


def top_k_rows(truth: np.ndarray, k: int) -> np.ndarray:
    """example_rows of the baseline that gives every example the k labels held most often."""
    most = np.argsort(-truth.sum(0), kind="stable")[:k]
    return np.stack([truth.sum(1), np.full(len(truth), k), truth[:, most].sum(1)], 1)


def micro_f1_interval(chosen: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """The 95% interval of micro-F1's gain over the top-k baseline (Counts.top_k), by a paired
    bootstrap of the examples (micro-F1 sums counts: no mean of per-example scores)."""
    _, k = Counts.of(np.zeros_like(truth), truth).top_k()
    return f1_interval(example_rows(chosen, truth), top_k_rows(truth, k))
