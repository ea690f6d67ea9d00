"""What a label column may hold (tformer.kinds.labels): a fractional number is refused naming the
`score` field, in JSONL and CSV, as a number or as text; whole numbers stay classes and the run
says they look numeric; labels that look joined are warned about, naming --label-separator; and
the class weights of skewed labels (--class-weights) against their formula and the loss against
float64 NumPy."""

from __future__ import annotations

import csv
import math
import random

import numpy as np
import pytest
import torch
from text_fixtures import classification_rows, write

from tformer.commands.cli import main
from tformer.kinds import labels, make_objective, resolve_config
from tformer.kinds.classification import FIELDS

TINY = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1", "--vocab-size", "300",
        "--steps", "2", "--eval-every", "2", "--threads", "1"]


def _csv(path, rows):
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _first_line(capsys, argv) -> tuple[int, str, str]:
    """(rc, the run's description line, stderr) of `tformer train ARGV`."""
    rc = main(argv)
    out, err = capsys.readouterr()
    line = next((x for x in out.splitlines() if x.startswith("data ")), "")
    return rc, line, err


@pytest.mark.parametrize("suffix, value", [(".jsonl", 0.73), (".jsonl", "0.73"), (".csv", "0.73"),
                                           (".jsonl", "-1e-3"), (".tsv", ".5")])
def test_a_fractional_label_is_refused_naming_score(tmp_path, capsys, suffix, value):
    rows = [{"text": r["text"], "label": str(i % 3)} for i, r in enumerate(classification_rows(30))]
    rows[4]["label"] = value
    data = write(tmp_path / f"frac{suffix}", rows)
    rc = main(["train", "--data", str(data), *TINY])
    err = capsys.readouterr().err
    line = 6 if suffix != ".jsonl" else 5  # (a header row first)
    assert rc == 2 and err.count("\n") == 1, err
    assert f"frac{suffix}:{line}: label: expected a class name, got the fractional number {value!r}" in err
    assert "`score` field" in err and "--columns label=score" in err


@pytest.mark.parametrize("value, fractional", [(0.5, True), (2.0, False), ("2.50", True), ("1e3", False),
                                               ("nan", False), (float("inf"), False), ("v1.5", False),
                                               ("3", False), (True, False)])
def test_what_reads_as_a_fraction(value, fractional):
    assert labels.fractional(value) is fractional


def test_whole_numbers_stay_classes_and_the_run_says_they_look_numeric(tmp_path, capsys):
    rows = [{"text": r["text"], "label": float(1 + i % 8)} for i, r in enumerate(classification_rows(80))]
    rc, line, err = _first_line(capsys, ["train", "--data", str(write(tmp_path / "n.jsonl", rows)), *TINY])
    assert rc == 0, err
    assert "classification into 8 labels" in line
    assert "labels look numeric: 8 values, read as classes; a `score` field trains regression" in line


def test_joined_labels_are_warned_about_naming_the_separator(tmp_path, capsys):
    rng = random.Random(0)
    rows = [{"text": r["text"], "label": ";".join(rng.sample(["news", "sport", "tech"], rng.randint(1, 2)))}
            for r in classification_rows(80)]
    rc, line, err = _first_line(capsys, ["train", "--data", str(_csv(tmp_path / "j.csv", rows)), *TINY])
    assert rc == 0, err
    assert "warning: labels look joined: " in line and "--label-separator ';'" in line
    # Named, the same file trains multi-label: three labels, not the joined values.
    rc, line, err = _first_line(capsys, ["train", "--data", str(tmp_path / "j.csv"), "--label-separator", ";",
                                         "--out", str(tmp_path / "ml"), *TINY])
    assert rc == 0 and "multi-label classification into 3 labels" in line, err


@pytest.mark.parametrize("names, joined", [
    (["news;sport", "sport", "tech"], ";"),  # a part is a label of its own
    (["a|b", "b|c", "d"], "|"),  # a part recurs
    (["Arts, Music", "Science", "Sport"], None),  # one comma: a class name
    (["x;y", "z;w"], None),  # nothing recurs
])
def test_what_looks_joined(names, joined):
    found = labels.joined_labels(names)
    assert (found and found[0]) == joined


def test_a_list_in_a_later_record_is_refused_for_a_single_label_file():
    with pytest.raises(ValueError, match=r"^f:9: label: expected a class name \(one, .*got a list"):
        FIELDS.check("f:9", {"text": "t", "label": ["a", "b"]})


# Class weights -------------------------------------------------------------------------------------
def test_frequency_weights_follow_their_formula():
    counts = [600, 300, 60, 40]
    for power in (0.5, 1.0):
        got = labels.frequency_weights(counts, power).numpy()
        n, c = sum(counts), len(counts)
        raw = np.array([(n / (c * k)) ** power for k in counts])
        expected = raw * n / (raw * np.array(counts)).sum()
        assert np.allclose(got, expected, rtol=1e-6)
        assert (got * np.array(counts)).sum() / n == pytest.approx(1.0, rel=1e-6)  # records' mean: 1
    weights, note = labels.class_weights("auto", [100, 100, 90])
    assert weights is None and note == ""  # not skewed
    weights, note = labels.class_weights("none", counts)
    assert weights is None
    weights, note = labels.class_weights("weighted", counts)
    assert weights is not None and "skewed 15:1" in note and "--class-weights none" in note
    weights, note = labels.class_weights("auto", counts)  # measured no better: said, not done
    assert weights is None and note == ("labels skewed 15:1, loss unweighted (weighting it towards rare "
                                        "labels measured no better on macro-F1; --class-weights weighted "
                                        "weights it)")
    assert labels.class_weights("weighted", [100, 100, 90])[0] is not None  # asked for: whatever the skew
    assert labels.class_weights("weighted", [50, 50])[0] is None  # nothing to weigh


