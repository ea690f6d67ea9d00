"""The model a fine-tune builds (tformer.training.objectives): --dropout, where given, is the
probability of every dropout of the model; else the pretrained model's own stand. A streamed
evaluation (evaluate_stream) holds a window of examples and scores them all."""

import numpy as np
import pytest
from hf_bert_fixtures import make_bert_dir
from text_fixtures import classification_rows, embedding_rows, seq2seq_rows, write
from torch import nn

from tformer.kinds import make_objective, resolve_config
from tformer.nn.attention import MultiHeadAttention
from tformer.nn.dropout import Dropout
from tformer.training import objective as base

# The pretrained model's own, each unlike the other and unlike --dropout's default (0.1).
HIDDEN, ATTENTION = 0.05, 0.15


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return make_bert_dir(tmp_path_factory.mktemp("bert") / "bert", hidden_dropout_prob=HIDDEN,
                         attention_probs_dropout_prob=ATTENTION)


def dropouts(model: nn.Module) -> dict[str, float]:
    """{module name: its dropout probability}: each dropout module's p (the embeddings', each
    layer's, a classifier head's) and each attention's on its weights."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            found[name] = module.dropout
        elif isinstance(module, (Dropout, nn.Dropout)):
            found[name] = module.p
    return found


def fine_tune(tmp_path, pretrained, rows, **options):
    data = write(tmp_path / "train.jsonl", rows(40))
    config = resolve_config({"data": str(data), "from_pretrained": str(pretrained), **options})
    (tmp_path / "run").mkdir()
    return make_objective(config, tmp_path / "run").build_model()


@pytest.mark.parametrize("rows, head", [(classification_rows, 1), (embedding_rows, 0)])
def test_a_fine_tune_given_dropout_has_it_in_every_dropout_of_the_model(tmp_path, pretrained, rows, head):
    model = fine_tune(tmp_path, pretrained, rows, dropout=0.3)
    found = dropouts(model)
    layers = model.config.n_layers  # per layer: the attention weights' and the residual's; the embeddings'
    assert len(found) == 2 * layers + 1 + head, found
    assert set(found.values()) == {0.3}, found
    assert (model.config.dropout, model.config.attention_dropout) == (0.3, 0.3)


@pytest.mark.parametrize("rows", [classification_rows, embedding_rows])
def test_a_fine_tune_without_dropout_keeps_the_pretrained_models_own(tmp_path, pretrained, rows):
    found = dropouts(fine_tune(tmp_path, pretrained, rows))
    attention = {name for name in found if name.endswith("self_attn")}
    assert attention and {found[name] for name in attention} == {ATTENTION}, found
    assert {p for name, p in found.items() if name not in attention} == {HIDDEN}, found


def test_dropout_zero_turns_every_dropout_of_a_fine_tune_off(tmp_path, pretrained):
    found = dropouts(fine_tune(tmp_path, pretrained, classification_rows, dropout=0.0))
    assert found and set(found.values()) == {0.0}, found


TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1, "vocab_size": 300, "max_tokens": 256,
        "threads": 1, "precision": "fp32"}


def data_run(tmp_path, rows):
    """An objective on a file of `rows(300)` (not trained) and its model."""
    config = resolve_config({"data": str(write(tmp_path / "train.jsonl", rows(300))), **TINY})
    objective = make_objective(config)
    return objective, objective.build_model()


@pytest.mark.parametrize("rows", [seq2seq_rows, classification_rows, embedding_rows])
def test_a_tally_of_windows_scores_as_score_and_baseline_of_the_whole_list(tmp_path, rows):
    objective, model = data_run(tmp_path, rows)
    examples = objective.examples("test")
    preds = objective.predict(model, examples)
    if rows is seq2seq_rows:  # every other output right: BLEU above 0
        eos = objective.source.eos_id
        preds = [e.target + [eos] if i % 2 else p
                 for i, (e, p) in enumerate(zip(objective.encode(examples), preds, strict=True))]
    tally = objective.tally()
    for start in range(0, len(examples), 7):
        tally.add(examples[start : start + 7], preds[start : start + 7])
    metrics = objective.score(examples, preds)[0]
    assert tally.metrics() == metrics and metrics[objective.main_metric] > 0
    assert tally.baseline() == objective.baseline(examples)


def test_evaluate_stream_tells_each_window_the_examples_after_it(tmp_path, monkeypatch):
    """A compiled kernel is repaid over all the examples a streamed evaluation scores, not a
    window's (kernels.compiling.more_to_come): each window's predictions hear how many come
    after it, from ``total`` or a list's length; from an iterator of unknown length, none."""
    from tformer.nn.kernels.compiling import items_to_come

    monkeypatch.setattr(base, "STREAM_WINDOW", 8, raising=False)
    objective, model = data_run(tmp_path, classification_rows)
    predict, told = objective.predict, []

    def spy(model, examples, **options):
        told.append(items_to_come())
        return predict(model, examples, **options)

    objective.predict = spy
    examples = list(objective.read_examples(str(write(tmp_path / "e.jsonl", classification_rows(20, seed=5)))))
    for given, total in ((iter(examples), 20), (examples, 0), (iter(examples), 0)):
        assert objective.evaluate_stream(model, given, total=total)[0]["examples"] == 20
    assert told == [12, 4, 0, 12, 4, 0, 0, 0, 0] and items_to_come() == 0


@pytest.mark.parametrize("rows", [seq2seq_rows, classification_rows])
def test_evaluate_stream_reads_a_window_ahead_at_most_and_keeps_counts_only(tmp_path, monkeypatch, rows):
    """`tformer eval --data` held every record of the file, every prediction and sacrebleu's
    caches of them all (1.7 GB at 10^5 seq2seq records): it reads, predicts and scores a window
    at a time, and what it keeps between windows (the tally) does not grow with the records."""
    monkeypatch.setattr(base, "STREAM_WINDOW", 8, raising=False)
    objective, model = data_run(tmp_path, rows)
    predict, tally = objective.predict, objective.tally
    tallies = []

    def evaluated(n: int) -> tuple[list[int], dict]:
        """How many records were read past those predicted at each predict call; the metrics."""
        data = write(tmp_path / f"eval{n}.jsonl", rows(n, seed=5))
        read, predicted, ahead = [0], [0], []

        def reader():
            for record in objective.read_examples(str(data)):
                read[0] += 1
                yield record

        def spy(model, examples, **options):
            ahead.append(read[0] - predicted[0])
            predicted[0] += len(examples)
            return predict(model, examples, **options)

        objective.predict = spy
        objective.tally = lambda: tallies.append(tally()) or tallies[-1]
        metrics, _, shown = objective.evaluate_stream(model, reader(), samples=3)
        assert len(shown) == 3 and predicted[0] == n == metrics["examples"]
        return ahead, metrics

    ahead, _ = evaluated(40)
    assert ahead == [8] * 5  # a window read, predicted, then the next
    evaluated(16)
    held = [{k: np.shape(v) for k, v in vars(t).items() if isinstance(v, (list, np.ndarray))} for t in tallies]
    assert held[0] == held[1] and held[0], held  # counts of a fixed shape, no list of examples
