"""Objective.predict: batches sorted by length within a window, predictions in input order."""

import time
from types import SimpleNamespace

import pytest
import torch
from text_fixtures import classification_rows, seq2seq_rows, write

from tformer.kinds import make_objective, resolve_config

TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "vocab_size": 300, "max_tokens": 256,
        "threads": 1, "precision": "fp32"}


def _objective_and_model(tmp_path):
    data = write(tmp_path / "d.jsonl", seq2seq_rows(600))
    objective = make_objective(resolve_config({"data": str(data), **TINY}))
    torch.manual_seed(0)
    return objective, objective.build_model().eval()


def test_predictions_come_in_input_order_from_batches_sorted_by_length(tmp_path, monkeypatch):
    objective, model = _objective_and_model(tmp_path)
    examples = objective.examples("train")[:100]
    widths = []
    predict_batch = objective.predict_batch

    def recording(model, batch, **options):
        widths.append(batch.src.size(1))
        return predict_batch(model, batch, **options)

    monkeypatch.setattr(objective, "predict_batch", recording)
    got = objective.predict(model, examples, batch_size=8, max_len=6)
    lengths = [len(e.source) for e in objective.encode(examples)]
    assert len(set(lengths)) > 5 and widths == sorted(widths)  # one window: shortest batches first
    assert widths[-1] == max(lengths) and widths[0] < max(lengths)
    monkeypatch.setattr(objective, "predict_batch", predict_batch)
    alone = [objective.predict(model, [ex], batch_size=1, max_len=6)[0] for ex in examples]
    assert got == alone  # greedy decoding is batch independent: each example's own output, in order


def test_under_a_deadline_the_order_is_kept_and_a_prefix_is_predicted(tmp_path, monkeypatch):
    """A deadline that the second batch would pass: the first batch_size examples, as given."""
    from tformer.training import objective as base

    objective, model = _objective_and_model(tmp_path)
    examples = objective.examples("train")[:40]
    deadline = time.perf_counter() + 1000  # generation itself is never cut
    monkeypatch.setattr(base, "time", SimpleNamespace(perf_counter=lambda: deadline + 1))  # predict's clock
    got = objective.predict(model, examples, batch_size=8, max_len=6, deadline=deadline)
    monkeypatch.undo()
    assert got == objective.predict(model, examples[:8], batch_size=8, max_len=6)


def test_the_first_batch_runs_to_its_end_and_a_batch_the_deadline_cuts_is_left_out(tmp_path, monkeypatch):
    """Outputs cut mid-generation are not predictions: a timed seq2seq run's test began at its
    deadline and scored each output's first token (BLEU 0, "did not learn", where eval gave 97).
    The first batch decodes to its end whatever the time; a later one the deadline cuts is
    dropped, and the examples before it are scored."""
    from tformer.nn import generate as gen

    objective, model = _objective_and_model(tmp_path)
    examples = objective.examples("train")[:40]
    deadline = time.perf_counter() + 1000  # predict's own clock never stops a batch from starting
    monkeypatch.setattr(gen, "time", SimpleNamespace(perf_counter=lambda: deadline + 1))  # generation's: past
    got = objective.predict(model, examples, batch_size=8, max_len=6, deadline=deadline)
    monkeypatch.undo()
    assert got == objective.predict(model, examples[:8], batch_size=8, max_len=6)  # whole outputs
    assert any(len(out) > 1 for out in got)  # not cut after their first token


