"""The metrics against their definitions, computed another way (tformer.training.evaluation):
counts of windows of outputs, summed, score exactly as the whole list does, so an evaluation may
stream its outputs; retrieval ranks ties as the mean over every order of them."""

import itertools
import random
from fractions import Fraction

import numpy as np
import pytest
import sacrebleu
import torch
import torch.nn.functional as F
from text_fixtures import WORDS

from tformer.text.specials import EOS
from tformer.training.evaluation import (
    classification_metrics,
    confusion,
    confusion_metrics,
    retrieval_metrics,
    text_counts,
    text_metrics,
    text_scores,
    token_overlap_metrics,
)
from tformer.training.tasks.base import sequence_counts, sequence_metrics, sequence_scores


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


def _by_every_order(scores: torch.Tensor) -> tuple[float, float]:
    """recall@1 and MRR@10 averaged over every order of each anchor's tied positives (the
    definition of random tie-breaking), one anchor at a time, in plain Python."""
    recalls, rrs = [], []
    for i, row in enumerate(scores.tolist()):
        tied = [j for j, s in enumerate(row) if s == row[i]]
        above = sum(s > row[i] for s in row)
        places = [above + order.index(i) for order in itertools.permutations(tied)]  # 0-based ranks
        recalls.append(sum(p == 0 for p in places) / len(places))
        rrs.append(sum(1 / (p + 1) if p < 10 else 0.0 for p in places) / len(places))
    return sum(recalls) / len(recalls), sum(rrs) / len(rrs)


def test_a_model_that_maps_every_text_to_one_vector_scores_as_a_random_order():
    n = 5
    same = F.normalize(torch.ones(n, 4), dim=-1)
    metrics = retrieval_metrics(same, same)
    assert metrics["recall_at_1"] == pytest.approx(1 / n)  # was 1.0: every tie counted for it
    assert metrics["mrr_at_10"] == pytest.approx(sum(1 / r for r in range(1, n + 1)) / n)


def test_without_ties_the_ranks_are_the_plain_ones():
    g = torch.Generator().manual_seed(0)
    a, p = F.normalize(torch.randn(30, 8, generator=g), dim=-1), F.normalize(torch.randn(30, 8, generator=g), dim=-1)
    scores = a @ p.T
    rank = (scores > scores.diagonal()[:, None]).sum(1)
    metrics = retrieval_metrics(a, p)
    assert metrics["recall_at_1"] == pytest.approx((rank == 0).float().mean().item())
    assert metrics["mrr_at_10"] == pytest.approx(sum(1 / (r + 1) for r in rank.tolist() if r < 10) / 30)


