import math

import numpy as np
import pytest
import torch
from helpers import GRAD_RTOL, assert_close, assert_grads_match, copy_weights, relative_error

from tformer.nn.feedforward import FeedForward as TorchFeedForward
from tformer.reference.feedforward import ACTIVATION_GRADS, FeedForward, erf, gelu, gelu_tanh


def test_erf_matches_math_erf():
    x = np.linspace(-12, 12, 200_001)
    expected = np.array([math.erf(v) for v in x])
    assert np.abs(erf(x) - expected).max() <= 1e-15


def test_erf_keeps_float32():
    assert erf(np.ones(3, np.float32)).dtype == np.float32


def test_gelus_match_torch():
    x = np.linspace(-8, 8, 10_001)
    t = torch.from_numpy(x)
    assert_close(gelu(x), torch.nn.functional.gelu(t), np.float64, what="gelu")
    assert_close(gelu_tanh(x), torch.nn.functional.gelu(t, approximate="tanh"), np.float64,
                 what="gelu_tanh")


# Backward: float64 against torch autograd; per tensor max |ours - torch| / max |torch| <= 1e-9.
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_activation_derivatives_match_torch(activation):
    x = np.linspace(-8, 8, 10_001)
    t = torch.from_numpy(x).requires_grad_()
    fn = {"relu": torch.relu, "gelu": torch.nn.functional.gelu,
          "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}[activation]
    fn(t).sum().backward()
    assert relative_error(ACTIVATION_GRADS[activation](x), t.grad) <= GRAD_RTOL


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [True, False])
def test_feedforward_backward_matches_torch(activation, bias):
    rng = np.random.default_rng(0)
    torch_ffn = TorchFeedForward(8, 16, activation, bias).double()
    ours = FeedForward(8, 16, activation, bias).astype(np.float64)
    copy_weights(torch_ffn, ours)
    x = rng.standard_normal((2, 5, 8))
    tx = torch.from_numpy(x).requires_grad_()
    out = torch_ffn(tx)
    g = rng.standard_normal(out.shape)
    (out * torch.from_numpy(g)).sum().backward()
    y, cache = ours.forward_train(x)
    assert relative_error(y, out) <= GRAD_RTOL
    grads = ours.zero_grads()
    dx = ours.backward(g, cache, grads)
    assert_grads_match(grads, torch_ffn, activation)
    assert relative_error(dx, tx.grad) <= GRAD_RTOL