def test_positive_weights_follow_their_formula():
    counts, records = [500, 50, 2], 1000
    weights, note = labels.positive_weights("auto", counts, records)
    expected = [min(max(((records - k) / k) ** labels.POSITIVE_POWER, 1.0), labels.MAX_POSITIVE_WEIGHT)
                for k in counts]
    assert np.allclose(weights.numpy(), expected) and "1 of 500 records" in note
    assert labels.positive_weights("none", counts, records)[0] is None


def _skewed_rows(n=200):
    rng = random.Random(0)
    out = []
    for _ in range(n):
        label = rng.choices(["common", "rare"], weights=[0.9, 0.1])[0]
        out.append({"text": " ".join(rng.choice(["cat", "dog", label]) for _ in range(4)), "label": label})
    return out


def test_a_skewed_run_says_what_it_does_with_its_loss(tmp_path, capsys):
    """One label a record: weighting measured no better on macro-F1, so auto leaves the loss
    unweighted and says so; --class-weights weighted weights it; none says nothing."""
    data = str(write(tmp_path / "skew.jsonl", _skewed_rows()))
    rc, line, err = _first_line(capsys, ["train", "--data", data, "--out", str(tmp_path / "a"), *TINY])
    assert rc == 0 and "loss unweighted (weighting it towards rare labels measured no better" in line, err
    rc, line, err = _first_line(capsys, ["train", "--data", data, "--out", str(tmp_path / "w"),
                                         "--class-weights", "weighted", *TINY])
    assert rc == 0 and "loss weighted towards rare labels (labels skewed" in line, err
    rc, line, err = _first_line(capsys, ["train", "--data", data, "--out", str(tmp_path / "b"),
                                         "--class-weights", "none", *TINY])
    assert rc == 0 and "weighted" not in line, err


def test_the_weighted_loss_is_weighted_cross_entropy(tmp_path):
    data = write(tmp_path / "skew.jsonl", _skewed_rows())
    config = resolve_config({"data": str(data), "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1,
                             "vocab_size": 300, "label_smoothing": 0.0, "class_weights": "weighted"})
    objective = make_objective(config, None, write=False)
    weights = objective.weighting[0]
    counts = objective.source.data.label_counts
    assert counts == {"common": sum(r["label"] == "common" for r in _skewed_rows()),
                      "rare": sum(r["label"] == "rare" for r in _skewed_rows())}
    model = objective.build_model().double().eval()
    batch = objective.collate(objective.encode(objective.examples("validation")[:16]))
    loss, _ = objective.loss(model, batch)
    with torch.no_grad():
        logits = model(batch.input_ids, batch.attention_mask).logits.numpy()  # (B, C) float64
    target = batch.labels.numpy()
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    w = weights.double().numpy()[target]
    expected = -(w * logp[np.arange(len(target)), target]).sum() / w.sum()
    assert math.isclose(loss.item(), expected, rel_tol=1e-9)


def test_the_multilabel_loss_is_weighted_binary_cross_entropy(tmp_path):
    rng = random.Random(1)
    rows = [{"text": f"{'x ' * rng.randint(1, 3)}{w}", "labels": [w] + (["rare"] if rng.random() < 0.05 else [])}
            for w in rng.choices(["cat", "dog"], k=200)]
    data = write(tmp_path / "ml.jsonl", rows)
    config = resolve_config({"data": str(data), "d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1,
                             "vocab_size": 300})
    objective = make_objective(config, None, write=False)
    pos = objective.weighting[0]
    assert pos is not None and "positives weighted" in objective.description
    model = objective.build_model().double().eval()
    # A new model's biases start at each label's weighted prior log-odds: log(w p / (1 - p)).
    counts = objective.source.data.label_counts
    p = np.array([counts[name] for name in objective.labels]) / len(rows)
    assert np.allclose(model.head.bias.detach().numpy(), np.log(pos.double().numpy() * p / (1 - p)), atol=1e-6)
    batch = objective.collate(objective.encode(objective.examples("validation")[:16]))
    loss, _ = objective.loss(model, batch)
    with torch.no_grad():
        x = model(batch.input_ids, batch.attention_mask).logits.numpy()  # (B, C) float64
    y = batch.labels.numpy()
    log_sig, log_not = -np.logaddexp(0, -x), -np.logaddexp(0, x)
    expected = -(pos.double().numpy() * y * log_sig + (1 - y) * log_not).mean()
    assert math.isclose(loss.item(), expected, rel_tol=1e-9)
