"""tformer.kinds: each kind's verb (predict, generate, embed) refuses a bad batch_size in one line
naming it, as the command line's --batch-size does, instead of a bare range() error or,
for generate, an empty answer."""

import pytest
from helpers import SpyBackend
from text_fixtures import classification_rows, embedding_rows, seq2seq_rows

import tformer

TINY = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, vocab_size=300, max_tokens=256, threads=1,
            eval_every=2, steps=2, progress=False, log=lambda *a: None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {
        "predict": tformer.train(data=classification_rows(60), out=str(root / "c"), **TINY),
        "generate": tformer.train(data=seq2seq_rows(), out=str(root / "s"), **TINY),
        "embed": tformer.train(data=embedding_rows(), out=str(root / "e"), **TINY),
    }


@pytest.mark.parametrize("verb", ["predict", "generate", "embed"])
@pytest.mark.parametrize("batch_size", [0, -1, 2.5, "4", True, None])
def test_a_bad_batch_size_is_refused_naming_it(runs, verb, batch_size):
    with pytest.raises((ValueError, TypeError), match=r"^batch_size: expected a positive int, got "):
        getattr(runs[verb], verb)(["a cat", "the river"], batch_size=batch_size)


@pytest.mark.parametrize("verb", ["predict", "generate", "embed"])
def test_a_batch_smaller_than_the_inputs_answers_every_input(runs, verb):
    answers = getattr(runs[verb], verb)(["a cat", "the river", "hello"], batch_size=1)
    assert len(answers) == 3


@pytest.mark.parametrize("verb", ["predict", "generate"])
def test_a_long_input_is_counted_only_as_far_as_its_cut_needs(runs, verb, monkeypatch):
    """What a command warns of (Run.truncated) for a 2 MB input: counted from a few kB (a lower
    bound, "N or more"), as the model reads it; short ones counted exactly."""
    from tformer.text.prefix import AtLeast

    run = runs[verb]
    tok = run.tokenizer
    backend = tok.backend
    spy = SpyBackend(backend)
    monkeypatch.setattr(tok, "backend", spy)
    long = "The Cat sat on the mat. " * 90_000
    ((index, count),) = run.truncated([long, "A Cat"])
    monkeypatch.undo()
    assert index == 0 and isinstance(count, AtLeast) and count > tok.max_length and max(spy.seen) < 100_000
    short = "The Cat sat on the mat"  # counted exactly, lowercased as the run's tokenizer does
    text = short.lower() if tok.lowercase else short
    whole = len(backend.encode(text, add_special_tokens=verb == "predict").ids) + (verb == "generate")
    cut = type(tok)(backend, 3, tok.pad_id, tok.lowercase)  # every text past the limit: counted
    monkeypatch.setattr(run.objective.source, "tokenizer", cut)
    assert whole > 3 and run.truncated([short]) == [(0, whole)]
    assert not isinstance(run.truncated([short])[0][1], AtLeast)


@pytest.mark.parametrize("verb", ["predict", "generate"])
def test_an_input_read_only_to_its_reach_is_counted_as_cut(runs, verb, monkeypatch):
    """Run.truncated, what predict and generate warn of: a word of 40,000 characters that a
    WordPiece tokenizer makes one [UNK] (read only to its reach, "hello world" never read) was
    not named, its few tokens under the maximum length. (The runs' byte-level BPE counts every
    space, so its cut is always in sight: BERT's tokenizer stands in.)"""
    from hf_bert_fixtures import bert_dir

    from tformer.text.prefix import Unread
    from tformer.text.tokenizer import load_tokenizer

    bert = load_tokenizer(bert_dir())
    monkeypatch.setattr(runs[verb].objective.source, "tokenizer", bert)
    ((index, count),) = runs[verb].truncated(["a dog", "a" * 40_000 + " hello world", "the cat" + " " * 40_000])
    assert index == 1 and isinstance(count, Unread) and count <= bert.max_length and count.chars == 40_012


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(hf=5), TypeError, r"^hf: expected a folder \(str or os\.PathLike\), got int$"),
    (dict(onnx=b"out"), TypeError, r"^onnx: expected a folder \(str or os\.PathLike\), got bytes$"),
    (dict(hf=""), ValueError, r"^hf: expected a folder, got ''$"),
    (dict(onnx="OUT", opset="18"), ValueError, r"^opset: expected an ONNX opset in 18\.\..+, got '18'$"),
])
def test_export_refuses_a_bad_argument_naming_it_before_writing(runs, tmp_path, monkeypatch, kwargs, error,
                                                                message):
    # A number for a folder was pathlib's bare "expected str, bytes or os.PathLike object".
    monkeypatch.chdir(tmp_path)
    kwargs = {k: "OUT" if v == "OUT" else v for k, v in kwargs.items()}
    with pytest.raises(error, match=message):
        runs["predict"].export(**kwargs)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("kwargs, message", [
    (dict(data=5), r"^data: expected a file path \(str or Path\) or records \(an iterable of dicts\), got int$"),
    (dict(data=[]), r"^data: expected at least one record, got none$"),
    (dict(split="nope"), r"^split: expected one of test, validation \(the run's held-out splits\), got 'nope'$"),
    (dict(split="valid"), r"^split: expected one of test, validation .*got 'valid'$"),
    (dict(split="train"), r"^split: expected one of test, validation .*got 'train'$"),
])
def test_evaluate_refuses_bad_data_or_split_naming_it(runs, kwargs, message):
    # data=5 was "'int' object is not iterable"; data=[] named "texts"; split="valid" said the
    # run's split was empty; "train" scored the training records.
    with pytest.raises(ValueError, match=message):
        runs["predict"].evaluate(**kwargs)


