"""tformer.text.tokenizer: batching, padding, truncation, and tokenizer.json settings ignored."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hf_bert_fixtures import (
    MAX_POSITIONS,
    PAIR_SENTENCES,
    SENTENCES,
    ST_MAX_SEQ_LENGTH,
    bert_dir,
    copy_dir,
    st_dir,
)

from tformer.text.tokenizer import load_tokenizer


def _hf_tokenizer(directory):
    from transformers import BertTokenizerFast

    return BertTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))


def test_matches_transformers_tokenizer_on_a_padded_batch():
    tok = load_tokenizer(bert_dir())
    ours = tok(SENTENCES)
    theirs = _hf_tokenizer(bert_dir())(
        SENTENCES,
        padding="longest",
        truncation=True,
        max_length=MAX_POSITIONS,
        return_tensors="pt",
    )
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert ours[key].dtype == torch.int64
        assert torch.equal(ours[key], theirs[key]), key


def test_pads_to_the_longest_text_not_to_the_tokenizer_json_length():
    tok = load_tokenizer(bert_dir())
    batch = tok(["a dog", "the cat"], return_tensors="np")
    assert isinstance(batch["input_ids"], np.ndarray)
    # tokenizer.json says pad to 40 and truncate to 8: both ignored.
    assert batch["input_ids"].shape == (2, 4)
    long = " ".join(["cat"] * 20)
    assert tok([long])["input_ids"].shape == (1, 22)


def test_pairs_get_token_type_ids():
    tok = load_tokenizer(bert_dir())
    first, second = zip(*PAIR_SENTENCES, strict=True)
    ours = tok(list(first), list(second))
    theirs = _hf_tokenizer(bert_dir())(list(first), list(second), padding=True, return_tensors="pt")
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(ours[key], theirs[key]), key
    assert ours["token_type_ids"].max() == 1


def test_truncates_to_model_max_positions_with_a_warning():
    tok = load_tokenizer(bert_dir())
    assert tok.max_length == MAX_POSITIONS
    long = " ".join(["cat"] * 100)
    with pytest.warns(UserWarning, match=r"1 of 2 texts .* \(64 tokens; the longest has 102\)"):
        batch = tok([long, "a dog"])
    assert batch["input_ids"].shape == (2, MAX_POSITIONS)
    assert tok.convert_ids_to_tokens(batch["input_ids"][0, [0, -1]]) == ["[CLS]", "[SEP]"]


def test_no_truncation_raises_naming_the_text():
    tok = load_tokenizer(bert_dir())
    long = " ".join(["cat"] * 100)
    with pytest.raises(ValueError, match=r"texts\[1\]: expected at most 64 tokens .* got 102"):
        tok(["a dog", long], truncation=False)


def test_a_text_read_only_to_its_reach_warns_or_is_refused():
    """A text read only to its reach with more than whitespace after it (an "a" word of 40,000
    characters: one [UNK], then "hello world") came back as [CLS] [UNK] [SEP]: the rest was
    dropped without a warning, and truncation=False took it. Now it warns as a cut, saying how
    far it was read (not a token count it does not know), or is refused in one line."""
    tok = load_tokenizer(bert_dir())
    text = "a" * 40_000 + " hello world"
    with pytest.warns(UserWarning) as caught:
        batch = tok([text, "a dog"])
    assert str(caught[0].message) == (
        "1 of 2 texts were read only to their first 16,384 characters (of 40,012 in the longest: "
        "tokenizing stops there when no cut to 64 tokens is in sight), so they were truncated "
        "(truncation=False / --no-truncate raises instead)")
    assert tok.convert_ids_to_tokens(batch["input_ids"][0, :3]) == ["[CLS]", "[UNK]", "[SEP]"]
    with pytest.raises(ValueError, match=r"^texts\[1\]: read only to its first 16,384 characters of 40,012 "
                                         r"\(tokenizing stops there when no cut to 64 tokens is in sight\), so "
                                         r"the rest would be lost; shorten it or allow truncation$"):
        tok(["a dog", text], truncation=False)
    with pytest.raises(ValueError, match=r"^texts\[0\]: its pair read only to its first 16,384 characters"):
        tok(["a dog"], [text], truncation=False)
    long = " ".join(["cat"] * 100)
    with pytest.warns(UserWarning, match=r"^2 of 3 texts are longer than the model's maximum length \(64 "
                                         r"tokens; the longest has 102\) or were read only to their first "
                                         r"16,384 characters \(1 of them, of 40,012 in the longest"):
        tok([text, "a dog", long])
    with warnings.catch_warnings():  # only whitespace past the reach: nothing lost
        warnings.simplefilter("error")
        tok(["the cat" + " " * 40_000], truncation=False)


def test_short_texts_do_not_warn():
    tok = load_tokenizer(bert_dir())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok(SENTENCES)


def test_sentence_transformers_max_seq_length_wins_when_smaller():
    tok = load_tokenizer(st_dir())
    assert tok.max_length == ST_MAX_SEQ_LENGTH
    with pytest.warns(UserWarning):
        assert tok([" ".join(["cat"] * 30)])["input_ids"].shape == (1, ST_MAX_SEQ_LENGTH)


def test_max_length_argument_lowers_never_raises(tmp_path):
    assert load_tokenizer(bert_dir(), max_length=10).max_length == 10
    with pytest.raises(ValueError, match=r"max_length: expected at most 64 .* got 100"):
        load_tokenizer(bert_dir(), max_length=100)


def test_vocab_txt_only(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    (d / "tokenizer.json").unlink()
    ours = load_tokenizer(d)(SENTENCES)
    ref = load_tokenizer(bert_dir())(SENTENCES)
    assert torch.equal(ours["input_ids"], ref["input_ids"])
    assert load_tokenizer(d)(["The CAT"])["input_ids"].tolist() == [[2, 5, 8, 3]]


def test_missing_tokenizer_names_the_file(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    (d / "tokenizer.json").unlink()
    (d / "vocab.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json: no such file \(nor vocab\.txt\)"):
        load_tokenizer(d)


def test_bad_inputs():
    tok = load_tokenizer(bert_dir())
    with pytest.raises(ValueError, match="texts: expected at least one text"):
        tok([])
    with pytest.raises(TypeError, match=r"texts\[1\]: expected a str, got int"):
        tok(["a", 3])
    with pytest.raises(ValueError, match="return_tensors: expected 'pt' or 'np'"):
        tok(["a"], return_tensors="tf")
    assert tok("a dog")["input_ids"].shape == (1, 4)  # one string = a batch of one


def test_corrupt_config_json_names_the_file(tmp_path):
    d = copy_dir(bert_dir(), tmp_path / "m")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON"):
        load_tokenizer(d)


def test_token_text_is_the_decoded_piece_for_every_scheme():
    """What attention pictures label tokens with: "the", not byte-level BPE's "Ġthe"."""
    from tformer.training.subwords import run_tokenizer, train_tokenizer

    texts = ["the cat sat on the mat", "café naïve Straße 東京 running two"] * 30
    for scheme in ("bpe", "wordpiece", "unigram"):
        tok = run_tokenizer(train_tokenizer(texts, scheme, 300), 64)
        shown = [tok.token_text(i) for i in tok.backend.encode("the cat sat").ids]
        assert shown[0] == "<s>" and shown[-1] == "</s>", (scheme, shown)
        assert "the" in shown or scheme == "unigram", (scheme, shown)  # (unigram: "t", "h", "e" here)
        assert not any(t.startswith(("Ġ", "▁")) or not t.strip() for t in shown), (scheme, shown)
        if scheme == "bpe":  # (byte-level: any character; the others' vocabularies have no line break)
            assert "⏎" in [tok.token_text(i) for i in tok.backend.encode("a\nb").ids], scheme
    tok = run_tokenizer(train_tokenizer(texts, "bpe", 260), 64)  # too small to merge 東's bytes
    pieces = [tok.token_text(i) for i in tok.backend.encode("東").ids[1:-1]]
    assert "".join(pieces).startswith("<e6") and all(p.startswith("<") for p in pieces), pieces


