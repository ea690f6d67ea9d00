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
