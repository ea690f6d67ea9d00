"""The verdict has a margin: "learned" only beyond the test's noise, "did not learn" only when
clearly not, "cannot tell" in between, with the numbers; a test too short to judge is unknown
(beats_baseline null), and `tformer info` and the model card read it so."""

import json
import random

import pytest
from text_fixtures import classification_rows, write

from tformer.commands.cli import main
from tformer.training.report import baseline_verdict, with_baseline
from tformer.training.verdict import CANNOT_TELL, LEARNED, NOT_LEARNED, gain_interval, judge

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
