"""Synthetic tasks: deterministic, disjoint splits; correct labels; batching; metrics."""

import pytest
import torch

from tformer.training.tasks import BOS, EOS, PAD, TASKS, UNK, get_task, sequence_metrics
from tformer.training.tasks.brackets import is_balanced
from tformer.training.tasks.listops import evaluate

SMALL = {"valid_size": 50, "test_size": 100}


def test_unknown_task_names_argument_and_known_tasks():
    with pytest.raises(ValueError, match=r"task: expected one of copy, reverse.*got 'nope'"):
        get_task("nope")


@pytest.mark.parametrize("name", list(TASKS))
def test_splits_are_deterministic(name):
    a, b = get_task(name, seed=3, **SMALL), get_task(name, seed=3, **SMALL)
    assert a.split("test") == b.split("test")
    assert a.split("validation") == b.split("validation")
    assert a.train_batch(7, 16) == b.train_batch(7, 16)
    assert a.train_batch(7, 16) != a.train_batch(8, 16)
    assert get_task(name, seed=4, **SMALL).split("test") != a.split("test")


@pytest.mark.parametrize("name", list(TASKS))
def test_splits_are_disjoint_by_input(name):
    task = get_task(name, **SMALL)
    test = {ex.source for ex in task.split("test")}
    valid = {ex.source for ex in task.split("validation")}
    assert len(test) == 100 and len(valid) == 50 and not test & valid
    train = {ex.source for step in range(20) for ex in task.train_batch(step, 32)}
    assert not train & (test | valid)


@pytest.mark.parametrize("name", list(TASKS))
def test_lengths_vary_and_fit_the_declared_bounds(name):
    task = get_task(name, **SMALL)
    enc = task.tokenizer.encode
    examples = task.split("test")
    lengths = {len(enc(ex.source)) for ex in examples}
    assert len(lengths) > 3
    assert max(lengths) <= task.max_source_tokens
    assert max(len(enc(ex.target)) for ex in examples) <= task.max_target_tokens
    assert all(UNK not in enc(ex.source) for ex in examples)


def test_targets_are_right():
    for ex in get_task("reverse", **SMALL).split("test"):
        assert ex.target.split() == ex.source.split()[::-1]
    for ex in get_task("sort", **SMALL).split("test"):
        assert ex.target.split() == sorted(ex.source.split())
    for ex in get_task("copy", **SMALL).split("test"):
        assert ex.target == ex.source
    for ex in get_task("add", **SMALL).split("test"):
        a, b = ex.source.split("+")
        assert int(ex.target) == int(a) + int(b) and max(len(a), len(b)) <= 5


def _listops_value(tokens):
    """An independent evaluator: recursive descent over the token list."""
    def parse(i):
        if tokens[i].isdigit():
            return int(tokens[i]), i + 1
        op, values, i = tokens[i], [], i + 1
        while tokens[i] != "]":
            v, i = parse(i)
            values.append(v)
        return evaluate(op, values), i + 1
    value, end = parse(0)
    assert end == len(tokens)
    return value


def test_listops_labels_and_baseline():
    task = get_task("listops", **SMALL)
    for ex in task.split("test"):
        assert _listops_value(ex.source.split()) == ex.label
    assert evaluate("[MED", [2, 5]) == 3 and evaluate("[SM", [7, 8]) == 5
    baseline = task.majority_baseline()
    assert 0 <= baseline["label"] <= 9 and baseline["accuracy"] < 0.3


def test_brackets_labels_and_balance():
    task = get_task("brackets", valid_size=50, test_size=400)
    labels = [ex.label for ex in task.split("test")]
    for ex in task.split("test"):
        assert ex.label == int(is_balanced(ex.source))
    assert 0.4 < sum(labels) / len(labels) < 0.6
    assert is_balanced("([])[]") and not is_balanced("([)]") and not is_balanced("((")


def test_seq2seq_collate():
    task = get_task("reverse", **SMALL)
    examples = task.split("test")[:5]
    b = task.collate(examples)
    assert b.src.dtype == torch.long and b.src_mask.dtype == torch.bool
    assert torch.equal(b.src_mask, b.src != PAD) and torch.equal(b.tgt_mask, b.tgt_in != PAD)
    assert (b.tgt_in[:, 0] == BOS).all()
    for i, ex in enumerate(examples):
        n = len(ex.target.split())
        assert b.labels[i, n] == EOS and b.src[i, len(ex.source.split())] == EOS
        # the decoder reads the target shifted right by one
        assert torch.equal(b.tgt_in[i, 1 : n + 1], b.labels[i, :n])
    assert not b.src_mask.all()  # variable lengths -> some padding


def test_classification_collate():
    task = get_task("brackets", **SMALL)
    examples = task.split("test")[:6]
    b = task.collate(examples)
    assert (b.input_ids[:, 0] == BOS).all() and b.labels.tolist() == [e.label for e in examples]
    assert torch.equal(b.attention_mask, b.input_ids != PAD)


def test_tokenizer_roundtrip_and_strict():
    tok = get_task("reverse").tokenizer
    assert tok.vocab[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    ids = tok.encode("3 1 4 1 5")
    assert tok.encode("31415") == ids and tok.decode(ids + [EOS, 7]) == "3 1 4 1 5"
    assert tok.encode("3 x") == [tok.encode("3")[0], UNK]
    with pytest.raises(ValueError, match="'x' in '3 x' is not in the vocabulary"):
        tok.encode("3 x", strict=True)
    listops = get_task("listops").tokenizer
    assert listops.decode(listops.encode("[MAX 2 [MIN 3 4 ] ]")) == "[MAX 2 [MIN 3 4 ] ]"


def test_sequence_metrics():
    # target [5, 6]: exact; one token wrong; no EOS; extra tokens after EOS are ignored
    m = sequence_metrics([[5, 6, EOS], [5, 7, EOS], [5, 6], [5, 6, EOS, 9]], [[5, 6]] * 4)
    assert m["exact_match"] == 0.5
    assert m["accuracy"] == pytest.approx((3 + 2 + 2 + 3) / 12)


def test_score_checks_lengths():
    task = get_task("brackets", **SMALL)
    with pytest.raises(ValueError, match="predictions: expected 100"):
        task.score([0], task.split("test"))
    assert task.score([ex.label for ex in task.split("test")], task.split("test")) == {
        "accuracy": 1.0
    }