def test_a_max_length_the_special_tokens_fill_is_refused():
    """[CLS] and [SEP] take 2 of max_length: 2 or less would keep no token of any text (and the
    backend silently kept them all past max_length, reaching the model's positions)."""
    with pytest.raises(ValueError, match=r"max_length: expected more than the 2 special tokens each "
                                         r"text gets \(at least 3\), got 2"):
        load_tokenizer(bert_dir(), max_length=2)
    assert len(load_tokenizer(bert_dir(), max_length=3).encode(["a cat sat"])[0].ids) == 3


@pytest.mark.parametrize("max_length", [0, 1, -3])
def test_every_max_length_too_short_names_the_same_floor(max_length):
    """1 said "expected an int >= 2" and 2 "at least 3": one floor, the special tokens' + 1."""
    with pytest.raises(ValueError, match=rf"\(at least 3\), got {max_length}$"):
        load_tokenizer(bert_dir(), max_length=max_length)


@pytest.mark.parametrize("texts, got", [(5, "int"), (b"a text", "bytes"), (None, "NoneType")])
def test_texts_that_are_not_str_are_refused_naming_the_argument(texts, got):
    # tok(5) said "'int' object is not iterable"; tok(b"..") "texts[0]: expected a str, got int".
    tok = load_tokenizer(bert_dir())
    with pytest.raises(TypeError, match=rf"^texts: expected a str or an iterable of str, got {got}$"):
        tok(texts)


@pytest.mark.parametrize("pairs, error, message", [
    (5, TypeError, r"^pairs: expected a str or an iterable of str \(or None\), got int$"),  # "has no len()"
    ([5], TypeError, r"^pairs\[0\]: expected a str or None, got int$"),
    (["a", "b"], ValueError, r"^pairs: expected 1 \(one per text\), got 2$"),
])
def test_bad_pairs_are_named(pairs, error, message):
    with pytest.raises(error, match=message):
        load_tokenizer(bert_dir()).encode(["a dog"], pairs=pairs)


def test_bad_token_ids_are_named():
    tok = load_tokenizer(bert_dir())
    ids = tok.encode(["a dog"])[0].ids
    assert tok.decode(np.array(ids)) == tok.decode(torch.tensor(ids)) == tok.decode(ids) == "a dog"
    for call, name in ((tok.decode, "ids"), (tok.convert_ids_to_tokens, "ids")):
        with pytest.raises(ValueError, match=rf"^{name}\[1\]: expected a token id in \[0, {tok.vocab_size}\), "
                                             r"got -1$"):
            call([5, -1])  # OverflowError: number too small to fit in target type
        with pytest.raises(TypeError, match=rf"^{name}\[0\]: expected an int token id, got str$"):
            call(["a"])
        with pytest.raises(TypeError, match=rf"^{name}: expected a sequence of token ids \(ints\), got int$"):
            call(5)  # 'int' object is not iterable
    with pytest.raises(ValueError, match=r"^token_id: expected a token id in \[0, \d+\), got -1$"):
        tok.token_text(-1)
