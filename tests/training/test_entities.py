"""tformer.training.entities against seqeval (the package transformers' token-classification
example scores with): the same chunks of random tag sequences, BIO, IOBES and ill-formed ones
(I- after O, E- without B-, types switching mid-entity), and the same precision, recall and F1,
overall and per type; the schemes' checks; IOB2 written for the same entities; the dictionary
baseline."""

import random
import warnings

import pytest

# (a test dependency: where it is missing, as on a GPU machine's own Python, this module skips
# rather than stop the collection of the device tests)
pytest.importorskip("seqeval")
from seqeval.metrics import classification_report, f1_score, precision_score, recall_score  # noqa: E402
from seqeval.metrics.sequence_labeling import get_entities  # noqa: E402

from tformer.training.entities import (
    SpanCounts,
    SpanDictionary,
    check_tags,
    entities,
    label_names,
    span_counts,
    span_scores,
    to_iob2,
)

# seqeval warns of the empty means (and F-scores) of a set with no entity: its answer is still compared.
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:F-score is ill-defined")]

BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
IOBES = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]
MIXED = IOBES + ["I-ORG", "E-ORG", "B-ORG"]


def _sentences(rng, tags, n, longest=12):
    return [[rng.choice(tags) for _ in range(rng.randint(0, longest))] for _ in range(n)]


@pytest.mark.parametrize("tags", [BIO, IOBES, MIXED], ids=["bio", "iobes", "ill-formed"])
def test_chunks_are_seqevals(tags):
    rng = random.Random(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns of tags it does not know (none here)
        for sentence in _sentences(rng, tags, 600):
            assert entities(sentence) == [tuple(e) for e in get_entities(sentence)], sentence


@pytest.mark.parametrize("tags", [BIO, IOBES, MIXED], ids=["bio", "iobes", "ill-formed"])
def test_scores_are_seqevals_overall_and_per_type(tags):
    rng = random.Random(1)
    for _ in range(60):
        true = _sentences(rng, tags, rng.randint(1, 6))
        # predictions: the truth with some tags changed (or, at times, random)
        pred = [[t if rng.random() < 0.7 else rng.choice(tags) for t in s] for s in true]
        ours = span_scores(span_counts(true, pred))
        assert ours["f1"] == pytest.approx(f1_score(true, pred), abs=1e-12)
        assert ours["precision"] == pytest.approx(precision_score(true, pred, zero_division=0), abs=1e-12)
        assert ours["recall"] == pytest.approx(recall_score(true, pred, zero_division=0), abs=1e-12)
        report = classification_report(true, pred, output_dict=True, zero_division=0)
        types = {k.split("/")[1] for k in ours if "/" in k}
        assert types == set(report) - {"micro avg", "macro avg", "weighted avg"}
        for t in types:
            for ours_key, theirs_key in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score"),
                                         ("support", "support")):
                assert ours[f"{ours_key}/{t}"] == pytest.approx(report[t][theirs_key], abs=1e-12), (t, ours_key)


def test_counts_add_up_over_windows():
    rng = random.Random(2)
    true = _sentences(rng, MIXED, 50)
    pred = [[rng.choice(MIXED) for _ in s] for s in true]
    whole, parts = SpanCounts(), SpanCounts()
    whole.add(true, pred)
    for i in range(0, 50, 7):
        parts.add(true[i : i + 7], pred[i : i + 7])
    assert whole.scores() == parts.scores()
    right = sum(a == b for s, p in zip(true, pred, strict=False) for a, b in zip(s, p, strict=False))
    assert whole.scores()["accuracy"] == right / sum(map(len, true))


@pytest.mark.parametrize("tags", [BIO, IOBES, MIXED], ids=["bio", "iobes", "ill-formed"])
def test_iob2_keeps_the_entities(tags):
    rng = random.Random(3)
    for sentence in _sentences(rng, tags, 500):
        written = to_iob2(sentence)
        assert entities(written) == entities(sentence)
        assert all(t == "O" or t[:2] in ("B-", "I-") for t in written)


def test_iob1_and_iobes_read_as_iob2():
    assert to_iob2(["I-PER", "I-PER", "O", "I-LOC"]) == ["B-PER", "I-PER", "O", "B-LOC"]  # IOB1
    assert to_iob2(["S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]) == ["B-PER", "B-LOC", "I-LOC", "I-LOC", "B-LOC"]


@pytest.mark.parametrize("tags, message", [
    (["B-PER", "I-LOC"], r"^f:3: tags\[1\]: expected I-PER \(the PER entity going on\) or B-LOC \(a new one\) "
                         r"after B-PER, got I-LOC$"),
    (["B-PER", "I-PER", "E-LOC"], r"^f:3: tags\[2\]: expected E-PER .* or B-LOC .* after I-PER, got E-LOC$"),
    (["PER"], r"^f:3: tags\[0\]: expected O or B-, I-, E- or S- and a type \(BIO/IOB2, IOBES\), got 'PER'$"),
    (["O", "B-"], r"^f:3: tags\[1\]: expected O or B-, I-, E- or S- .*, got 'B-'$"),
    (["U-PER"], r"got 'U-PER'$"),
    (["b-per"], r"got 'b-per'$"),
])
def test_bad_tags_are_refused_naming_the_place(tags, message):
    with pytest.raises(ValueError, match=message):
        check_tags(tags, "f:3")


def test_well_formed_sequences_pass():
    for tags in (["O", "B-PER", "I-PER", "O", "I-LOC"], ["S-PER", "B-LOC", "E-LOC"], ["I-PER", "B-PER"]):
        check_tags(tags, "f:1")


def test_label_names():
    assert label_names(["PER", "LOC", "PER"]) == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]


def test_dictionary_marks_the_longest_spans_that_were_mostly_entities():
    train = [(["new", "york", "is", "big"], ["B-LOC", "I-LOC", "O", "O"]),
             (["york", "lives"], ["B-PER", "O"]),
             (["york", "and", "york"], ["B-PER", "O", "B-LOC"]),
             (["a", "big", "file"], ["O", "O", "B-VAR"]),
             (["the", "file", "and", "the", "file"], ["O", "O", "O", "O", "B-VAR"])]
    d = SpanDictionary.learn(lambda: iter(train))
    # york: PER twice, LOC once, O once (inside "new york"); file: VAR twice, O once; big: never one
    assert d.spans == {("new", "york"): "LOC", ("york",): "PER", ("file",): "VAR"}
    assert d.tag(["in", "new", "york", "york", "new", "file"]) == ["O", "B-LOC", "I-LOC", "B-PER", "O", "B-VAR"]
    assert SpanDictionary.from_json(d.to_json()).spans == d.spans
    once = SpanDictionary.learn(lambda: iter([(["a", "file"], ["O", "B-VAR"]), (["file", "x"], ["O", "O"])]))
    assert once.spans == {}  # as often not an entity as one: not marked
