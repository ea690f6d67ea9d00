"""NumPy greedy and beam search against tformer.nn.generate's, on the same weights (float64)."""

import re

import numpy as np
import pytest
import torch
from helpers import briefly_trained_reverse, copy_weights, padding_mask

from tformer import TransformerConfig
from tformer.nn.generate import beam_search as torch_beam
from tformer.nn.generate import greedy_search as torch_greedy
from tformer.nn.model import Seq2SeqTransformer as TorchSeq2Seq
from tformer.reference.generate import beam_search, generate, greedy_search
from tformer.reference.model import Seq2SeqTransformer
from tformer.training.tasks import EOS

# Small tensors: one torch thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")


def test_greedy_search_matches_torch():
    config = TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, vocab_size=12,
                               max_len=32)
    torch.manual_seed(0)
    theirs = TorchSeq2Seq(config).double().eval()
    ours = Seq2SeqTransformer(config, np.float64)
    copy_weights(theirs, ours)
    rng = np.random.default_rng(0)
    src, mask = rng.integers(3, 12, (4, 6)), padding_mask([6, 3, 5, 1], 6)
    expected = torch_greedy(theirs, torch.from_numpy(src), torch.from_numpy(mask), max_len=10)
    got = greedy_search(ours, src, mask, max_len=10)
    np.testing.assert_array_equal(got.sequences, expected.sequences.numpy())
    assert got.tolist() == expected.tolist()
    np.testing.assert_allclose(got.scores, expected.scores.numpy(), rtol=1e-5)


@pytest.mark.parametrize("max_len", [0, -1, 2.5, True])
def test_greedy_search_refuses_a_max_len_as_torch_does(max_len):
    """max_len 0 returned empty sequences without a word (torch's refuses it)."""
    config = TransformerConfig(d_model=8, n_heads=2, d_ff=16, n_layers=1, vocab_size=12)
    src = np.ones((2, 3), dtype=np.int64)
    for search, model, ids in ((greedy_search, Seq2SeqTransformer(config), src),
                               (torch_greedy, TorchSeq2Seq(config).eval(), torch.from_numpy(src))):
        with pytest.raises(ValueError, match=rf"^max_len: expected a positive int, got {max_len!r}$"):
            search(model, ids, max_len=max_len)


def _models(config, seed):
    torch.manual_seed(seed)
    theirs = TorchSeq2Seq(config).double().eval()
    ours = Seq2SeqTransformer(config, np.float64)
    copy_weights(theirs, ours)
    return theirs, ours


@pytest.fixture(scope="module")
def trained(one_thread):
    """A briefly trained reverse model (tests/helpers.py) in both engines, in float64, and six
    padded sources: its outputs stop (EOS) at different steps per source."""
    theirs, batch = briefly_trained_reverse()
    theirs = theirs.double()
    ours = Seq2SeqTransformer(theirs.config, np.float64)
    copy_weights(theirs, ours)
    return theirs, ours, batch.src.numpy(), batch.src_mask.numpy()


@pytest.mark.parametrize("beam_size, length_penalty", [(2, 1.0), (4, 1.0), (4, 0.0), (5, 0.6), (3, 2.0)])
def test_beam_search_matches_torch(trained, beam_size, length_penalty):
    """The readable search (one source at a time, every one of the K * V candidates ranked)
    returns torch's batched search's hypotheses: same tokens, same sequence length, scores to
    float64 rounding."""
    theirs, ours, src, mask = trained
    expected = torch_beam(theirs, torch.from_numpy(src), torch.from_numpy(mask),
                          beam_size=beam_size, max_len=14, length_penalty=length_penalty)
    got = beam_search(ours, src, mask, beam_size=beam_size, max_len=14,
                      length_penalty=length_penalty)
    np.testing.assert_array_equal(got.sequences, expected.sequences.numpy())
    assert got.tolist() == expected.tolist()
    np.testing.assert_allclose(got.scores, expected.scores.numpy(), rtol=1e-12, atol=1e-12)
    # The comparison means something: outputs of several lengths, some ended by EOS and some
    # cut at max_len, and not greedy's everywhere.
    rows = got.tolist()
    assert len({len(row) for row in rows}) >= 3
    assert any(row[-1] == EOS for row in rows) and any(row[-1] != EOS for row in rows)
    assert rows != greedy_search(ours, src, mask, max_len=14).tolist()