def test_under_a_deadline_batches_are_sorted_within_windows_and_a_cut_keeps_a_prefix(tmp_path, monkeypatch):
    """Unsorted under a deadline, each batch padded to its longest (a validation of 12.5-token
    summaries padded batches of 64 to 64 tokens). Sorted within windows of DEADLINE_WINDOW batches,
    a deadline that cuts a window keeps the examples before its first unfinished one: still
    the predictions of a prefix of the examples, as given."""
    from tformer.text.batches import DEADLINE_WINDOW
    from tformer.training import objective as base

    objective, model = _objective_and_model(tmp_path)
    examples = objective.examples("train")[:8 + 3 * 8 * DEADLINE_WINDOW]  # a first batch, 3 windows
    plain = objective.predict(model, examples, batch_size=8, max_len=6)
    widths, late = [], {"after": None}
    predict_batch = objective.predict_batch

    def recording(model, batch, **options):
        widths.append(batch.src.size(1))
        if late["after"] is not None and len(widths) > late["after"]:
            raise base.DeadlinePassed
        return predict_batch(model, batch, **options)

    monkeypatch.setattr(objective, "predict_batch", recording)
    deadline = time.perf_counter() + 1000
    got = objective.predict(model, examples, batch_size=8, max_len=6, deadline=deadline)
    assert got == plain  # in order, every one
    windows = [widths[i : i + DEADLINE_WINDOW] for i in range(1, len(widths), DEADLINE_WINDOW)]
    assert len(windows) == 3 and all(w == sorted(w) for w in windows) and widths != sorted(widths)
    for after in range(1, len(widths)):  # the deadline cuts the run after `after` batches
        widths.clear()
        late["after"] = after
        cut = objective.predict(model, examples, batch_size=8, max_len=6, deadline=deadline)
        assert len(cut) >= 8 and cut == plain[: len(cut)]
    assert len(cut) >= 8 + 2 * 8 * DEADLINE_WINDOW  # two whole windows kept before the last cut


def test_a_decoder_s_outputs_grow_to_its_targets_length(tmp_path):
    """Output_growth: the validation targets' tokens over the tokens written (each with its end
    token), at least 1; the latest validation's, set by evaluate (1 for any other split)."""
    objective, model = _objective_and_model(tmp_path)
    examples = objective.examples("validation")[:20]
    targets = sum(len(e.target) + 1 for e in objective.encode(examples))
    assert objective.output_growth(examples, [[] for _ in examples]) == pytest.approx(targets / 20)
    half = [[5] * max(0, (targets // 20 - 1) // 2) for _ in examples]  # about half the targets' length
    assert objective.output_growth(examples, half) == pytest.approx(targets / sum(len(p) + 1 for p in half))
    assert objective.output_growth(examples, [[5] * 500 for _ in examples]) == 1.0  # runaway: as timed
    objective.evaluate(model, "validation", examples=examples, max_len=1)  # outputs of a token at most
    assert objective.growth > 1.0
    objective.evaluate(model, "test", examples=examples, max_len=1)
    assert objective.growth == 1.0
    classes = make_objective(resolve_config({"data": str(write(tmp_path / "c.jsonl", classification_rows(60))),
                                             **TINY}))
    assert classes.output_growth(classes.examples("train")[:5], [[0.0, 1.0]] * 5) == 1.0


def test_a_long_prediction_says_how_much_eager_work_is_left_and_a_budgeted_one_nothing(tmp_path, monkeypatch):
    """From the second batch on, predict expects the eager seconds the examples left would take
    at the last batch's pace (what a compiled kernel must repay: kernels.compiling.expecting);
    the first batch, and every batch under a deadline, expects nothing (no budget is spent on
    compiling)."""
    from helpers import record_expectations

    from tformer.training import objective as base

    objective, model = _objective_and_model(tmp_path)
    examples = objective.examples("train")[:32]
    expected = record_expectations(monkeypatch, base)
    objective.predict(model, examples, batch_size=8, max_len=6)
    assert len(expected) == 4 and expected[0] == 0.0
    assert all(e > 0 for e in expected[1:]) and expected[1] > expected[3]  # 24 examples left, then 8
    alone = expected[3]
    expected.clear()
    objective.predict(model, examples, batch_size=8, max_len=6, deadline=time.perf_counter() + 1000)
    assert expected and set(expected) == {0}
    # A command's later windows count too (`tformer generate --file`: 512 inputs a window): 10,000
    # examples after these, and the last batch expects ~10,008 examples' work, not 8.
    from tformer.nn.kernels.compiling import more_to_come

    expected.clear()
    with more_to_come(10_000):
        objective.predict(model, examples, batch_size=8, max_len=6)
    assert expected[0] == 0.0 and expected[3] > 100 * alone
