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
