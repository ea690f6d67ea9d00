"""The verdict has a margin: "learned" only beyond the test's noise, "did not learn" only when
clearly not, "cannot tell" in between, with the numbers; a test too short to judge is unknown
(beats_baseline null), and `tformer info` and the model card read it so."""

import json
import random

import numpy as np
import pytest
from text_fixtures import classification_rows, write

from tformer.commands.cli import main
from tformer.training.ranking import ranks
from tformer.training.report import baseline_verdict, with_baseline
from tformer.training.verdict import (
    CANNOT_TELL,
    LEARNED,
    NOT_LEARNED,
    f1_interval,
    gain_interval,
    judge,
    spearman_interval,
)

TINY = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-layers", "1", "--vocab-size", "300",
        "--max-tokens", "256", "--threads", "1", "--precision", "fp32", "--quiet"]


def test_random_labels_that_beat_the_majority_by_chance_cannot_tell():
    """1 seed in 8 printed "the model learned: 0.7059 beats 0.6471" on random labels (17 examples)."""
    verdict, (low, high) = judge(12 / 17, 11 / 17, "accuracy", 17)
    assert verdict == CANNOT_TELL and low < 0 < high
    record = with_baseline({"split": "test", "accuracy": 12 / 17, "examples": 17, "stopped_by": "max_minutes"},
                           "accuracy", {"baseline": 11 / 17, "baseline_by": "the majority class"})
    assert record["beats_baseline"] is None and record["verdict"] == CANNOT_TELL
    line = baseline_verdict(record)
    assert line.startswith("warning: cannot tell whether the model learned: test accuracy 0.7059 against "
                           "0.6471 for the majority class, gain +0.059 (95% interval ")
    assert "17 examples): within the test's noise; a longer --max-minutes trains more" in line


def test_the_bound_is_never_narrower_than_the_spread_of_real_paired_differences():
    """Simulated: a model right on 80% of examples, the majority class on 40%, correlated any
    way; the bound's interval covers the true gain (0.4) in >= 95% of 400 draws of 200 examples."""
    rng = random.Random(0)
    covered = 0
    for trial in range(400):
        pairs = []
        for _ in range(200):
            b = rng.random() < 0.4
            m = (rng.random() < 0.8) if trial % 2 else (b or rng.random() < 2 / 3)  # two couplings
            pairs.append((m, b))
        m, b = sum(p[0] for p in pairs) / 200, sum(p[1] for p in pairs) / 200
        low, high = gain_interval(m, b, "accuracy", 200)
        covered += low <= 0.4 <= high
    assert covered >= 0.95 * 400, covered


@pytest.mark.parametrize("value, baseline, key, n, verdict", [
    (0.85, 0.43, "accuracy", 264, LEARNED),
    (0.40, 0.43, "accuracy", 2000, NOT_LEARNED),   # below, and a gain of 2 points is ruled out
    (0.44, 0.43, "accuracy", 2000, CANNOT_TELL),   # a point above: within the noise
    (21.9, 7.1, "bleu", 1000, LEARNED),
    (1.54, 7.1, "bleu", 1000, NOT_LEARNED),        # the outside run that "did not learn"
    (0.9, 0.5, "mrr_at_10", 5, CANNOT_TELL),       # too few examples for any verdict
    (1.0, 1.0, "accuracy", 1, CANNOT_TELL),        # a perfect baseline matched on 1 example: recorded
                                                   # "learned" while the run said "too few to tell"
    (1.0, 1.0, "accuracy", 50, LEARNED),           # ... matched on 50: the split is too easy, not failed
])
def test_the_verdict_follows_the_interval(value, baseline, key, n, verdict):
    assert judge(value, baseline, key, n)[0] == verdict


def test_a_test_too_short_to_judge_is_unknown_in_the_record_info_and_the_card(tmp_path, capsys, monkeypatch):
    """`beats_baseline: false` was recorded (and read by info and the card) when the test was
    only too short to judge: that is unknown, not no."""
    from tformer.export.model_card import baseline_lines
    from tformer.training import report

    real = report.judge
    monkeypatch.setattr(report, "judge", lambda v, b, k, n, *spread: real(v, b, k, min(n, 12), *spread))  # a short test
    data = write(tmp_path / "d.jsonl", classification_rows(300))
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out), "--steps", "1", *TINY]) == 0
    capsys.readouterr()
    test = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert test["verdict"] == CANNOT_TELL and test["beats_baseline"] is None
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "cannot tell whether the model learned" in info and "did not learn" not in info
    card = " ".join(baseline_lines(test, "accuracy"))
    assert "cannot tell whether this model learned" in card and "did not beat" not in card


