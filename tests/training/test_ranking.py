"""tformer.training.ranking against independent implementations: scikit-learn's ndcg_score,
scipy's pearsonr/spearmanr, rank_bm25's BM25Okapi, and every order of the tied candidates
enumerated for MRR."""

import itertools
import math
import random

import numpy as np
import pytest

from tformer.training.ranking import BM25, ndcg_at, rank_metrics, reciprocal_rank, score_metrics, words


def _brute_rr(scores, relevant, k):
    """The mean over every order of the tied candidates of 1 / the first relevant's rank."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    groups = [list(g) for _, g in itertools.groupby(order, key=lambda i: scores[i])]
    total, count = 0.0, 0
    for perm in itertools.product(*[itertools.permutations(g) for g in groups]):
        ranked = [i for g in perm for i in g]
        first = next((r for r, i in enumerate(ranked, 1) if relevant[i]), None)
        total += 1 / first if first is not None and first <= k else 0.0
        count += 1
    return total / count


@pytest.mark.parametrize("seed", range(40))
def test_reciprocal_rank_is_the_mean_over_every_order_of_the_ties(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 7)
    scores = [rng.choice([0.0, 0.5, 1.0]) for _ in range(n)]  # many ties
    relevant = [rng.random() < 0.3 for _ in range(n)]
    k = rng.choice([1, 2, 3, 10])
    got = reciprocal_rank(np.array(scores), np.array(relevant), k)
    assert got == pytest.approx(_brute_rr(scores, relevant, k), abs=1e-12)


@pytest.mark.parametrize("seed", range(30))
def test_ndcg_is_scikit_learns_with_ties(seed):
    from sklearn.metrics import ndcg_score

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    relevance = rng.integers(0, 4, n).astype(float)
    scores = rng.integers(0, 5, n).astype(float)  # ties
    k = int(rng.choice([1, 3, 10]))
    expected = ndcg_score([relevance], [scores], k=k, ignore_ties=False) if relevance.any() else 0.0
    assert ndcg_at(scores, relevance, k) == pytest.approx(expected, abs=1e-12)


def test_a_constant_scorer_ranks_by_chance():
    """Twenty candidates, one relevant, all scored alike: MRR@10 is the mean of 1/1..1/10 over 20."""
    (scores, relevance) = ([0.3] * 20, [1] + [0] * 19)
    got = rank_metrics([(scores, relevance)])
    assert got["mrr_at_10"] == pytest.approx(sum(1 / r for r in range(1, 11)) / 20)
    assert got["precision_at_1"] == pytest.approx(1 / 20)
    perfect = rank_metrics([([2.0] + [1.0] * 19, relevance)])
    assert perfect == {"mrr_at_10": 1.0, "ndcg_at_10": 1.0, "precision_at_1": 1.0}


@pytest.mark.parametrize("seed", range(10))
def test_score_metrics_are_scipys(seed):
    from scipy.stats import pearsonr, spearmanr

    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 6, 50) / 5.0  # ties, as STS scores have
    predicted = truth + rng.normal(0, 0.3, 50)
    predicted[:5] = predicted[5]  # ties in the prediction too
    got = score_metrics(predicted, truth)
    assert got["pearson"] == pytest.approx(pearsonr(predicted, truth).statistic, abs=1e-12)
    assert got["spearman"] == pytest.approx(spearmanr(predicted, truth).statistic, abs=1e-12)
    assert got["mse"] == pytest.approx(float(np.mean((predicted - truth) ** 2)), abs=1e-15)


def test_a_constant_prediction_correlates_zero():
    assert score_metrics([0.5, 0.5, 0.5], [0.1, 0.9, 0.4])["spearman"] == 0.0


def test_bm25_is_rank_bm25s_okapi():
    from rank_bm25 import BM25Okapi

    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(30)] + ["the", "a"]
    passages = [" ".join(rng.choice(vocab + ["the"] * 10) for _ in range(rng.randint(0, 25)))
                for _ in range(60)]
    ours = BM25(passages)
    theirs = BM25Okapi([words(p) for p in passages])
    for query in ("w1 w2 the", "w3 w3 nothing", "THE a w29", "unknown"):
        expected = theirs.get_scores(words(query))
        got = ours.scores(query, list(range(len(passages))))
        assert np.abs(got - expected).max() <= 1e-12 * max(1.0, np.abs(expected).max())
        some = [5, 0, 17]
        assert np.allclose(ours.scores(query, some), expected[some], rtol=0, atol=1e-12)
    assert math.isclose(ours.mean_length, theirs.avgdl)
