"""The tokenizers a data run trains."""

import pytest
from text_fixtures import seq2seq_rows

from tformer.training.subwords import run_tokenizer, train_tokenizer

ROUND_TRIP = [
    "Hello, World!  Two  spaces, and a trailing one ",
    "Ça va? Naïve café — «quoted» Straße",
    "Error: %s not found (%d files, %(name)s)",
    "東京は日本の首都です。Москва — столица России. مرحبا بالعالم",
    "MiXeD CaSe\ttab",
]


@pytest.mark.parametrize("kind", ["bpe", "unigram", "wordpiece"])
def test_tokenizer_round_trips_text(kind):
    corpus = ROUND_TRIP * 20 + [r["source"] for r in seq2seq_rows(50)]
    tok = run_tokenizer(train_tokenizer(iter(corpus), kind, 400), max_length=200)
    texts = ROUND_TRIP if kind == "bpe" else ROUND_TRIP[2:3]  # only bytes cover every script
    for text in texts:
        assert tok.decode(tok.pieces([text])[0]) == text
    if kind == "bpe":  # unseen scripts too: byte-level has no unknown token
        assert tok.decode(tok.pieces(["Ελληνικά עברית"])[0]) == "Ελληνικά עברית"


@pytest.mark.parametrize("kind", ["bpe", "unigram", "wordpiece"])
def test_a_lowercasing_tokenizer_lowercases_in_training_and_from_its_saved_file(kind, tmp_path):
    from tformer.training.subwords import load_backend

    corpus = ROUND_TRIP * 20 + [r["source"] for r in seq2seq_rows(50)]
    backend = train_tokenizer(iter(corpus), kind, 400, lowercase=True)
    (tmp_path / "tokenizer.json").write_text(backend.to_str())
    for b in (backend, load_backend(tmp_path / "tokenizer.json")):
        tok = run_tokenizer(b, max_length=200)
        assert tok.pieces(["MiXeD CaSe"]) == tok.pieces(["mixed case"])
    cased = run_tokenizer(train_tokenizer(iter(corpus), kind, 400), max_length=200)
    assert cased.pieces(["MiXeD CaSe"]) != cased.pieces(["mixed case"])


@pytest.mark.parametrize("kind, size, message", [
    ("bpe", 5, r"vocab_size: expected at least 260 for the bpe tokenizer \(its 256-byte alphabet and 4 special "
               r"tokens\), got 5"),
    ("wordpiece", 5, r"vocab_size: expected at least \d+ for the wordpiece tokenizer on this data .* got 5"),
    ("unigram", 5, r"vocab_size: expected room for every character of the data .* unigram tokenizer, got 5"),
])
def test_a_vocabulary_smaller_than_the_alphabet_is_refused_not_enlarged(kind, size, message):
    """The trainers would make one as large as their alphabet, silently (bpe: 260 for 5)."""
    with pytest.raises(ValueError, match=message):
        train_tokenizer(iter(["the cat sat on the mat", "a dog ran"]), kind, size)

