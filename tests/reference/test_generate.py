"""NumPy greedy search against tformer.nn.generate's, on the same weights (float64)."""

import numpy as np
import pytest
import torch
from helpers import copy_weights, padding_mask

from tformer import TransformerConfig
from tformer.nn.generate import greedy_search as torch_greedy
from tformer.nn.model import Seq2SeqTransformer as TorchSeq2Seq
from tformer.reference.generate import greedy_search
from tformer.reference.model import Seq2SeqTransformer

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
