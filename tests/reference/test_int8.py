"""The NumPy int8 mirror (tformer.reference.int8) against tformer.nn.int8.

Both quantize the same weights to the same integers (equal, and the same state-dict keys
besides); a linear's outputs agree to 1e-5 relative when both see the same activations (the
per-token integers can differ only where float rounding lands a value on a half step); whole
quantized encoders agree to 1e-5 relative at every real token (measured 1e-7; an
unquantized mirror differs by 4e-3, so the bar sees the quantization).
"""

import numpy as np
import pytest
import torch
from helpers import copy_weights, padding_mask

from tformer import TransformerConfig
from tformer import reference as ref
from tformer.nn import int8, kernels
from tformer.nn import model as torch_model
from tformer.reference import int8 as ref_int8

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(("k", "m"), [(384, 1152), (1536, 384), (30, 64)])
def test_rotation_matches(k, m):
    np.testing.assert_array_equal(ref_int8.rotation(k, m), int8.rotation(k, m).numpy())


@pytest.mark.parametrize("rotated", [True, False])
def test_int8_linear_matches(rotated):
    theirs = torch.nn.Linear(64, 48)
    ours = ref.module.Linear(64, 48)
    copy_weights(theirs, ours)
    q_theirs = int8.Int8Linear(theirs, bits=8, rotated=rotated)
    q_ours = ref_int8.Int8Linear(ours, bits=8, rotated=rotated)
    np.testing.assert_array_equal(q_ours.weight_int8, q_theirs.weight_int8.numpy())
    np.testing.assert_array_equal(q_ours.weight_scale, q_theirs.weight_scale.numpy())
    x = torch.randn(2, 5, 64)
    with torch.no_grad(), kernels.readable():  # float sums of 8-bit integers on any CPU
        expected = q_theirs(x).numpy()
    got = q_ours(x.numpy())
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("bits", [8, 7])
def test_quantized_encoder_matches(bits):
    """Both bit widths: each leaves its own linears in float (int8.keep_float)."""
    config = TransformerConfig(d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0,
                               max_len=16, vocab_size=30, activation="gelu")
    theirs = torch_model.Encoder(config).eval()
    ours = ref.Encoder(config, np.float32)
    copy_weights(theirs, ours)
    int8.quantize(theirs, bits=bits)
    ref_int8.quantize(ours, bits=bits)
    assert set(ours.state_dict()) == {k for k in theirs.state_dict()}
    ids = np.random.default_rng(0).integers(0, 30, (3, 9))
    mask = padding_mask([9, 4, 6], 9)
    with torch.no_grad(), kernels.readable():
        expected = theirs(torch.from_numpy(ids), torch.from_numpy(mask)).last_hidden_state.numpy()
    got = ours(ids, mask).last_hidden_state
    assert np.abs(got - expected)[mask].max() <= 1e-5 * np.abs(expected).max()