def _tied_cases(count: int, n: int = 12) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(anchors, positives) of few distinct vectors (0/1 bags, as the token-overlap baseline
    makes), so that many scores tie, yet no anchor ties with more than 8 positives (every order
    of them is enumerated): the first ``count`` such draws."""
    cases, rng = [], random.Random(0)
    while len(cases) < count:
        bags = torch.tensor([[float(rng.random() < 0.4) for _ in range(3)] for _ in range(2 * n)])
        a, p = F.normalize(bags[:n], dim=-1), F.normalize(bags[n:], dim=-1)
        scores = a @ p.T
        if max(int((row == row[i]).sum()) for i, row in enumerate(scores)) <= 8:
            cases.append((a, p))
    return cases


def test_ties_score_as_the_mean_over_every_order_of_the_tied_positives():
    cases = _tied_cases(8)
    past_ten = 0  # anchors that some order of their ties puts past rank 10 (MRR@10's cut)
    for a, p in cases:
        scores = a @ p.T
        recall, mrr = _by_every_order(scores)
        metrics = retrieval_metrics(a, p)
        assert metrics["recall_at_1"] == pytest.approx(recall, abs=1e-12)
        assert metrics["mrr_at_10"] == pytest.approx(mrr, abs=1e-12)
        own = scores.diagonal()[:, None]
        past_ten += int(((scores >= own).sum(1) > 10).sum())
    assert past_ten > 0  # the cut at 10 was exercised


def test_retrieval_metrics_rank_a_block_of_anchors_at_a_time(monkeypatch):
    """An embedding run's evaluation held every anchor's score against every positive at once:
    (N, N), 1.7 GB at 10^4 records and 5.5 GB at 2 x 10^4 (`tformer eval --data`). It scores
    a block of anchors at a time, RANK_SCORES scores at most, ties and all, as the whole matrix
    scores them."""
    from tformer.training import evaluation

    cases = _tied_cases(3)
    whole = [retrieval_metrics(a, p) for a, p in cases]  # 12 x 12 scores: one block
    monkeypatch.setattr(evaluation, "RANK_SCORES", 5 * 12 + 11, raising=False)  # 5 anchors a block
    matmul, shapes = torch.Tensor.__matmul__, []
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: shapes.append((len(a), len(b.T))) or matmul(a, b))
    assert [retrieval_metrics(a, p) for a, p in cases] == whole
    assert shapes == [(5, 12), (5, 12), (2, 12)] * 3  # never (12, 12)


def _exact_overlap(anchors: list[set[int]], positives: list[set[int]]) -> tuple[float, float]:
    """recall@1 and MRR@10 of token overlap in exact rationals: cosine^2 = shared^2 / (the two
    sizes), ties as the mean over their places (0 where a text has no token)."""
    harmonic = [Fraction(0)]
    for k in range(1, 11):
        harmonic.append(harmonic[-1] + Fraction(1, k))
    recall = mrr = Fraction(0)
    for i, a in enumerate(anchors):
        scores = [Fraction(len(a & p) ** 2, max(len(a) * len(p), 1)) for p in positives]
        above = sum(s > scores[i] for s in scores)
        ties = sum(s == scores[i] for s in scores) - 1
        recall += Fraction(1, ties + 1) if above == 0 else 0
        mrr += (harmonic[min(above + ties + 1, 10)] - harmonic[min(above, 10)]) / (ties + 1)
    return float(recall / len(anchors)), float(mrr / len(anchors))


def test_token_overlap_ties_equal_cosines_exactly():
    """2 of 4 tokens and 3 of 9, with an anchor of 6: the same cosine, 1/sqrt(6). Dense float32
    bags scored them 0.4082483 and 0.4082483 one ulp apart, ranking by a rounding (the
    baseline on 1,500 real EN->FR pairs: recall@1 0.57663 against the exact 0.57630)."""
    anchors = [{3, 4, 11, 12, 19, 23}, {1, 8, 9, 15, 27, 29}]
    positives = [{11, 19, 26, 27}, {1, 8, 9, 11, 15, 19, 23, 27, 29}]
    metrics = token_overlap_metrics(anchors, positives)
    assert metrics["recall_at_1"] == pytest.approx((1 / 2 + 1) / 2)  # anchor 0 ties; anchor 1 wins
    assert metrics["recall_at_1"] == pytest.approx(_exact_overlap(anchors, positives)[0])


@pytest.mark.parametrize("dense_pairs", [0, 30, 10**9])  # every token indexed; some dense; all dense
def test_token_overlap_counted_without_dense_bags_scores_as_exact_rationals(monkeypatch, dense_pairs):
    """The baseline of an embedding run built (N, V) dense bags: 10^5 records over 3 x 10^4
    tokens would be 12 GB before a model was trained. Counted through the inverted index, the
    dense columns of the most shared tokens, or both, every case ranks as exact rationals do
    (many ties, empty texts), whole and a few anchors at a time."""
    from tformer.training import evaluation

    rng = random.Random(1)
    cases = []
    for n in (1, 7, 40):
        draw = lambda: {rng.randrange(100, 112) for _ in range(rng.randint(0, 4))}  # noqa: E731
        cases.append(([draw() for _ in range(n)], [draw() for _ in range(n)]))
    cases.append(([{1, 2, 3}, {1}, {4, 5}, set(), {2, 9}] * 8, [{1, 2}, {1, 8}, {5}, {3}, set()] * 8))
    exact = [_exact_overlap(a, p) for a, p in cases]
    assert any(0 < recall < 1 for recall, _ in exact)  # ties were ranked, not all won or lost
    monkeypatch.setattr(evaluation, "DENSE_PAIRS", dense_pairs)
    for rank_scores in (evaluation.RANK_SCORES, 5 * 3 * 40):  # whole; 3 anchors a block
        monkeypatch.setattr(evaluation, "RANK_SCORES", rank_scores)
        for (a, p), want in zip(cases, exact, strict=True):
            got = token_overlap_metrics(a, p)
            assert (got["recall_at_1"], got["mrr_at_10"]) == pytest.approx(want, abs=1e-12)
