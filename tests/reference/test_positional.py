"""Backward of the learned positional table (the sinusoids have no parameters)."""

import numpy as np
import pytest
import torch
from helpers import GRAD_RTOL, assert_grads_match, copy_weights

from tformer.nn.positional import LearnedPositionalEmbedding as TorchLearned
from tformer.reference.positional import LearnedPositionalEmbedding

# Small tensors: one torch thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")


def test_learned_positions_backward_matches_torch_at_an_offset():
    theirs = TorchLearned(10, 4).double()
    ours = LearnedPositionalEmbedding(10, 4)
    ours.weight = ours.weight.astype(np.float64)
    copy_weights(theirs, ours)
    x = torch.zeros(3, 5, 4, dtype=torch.float64)
    g = np.random.default_rng(0).standard_normal((3, 5, 4))
    out = x + theirs(5, offset=2)  # (S, D) broadcast over the batch, as the encoder adds it
    (out * torch.from_numpy(g)).sum().backward()
    grads = ours.zero_grads()
    ours.backward(g, 2, grads)  # rows 2..6, each summed over the batch
    assert assert_grads_match(grads, theirs, "LearnedPositionalEmbedding") <= GRAD_RTOL
    assert (grads["weight"][:2] == 0).all() and (grads["weight"][7:] == 0).all()

