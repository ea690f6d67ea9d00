"""tformer.runs: each kind's verb (predict, generate, embed) refuses a bad batch_size in one line
naming it, as the command line's --batch-size does, instead of a bare range() error or,
for generate, an empty answer."""

import pytest
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
    seen: list[int] = []
    backend = tok.backend

    class Spy:
        def __getattr__(self, name):
            return getattr(backend, name)

        def encode_batch(self, inputs, *args, **kwargs):
            seen.extend(len(x) if isinstance(x, str) else sum(map(len, x)) for x in inputs)
            return backend.encode_batch(inputs, *args, **kwargs)

        def encode(self, text, *args, **kwargs):
            seen.append(len(text))
            return backend.encode(text, *args, **kwargs)

    monkeypatch.setattr(tok, "backend", Spy())
    long = "The Cat sat on the mat. " * 90_000
    ((index, count),) = run.truncated([long, "A Cat"])
    monkeypatch.undo()
    assert index == 0 and isinstance(count, AtLeast) and count > tok.max_length and max(seen) < 100_000
    short = "The Cat sat on the mat"  # counted exactly, lowercased as the run's tokenizer does
    text = short.lower() if tok.lowercase else short
    whole = len(backend.encode(text, add_special_tokens=verb == "predict").ids) + (verb == "generate")
    cut = type(tok)(backend, 3, tok.pad_id, tok.lowercase)  # every text past the limit: counted
    monkeypatch.setattr(run.objective.source, "tokenizer", cut)
    assert whole > 3 and run.truncated([short]) == [(0, whole)]
    assert not isinstance(run.truncated([short])[0][1], AtLeast)