@pytest.mark.parametrize("limit", [0, -1, "a", 2.5])
def test_examples_refuse_a_bad_limit(runs, limit):
    with pytest.raises(ValueError, match=rf"^limit: expected a positive int or None, got {limit!r}$"):
        runs["predict"].examples(limit=limit)
    assert len(runs["predict"].examples(limit=2)) == 2


@pytest.mark.parametrize("pairs, error, message", [
    (5, TypeError, r"^pairs: expected a str or an iterable of str \(or None\), got int$"),
    ([1], TypeError, r"^pairs\[0\]: expected a str or None, got int$"),
    (["x", "y"], ValueError, r"^pairs: expected 1 \(one per text\), got 2$"),
])
def test_predict_refuses_bad_pairs_naming_them(runs, pairs, error, message):
    with pytest.raises(error, match=message):
        runs["predict"].predict(["a cat"], pairs=pairs)


@pytest.mark.parametrize("max_len", ["3", 2.5, True])
def test_generate_refuses_a_max_len_of_another_type_naming_it(runs, max_len):
    # "3" was a bare "'<=' not supported between instances of 'int' and 'str'".
    with pytest.raises(ValueError, match=r"^max_len: expected a positive int, got "):
        runs["generate"].generate("a cat", max_len=max_len)


def test_generate_refuses_a_max_len_past_the_models_positions(runs):
    run = runs["generate"]
    limit = run.model.config.max_len  # as tformer.nn.generate refuses it (one check, search_args)
    with pytest.raises(ValueError, match=rf"^max_len: expected 1\.\.{limit} \(the model's positions\), "
                                         rf"got {limit + 1}$"):
        run.generate("a cat", max_len=limit + 1)


@pytest.mark.parametrize("text, error, message", [
    (5, TypeError, r"^text: expected a str, got int$"),
    (["a", "b"], TypeError, r"^text: expected a str, got list$"),
    (" ", ValueError, r"^text: expected a non-empty text, got ' '$"),
])
def test_attention_input_takes_one_text(runs, text, error, message):
    with pytest.raises(error, match=message):
        runs["predict"].attention_input(text)


@pytest.mark.parametrize("verb", ["predict", "generate", "embed"])
@pytest.mark.parametrize("texts, where", [(["a cat", "a\ud800"], r"\[1\]"), ("b\udcff c", "")])
def test_a_lone_surrogate_is_one_line_naming_the_argument_and_index(runs, verb, texts, where):
    """`run.predict(["a\\ud800"])` (and embed, generate) raised the tokenizer's bare TypeError
    ("TextEncodeInput must be Union[...]"); the command line refuses the same input in one line."""
    name = "inputs" if verb == "generate" else "texts"
    with pytest.raises(ValueError, match=rf"^{name}{where}: expected text UTF-8 can encode, got a lone "
                                         r"surrogate '\\ud[8c][0f]0?[0f]?' at character 2$"):
        getattr(runs[verb], verb)(texts)


def test_a_lone_surrogate_in_a_pair_or_the_tokenizer_is_one_line(runs):
    run = runs["predict"]
    with pytest.raises(ValueError, match=r"^texts\[0\]: expected text UTF-8 can encode, got a lone surrogate"):
        run.tokenizer.encode(["x\udcff"])
    from tformer.text.arguments import pairs_list

    with pytest.raises(ValueError, match=r"^pairs\[1\]: expected text UTF-8 can encode, got a lone surrogate"):
        pairs_list([None, "y\ud800"], 2)