def _simulated_sentences(rng, n):
    """Sentences of 1 entity (98%) and of 40 (2%): the model finds every entity of the big ones
    and 30% of the small ones', the baseline 20% of the big ones' and 70% of the small ones';
    each predicts as many spans as are true. (true, predicted, right) rows."""
    model, base = [], []
    for _ in range(n):
        if rng.random() < 0.02:
            model.append((40, 40, 40))
            base.append((40, 40, 8))
        else:
            model.append((1, 1, int(rng.random() < 0.3)))
            base.append((1, 1, int(rng.random() < 0.7)))
    return np.array(model), np.array(base)


def _f1(rows):
    t, p, c = rows.sum(0)
    return 2 * c / max(t + p, 1)


def test_a_paired_bootstrap_covers_an_f1_over_spans_where_the_mean_bound_does_not():
    """Entity F1 sums spans over sentences: a sentence of 40 entities weighs 40 times one of 1, so
    the gain moves more than a mean of per-sentence scores would, and the bound made for such a
    mean covered the true gain in 61% of 150 tests of 150 sentences. The paired bootstrap: 93%."""
    rng = random.Random(0)
    truth = np.mean([_f1(m) - _f1(b) for m, b in (_simulated_sentences(rng, 20000) for _ in range(3))])
    bootstrap = bound = 0
    trials = 150
    for trial in range(trials):
        model, base = _simulated_sentences(rng, 150)
        low, high = f1_interval(model, base, draws=400, seed=trial)
        bootstrap += low <= truth <= high
        low, high = gain_interval(_f1(model), _f1(base), "f1", len(model))
        bound += low <= truth <= high
    assert bootstrap >= 0.9 * trials, (bootstrap, bound)
    assert bound < 0.8 * trials, (bootstrap, bound)  # why the bootstrap: the bound is too narrow here


def test_a_paired_bootstrap_of_spearman_covers_the_true_gain():
    """Scores correlated 0.6 with the truth (Spearman's of the population: 6/pi asin(0.3)); a
    baseline correlated 0.3; 120 examples: the interval of the gain covers the truth in >= 92%."""
    rng = np.random.default_rng(0)
    true_gain = 6 / np.pi * (np.arcsin(0.6 / 2) - np.arcsin(0.3 / 2))
    covered, trials = 0, 150
    for trial in range(trials):
        truth, noise, other = rng.standard_normal((3, 120))
        model = 0.6 * truth + 0.8 * noise
        base = 0.3 * truth + np.sqrt(1 - 0.09) * (0.5 * noise + np.sqrt(0.75) * other)  # paired with the model
        low, high = spearman_interval(ranks(model), ranks(truth), [ranks(base)], draws=400, seed=trial)
        covered += low <= true_gain <= high
    assert covered >= 0.92 * trials, covered


def test_the_verdict_follows_a_paired_interval_where_the_scorer_drew_one():
    """A tagger's F1 0.30 against 0.25 on 2,000 sentences: the bound alone says learned; a paired
    interval that spans 0 (the spans' counts vary) makes it cannot tell, and is the one recorded."""
    record = {"split": "test", "f1": 0.30, "examples": 2000}
    assert with_baseline(record, "f1", {"baseline": 0.25})["verdict"] == LEARNED
    judged = with_baseline({**record, "paired_interval": [-0.01, 0.11]}, "f1", {"baseline": 0.25})
    assert judged["verdict"] == CANNOT_TELL and judged["gain_interval"] == [-0.01, 0.11]
    assert "paired_interval" not in judged
    judged = with_baseline(record, "f1", {"baseline": 0.25, "paired_interval": [-0.2, 0.01]})
    assert judged["verdict"] == NOT_LEARNED and "paired_interval" not in judged


def test_a_streamed_multi_label_tally_draws_from_every_window():
    """`tformer eval` scores windows as they come: the multi-label tally's interval is the one
    drawn from all its examples at once, and its micro-F1 and baseline are the counts'."""
    from types import SimpleNamespace

    from tformer.kinds.multilabel import LabelTally
    from tformer.training.label_sets import Counts, micro_f1_interval

    rng = np.random.default_rng(1)
    truth = rng.random((300, 11)) < 0.2
    chosen = truth ^ (rng.random((300, 11)) < 0.1)
    objective = SimpleNamespace(labels=list("abcdefghijk"), chosen=lambda preds: chosen[preds],
                                truth=lambda examples: truth[examples])
    tally = LabelTally(objective)
    for first in range(0, 300, 128):
        rows = np.arange(first, min(first + 128, 300))
        tally.add(rows, rows)
    whole = Counts.of(chosen, truth)
    assert tally.metrics() == whole.metrics()
    baseline = tally.baseline()
    assert baseline["baseline"] == whole.top_k()[0]
    assert baseline["paired_interval"] == list(micro_f1_interval(chosen, truth))
    low, high = baseline["paired_interval"]
    assert low < whole.metrics()["micro_f1"] - whole.top_k()[0] < high
