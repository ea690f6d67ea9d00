import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import GRAD_RTOL, assert_grads_match, copy_weights, relative_error

from tformer import TransformerConfig
from tformer.reference import Encoder
from tformer.reference.module import Dropout, Embedding, LayerNorm, Linear


def test_reference_imports_and_runs_without_torch():
    """Block torch at import time; the reference must not need it."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np\n"
        "from tformer import TransformerConfig\n"
        "from tformer.reference import Encoder\n"
        "enc = Encoder(TransformerConfig(d_model=8, n_heads=2, d_ff=16, n_layers=1, vocab_size=5))\n"
        "print(enc(np.zeros((1, 3), dtype=np.int64)).last_hidden_state.shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(1, 3, 8)"


def test_load_state_dict_names_missing_extra_and_misshapen_keys(tiny_config):
    enc = Encoder(tiny_config)
    state = enc.state_dict()
    bad = dict(state)
    del bad["layers.0.ffn.up.bias"]
    bad["extra.weight"] = np.zeros(1)
    with pytest.raises(ValueError, match=r"missing keys \['layers.0.ffn.up.bias'\]; unexpected keys \['extra.weight'\]"):
        enc.load_state_dict(bad)
    bad = dict(state, **{"tok_emb.weight": np.zeros((3, 3))})
    with pytest.raises(ValueError, match=r"state_dict\['tok_emb.weight'\]: expected shape \(50, 32\), got \(3, 3\)"):
        enc.load_state_dict(bad)


def test_dtype_is_kept(tiny_config):
    enc = Encoder(tiny_config, np.float64)
    assert all(v.dtype == np.float64 for v in enc.state_dict().values())
    enc.load_state_dict({k: v.astype(np.float32) for k, v in enc.state_dict().items()})
    assert all(v.dtype == np.float64 for v in enc.state_dict().values())
    assert TransformerConfig is not None


# Backward ------------------------------------------------------------------------------
# Each leaf against torch autograd on the same weights, float64: the loss is sum(out * g)
# for a fixed random g, so dout = g. Metric (helpers.GRAD_RTOL): per tensor,
# max |ours - torch| / max |torch| <= 1e-9.
def _leaf_case(torch_leaf, ours, x, grad_input=True):
    copy_weights(torch_leaf, ours)
    rng = np.random.default_rng(1)
    tx = torch.from_numpy(x)
    if grad_input:
        tx.requires_grad_(True)
    out = torch_leaf(tx)
    g = rng.standard_normal(out.shape)
    (out * torch.from_numpy(g)).sum().backward()
    y, cache = ours.forward_train(x)
    assert relative_error(y, out) <= GRAD_RTOL
    grads = ours.zero_grads()
    dx = ours.backward(g, cache, grads)
    assert_grads_match(grads, torch_leaf, type(ours).__name__)
    if grad_input:
        assert relative_error(dx, tx.grad) <= GRAD_RTOL


@pytest.mark.parametrize("bias", [True, False])
def test_linear_backward_matches_torch(bias):
    x = np.random.default_rng(0).standard_normal((3, 5, 7))
    _leaf_case(torch.nn.Linear(7, 4, bias=bias).double(), Linear(7, 4, bias).astype(np.float64), x)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_backward_matches_torch(bias):
    torch_norm = torch.nn.LayerNorm(8, bias=bias).double()
    with torch.no_grad():  # not the trivial ones and zeros
        for p in torch_norm.parameters():
            p.normal_()
    x = np.random.default_rng(0).standard_normal((3, 5, 8)) * 3 + 1
    _leaf_case(torch_norm, LayerNorm(8, bias=bias).astype(np.float64), x)


def test_embedding_backward_adds_repeated_ids():
    ids = np.array([[1, 2, 1, 1], [0, 2, 5, 1]])  # repeated ids must add up
    _leaf_case(torch.nn.Embedding(6, 4).double(), Embedding(6, 4).astype(np.float64), ids,
               grad_input=False)


def test_dropout_train_drops_scales_and_backward_uses_the_same_mask():
    drop = Dropout(0.25)
    x = np.ones((200, 100))
    y, keep = drop.forward_train(x, np.random.default_rng(0))
    assert set(np.unique(y)) == {0.0, 1 / 0.75}
    assert abs((y == 0).mean() - 0.25) < 0.01
    np.testing.assert_array_equal(drop.backward(np.full_like(x, 2.0), keep), 2.0 * y)
    assert drop.forward_train(x, None)[0] is x  # no rng: evaluation, the identity


def test_decoder_forward_train_keeps_the_model_dtype_as_forward_does(tiny_config):
    """float64 memory into a float32 Decoder: forward_train computed in float64 (forward cast it)."""
    from tformer.reference import Decoder

    decoder = Decoder(tiny_config.replace(vocab_size=None), np.float32)
    x, memory = np.ones((1, 2, tiny_config.d_model)), np.ones((1, 3, tiny_config.d_model))
    out, cache = decoder.forward_train(x, memory)
    assert out.dtype == decoder(x, memory).last_hidden_state.dtype == np.float32
    dx, dmemory = decoder.backward(np.ones_like(out), cache, decoder.zero_grads())
    assert dx.dtype == dmemory.dtype == np.float32