@pytest.mark.parametrize("beam_size", [2, 4])
def test_early_stopping_matches_torch(trained, beam_size):
    """early_stopping=True (a source also stops once K hypotheses have finished): the same
    hypotheses as torch's batched search under that rule."""
    theirs, ours, src, mask = trained
    expected = torch_beam(theirs, torch.from_numpy(src), torch.from_numpy(mask), beam_size=beam_size,
                          max_len=14, early_stopping=True)
    got = generate(ours, src, mask, beam_size=beam_size, max_len=14, early_stopping=True)
    assert got.tolist() == expected.tolist()
    np.testing.assert_allclose(got.scores, expected.scores.numpy(), rtol=1e-12, atol=1e-12)


def test_beam_search_of_one_beam_is_greedy(trained):
    _, ours, src, mask = trained
    greedy = greedy_search(ours, src, mask, max_len=14)
    beam = beam_search(ours, src, mask, beam_size=1, max_len=14, length_penalty=0.0)
    assert beam.tolist() == greedy.tolist()
    np.testing.assert_allclose(beam.scores, greedy.scores, rtol=1e-12)
    assert generate(ours, src, mask, max_len=14).tolist() == greedy.tolist()
    assert generate(ours, src, mask, beam_size=3, max_len=14).tolist() == \
        beam_search(ours, src, mask, beam_size=3, max_len=14).tolist()
    with pytest.raises(ValueError, match="^length_penalty: expected a number"):
        generate(ours, src, mask, max_len=14, length_penalty=float("nan"))  # greedy: still refused


@pytest.mark.parametrize("kwargs, message", [
    (dict(beam_size=0), "beam_size: expected a positive int, got 0"),
    (dict(beam_size=2.0), "beam_size: expected a positive int, got 2.0"),
    (dict(length_penalty="1"), "length_penalty: expected a number"),
    (dict(length_penalty=1e6), "length_penalty: expected a number"),
    (dict(max_len=0), "max_len: expected a positive int, got 0"),
])
def test_beam_search_refuses_arguments_as_torch_does(kwargs, message):
    config = TransformerConfig(d_model=8, n_heads=2, d_ff=16, n_layers=1, vocab_size=12)
    src = np.ones((2, 3), dtype=np.int64)
    for search, model, ids in ((beam_search, Seq2SeqTransformer(config), src),
                               (torch_beam, TorchSeq2Seq(config).eval(), torch.from_numpy(src))):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
            search(model, ids, **kwargs)


def test_a_mask_of_another_shape_is_refused_as_torch_does():
    config = TransformerConfig(d_model=8, n_heads=2, d_ff=16, n_layers=1, vocab_size=12)
    src, mask = np.ones((2, 3), dtype=np.int64), np.ones((2, 4), dtype=bool)
    message = "src_attention_mask: expected shape (B, S) = (2, 3), got (2, 4)"
    for search in (greedy_search, beam_search):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            search(Seq2SeqTransformer(config), src, mask)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        torch_beam(TorchSeq2Seq(config).eval(), torch.from_numpy(src), torch.from_numpy(mask))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(max_len=9), ValueError, r"max_len: expected 1..8 (the model's positions), got 9"),
    (dict(bos_id=12), ValueError, "bos_id: expected a token id in [0, 12) (the target vocabulary), got 12"),
])
def test_a_search_refuses_what_the_model_cannot_take_as_torch_does(kwargs, error, message):
    config = TransformerConfig(d_model=8, n_heads=2, d_ff=16, n_layers=1, vocab_size=12, max_len=8)
    src = np.ones((2, 3), dtype=np.int64)
    for search, model, ids in ((greedy_search, Seq2SeqTransformer(config), src),
                               (beam_search, Seq2SeqTransformer(config), src),
                               (torch_greedy, TorchSeq2Seq(config).eval(), torch.from_numpy(src))):
        with pytest.raises(error, match=f"^{re.escape(message)}$"):
            search(model, ids, **kwargs)
    # Without max_len: 64, at most the model's 8 positions (the reference's table has no more).
    assert greedy_search(Seq2SeqTransformer(config), src, eos_id=-1).sequences.shape == (2, 8)


def test_a_search_refuses_an_encoder_as_torch_does():
    from tformer.nn.model import Encoder as TorchEncoder
    from tformer.reference.model import Encoder

    config = TransformerConfig(d_model=8, n_heads=2, d_ff=16, n_layers=1, vocab_size=12, max_len=8)
    src = np.ones((2, 3), dtype=np.int64)
    for search, model, ids in ((greedy_search, Encoder(config), src), (beam_search, Encoder(config), src),
                               (torch_greedy, TorchEncoder(config), torch.from_numpy(src))):
        with pytest.raises(TypeError, match=r"^model: expected a Seq2SeqTransformer \(an encoder-decoder\), "
                                            r"got Encoder$"):
            search(model, ids)
