"""Backward of the NumPy encoder and decoder layers against torch autograd.

float64; per tensor max |ours - torch| / max |torch| <= 1e-9 (helpers.GRAD_RTOL), for
every parameter and for the inputs, post- and pre-norm, with padding and a query row
that may attend to nothing.
"""

import numpy as np
import pytest
import torch
from helpers import GRAD_RTOL, assert_grads_match, copy_weights, padding_mask, relative_error

from tformer import TransformerConfig
from tformer.nn.layers import DecoderLayer as TorchDecoderLayer
from tformer.nn.layers import EncoderLayer as TorchEncoderLayer
from tformer.reference.layers import DecoderLayer, EncoderLayer
from tformer.reference.masks import make_mask

# Small tensors: one torch thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")

B, S, T = 3, 6, 5


def _config(norm_first, activation="relu"):
    return TransformerConfig(d_model=16, n_heads=4, d_ff=32, n_layers=1, dropout=0.1,
                             norm_first=norm_first, activation=activation)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_backward_matches_torch(norm_first, activation):
    config, rng = _config(norm_first, activation), np.random.default_rng(0)
    torch_layer = TorchEncoderLayer(config).double().eval()
    ours = EncoderLayer(config).astype(np.float64)
    copy_weights(torch_layer, ours)
    x = rng.standard_normal((B, S, 16))
    mask = make_mask(padding_mask([S, 3, 0], S), None, B, S, S)  # row 2: all padding
    tx = torch.from_numpy(x).requires_grad_()
    out, _ = torch_layer(tx, torch.from_numpy(mask.allowed))
    g = rng.standard_normal(out.shape)
    (out * torch.from_numpy(g)).sum().backward()
    y, _, cache = ours.forward_train(x, mask)
    assert relative_error(y, out) <= GRAD_RTOL
    grads = ours.zero_grads()
    dx = ours.backward(g, cache, grads)
    assert_grads_match(grads, torch_layer, "EncoderLayer")
    assert np.isfinite(dx).all() and relative_error(dx, tx.grad) <= GRAD_RTOL


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_backward_matches_torch(norm_first):
    config, rng = _config(norm_first), np.random.default_rng(0)
    torch_layer = TorchDecoderLayer(config).double().eval()
    ours = DecoderLayer(config).astype(np.float64)
    copy_weights(torch_layer, ours)
    x, memory = rng.standard_normal((B, T, 16)), rng.standard_normal((B, S, 16))
    self_mask = make_mask(padding_mask([T, 2, 4], T), None, B, T, T, causal=True)
    memory_mask = make_mask(padding_mask([S, 3, 0], S), None, B, T, S)  # row 2: empty
    tx, tm = torch.from_numpy(x).requires_grad_(), torch.from_numpy(memory).requires_grad_()
    out = torch_layer(tx, tm, torch.from_numpy(self_mask.allowed), torch.from_numpy(memory_mask.allowed)).hidden
    g = rng.standard_normal(out.shape)
    (out * torch.from_numpy(g)).sum().backward()
    y, cache = ours.forward_train(x, memory, self_mask, memory_mask)
    assert relative_error(y, out) <= GRAD_RTOL
    grads = ours.zero_grads()
    dx, dmemory = ours.backward(g, cache, grads)
    assert_grads_match(grads, torch_layer, "DecoderLayer")
    assert relative_error(dx, tx.grad) <= GRAD_RTOL
    assert relative_error(dmemory, tm.grad) <= GRAD_RTOL
