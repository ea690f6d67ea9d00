import math

import numpy as np
import torch
from helpers import assert_close

from tformer.reference.feedforward import erf, gelu, gelu_tanh


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
