"""What a cross-encoder's scores are measured with: each query's candidates ranked against
their relevance (MRR@10, NDCG@10, precision@1), scores against true scores (Pearson, Spearman,
MSE), and the trivial baselines' scorers (BM25 of the query's words; token overlap of a pair).

    rank_metrics([(scores, relevance), ...])   # per query: its candidates' scores and labels
    score_metrics(predicted, truth)            # {"pearson", "spearman", "mse"}
    BM25(passages).scores(query, [i, j, ...])  # Okapi BM25 of passages i, j... for a query

Ties are counted as a random order of the tied candidates would count them, on average (the
rule of tformer.training.evaluation.retrieval_metrics): a model that gives every candidate one
score ranks by chance, and BM25, which scores every passage sharing no word with the query 0,
gets what chance gives those. NDCG's tie rule is scikit-learn's (``ndcg_score(ignore_ties=
False)``: each tied candidate takes the mean gain of its ties); MRR's is the expected
reciprocal rank of the first relevant candidate over the orders of its ties.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

CUTOFF = 10  # MRR@10 and NDCG@10
WORD = re.compile(r"\w+")


def rank_metrics(groups: Iterable[tuple[Sequence[float], Sequence[float]]], k: int = CUTOFF
                 ) -> dict[str, float]:
    """mrr_at_10, ndcg_at_10 and precision_at_1 averaged over queries; each group: (the model's
    scores of a query's candidates, their relevance: 0 not relevant, > 0 relevant, graded).
    A query without a relevant candidate scores 0 on each (as scikit-learn's NDCG does)."""
    mrr, ndcg, first, n = 0.0, 0.0, 0.0, 0
    for scores, relevance in groups:
        s, rel = np.asarray(scores, dtype=np.float64), np.asarray(relevance, dtype=np.float64)
        if s.shape != rel.shape:
            raise ValueError(f"scores: expected one per candidate ({len(rel)}), got {len(s)}")
        mrr += reciprocal_rank(s, rel > 0, k)
        ndcg += ndcg_at(s, rel, k)
        first += reciprocal_rank(s, rel > 0, 1)  # the top candidate relevant, ties averaged
        n += 1
    n = max(n, 1)
    return {"mrr_at_10": mrr / n, "ndcg_at_10": ndcg / n, "precision_at_1": first / n}


def reciprocal_rank(scores: np.ndarray, relevant: np.ndarray, k: int = CUTOFF) -> float:
    """1 / the rank of the first relevant candidate (0 past rank k), expected over the orders of
    the candidates tied with the best-scored relevant one. With a non-relevant and r relevant
    candidates tied there, the first relevant one comes after j of the a with probability
    P(j) = a! / (a - j)! * r * (a + r - j - 1)! / (a + r)!, so P(j + 1) = P(j) (a - j) / (a + r - j - 1).

    Shape:
        scores, relevant: (N,) one query's candidates
    """
    if not relevant.any():
        return 0.0
    best = scores[relevant].max()
    above = int((scores > best).sum())  # all of them not relevant
    tied = scores == best
    r, a = int((tied & relevant).sum()), int((tied & ~relevant).sum())
    total, p = 0.0, r / (a + r)
    for j in range(a + 1):
        rank = above + 1 + j
        if rank > k:
            break
        total += p / rank
        if j < a:
            p *= (a - j) / (a + r - j - 1)
    return total


def ndcg_at(scores: np.ndarray, relevance: np.ndarray, k: int = CUTOFF) -> float:
    """DCG@k / ideal DCG@k with linear gains and 1 / log2(rank + 1) discounts; candidates with
    equal scores each take their ties' mean gain (scikit-learn's ndcg_score, ignore_ties=False).

    Shape:
        scores, relevance: (N,) one query's candidates
    """
    n = len(scores)
    discount = 1.0 / np.log2(np.arange(n) + 2.0)  # (N,)
    discount[k:] = 0.0
    ideal = float(np.sort(relevance)[::-1] @ discount)
    if ideal == 0.0:
        return 0.0
    values, inverse, counts = np.unique(-scores, return_inverse=True, return_counts=True)
    mean_gain = np.bincount(inverse.reshape(-1), weights=relevance, minlength=len(values)) / counts  # (G,)
    ends = np.cumsum(counts)  # each group of ties holds the ranks ends - counts .. ends - 1
    cumulative = np.concatenate([[0.0], np.cumsum(discount)])
    return float(mean_gain @ (cumulative[ends] - cumulative[ends - counts])) / ideal


def score_metrics(predicted: Sequence[float], truth: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman correlation of the predicted scores with the true ones, and their
    mean squared error. A constant prediction (or truth) correlates 0: it orders nothing."""
    p, t = np.asarray(predicted, dtype=np.float64), np.asarray(truth, dtype=np.float64)
    if p.shape != t.shape or p.ndim != 1:
        raise ValueError(f"predicted: expected one score per true score ({t.shape}), got {p.shape}")
    return {"spearman": pearson(ranks(p), ranks(t)), "pearson": pearson(p, t),
            "mse": float(np.mean((p - t) ** 2)) if len(t) else 0.0}


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """The correlation coefficient of x and y (0 where either is constant)."""
    if len(x) < 2:
        return 0.0
    dx, dy = x - x.mean(), y - y.mean()
    norm = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(dx @ dy) / norm if norm > 0 else 0.0


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..N, ties given their mean rank (Spearman's rule; scipy's rankdata "average")."""
    values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - counts + 1 + ends) / 2.0)[inverse.reshape(-1)]


# Baselines ----------------------------------------------------------------------------------------
def words(text: str) -> list[str]:
    """A text's words as BM25 counts them: lowercased runs of letters, digits and _."""
    return WORD.findall(text.lower())


def overlap_cosine(a: set, b: set) -> float:
    """The cosine of two texts' 0/1 bags of tokens: shared / sqrt(the two sizes) (0 for an empty one)."""
    return len(a & b) / math.sqrt(len(a) * len(b)) if a and b else 0.0


class BM25:
    """Okapi BM25 (Robertson and Zaragoza 2009) over a corpus of passages, with rank_bm25's
    BM25Okapi's choices: k1 = 1.5, b = 0.75, idf = ln((N - n + 0.5) / (n + 0.5)) where n
    passages hold the word, a negative idf (a word in more than half the passages) replaced by
    0.25 x the mean idf; each word of the query counts once per time it occurs there."""

    def __init__(self, passages: Sequence[str], k1: float = 1.5, b: float = 0.75,
                 epsilon: float = 0.25) -> None:
        self.k1, self.b = k1, b
        self.counts = [Counter(words(p)) for p in passages]
        self.lengths = np.array([sum(c.values()) for c in self.counts], dtype=np.float64)  # (N,)
        n = len(passages)
        self.mean_length = float(self.lengths.mean()) if n else 0.0
        holding = Counter(word for c in self.counts for word in c)
        self.idf = {w: math.log(n - m + 0.5) - math.log(m + 0.5) for w, m in holding.items()}
        floor = epsilon * sum(self.idf.values()) / max(len(self.idf), 1)
        self.idf = {w: (v if v >= 0 else floor) for w, v in self.idf.items()}

    def scores(self, query: str, passages: Sequence[int]) -> np.ndarray:
        """BM25 of the passages at the indices ``passages`` for ``query``: (len(passages),)."""
        counts = [self.counts[i] for i in passages]
        norm = self.k1 * (1 - self.b + self.b * self.lengths[list(passages)] / max(self.mean_length, 1e-12))
        out = np.zeros(len(counts))
        for word in words(query):
            idf = self.idf.get(word)
            if idf is None:
                continue
            tf = np.array([c.get(word, 0) for c in counts], dtype=np.float64)
            out += idf * tf * (self.k1 + 1) / (tf + norm)
        return out
