"""tformer.nn.dropout: the distribution of its draws, its gradient, its replay, and the NumPy mirror's."""

import math

import numpy as np
import pytest
import torch

from tformer.nn.dropout import LEVELS, Dropout, drop_threshold, dropout, keep_mask
from tformer.reference.module import keep_scaled

N = 1 << 22  # 4 M draws: a frequency's standard error is below 2.5e-4


def _within(count: float, n: int, prob: float, what: str, sigmas: float = 5.0) -> None:
    """count / n is prob within `sigmas` binomial standard errors."""
    se = math.sqrt(prob * (1 - prob) / n)
    assert abs(count / n - prob) <= sigmas * se, f"{what}: {count / n:.6f} vs {prob:.6f} (se {se:.1e})"


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1 / 3])
def test_each_element_is_kept_with_probability_one_minus_p(p):
    torch.manual_seed(0)
    keep, scale = keep_mask((N,), p)
    kept = 1 - drop_threshold(p) / LEVELS  # p rounded to a multiple of 2^-16
    assert abs(kept - (1 - p)) <= 0.5 / LEVELS
    _within(float(keep.sum()), N, kept, f"kept fraction at p={p}")
    assert scale == pytest.approx(1 / kept, rel=1e-15)


def test_the_four_draws_of_one_word_are_independent():
    """Each 64-bit word gives four elements: every lane keeps at 1 - p, and every pair of lanes
    drops together at p^2, as independent draws do."""
    torch.manual_seed(0)
    p = 0.25
    dropped = ~keep_mask((N,), p)[0].view(-1, 4)  # (words, lanes)
    words = dropped.size(0)
    for lane in range(4):
        _within(float(dropped[:, lane].sum()), words, p, f"lane {lane}")
    for a in range(4):
        for b in range(a + 1, 4):
            _within(float((dropped[:, a] & dropped[:, b]).sum()), words, p * p, f"lanes {a}, {b}")
    # and neighbouring words do not repeat each other
    _within(float((dropped[1:, 0] & dropped[:-1, 0]).sum()), words - 1, p * p, "consecutive words")


def test_the_expectation_is_the_input():
    """Inverted dropout: kept values are scaled by 1 / (1 - p), so the mean of dropout(1) is 1."""
    torch.manual_seed(0)
    out = dropout(torch.ones(N), 0.1)
    kept = 1 - drop_threshold(0.1) / LEVELS
    values = torch.unique(out)
    assert values.tolist() == [0.0, pytest.approx(1 / kept, rel=1e-7)]
    se = math.sqrt((1 - kept) / kept / N)  # standard error of the mean of 0 or 1/kept
    assert abs(float(out.double().mean()) - 1.0) <= 5 * se


def test_gradient_matches_autograd_finite_differences():
    """torch.autograd.gradcheck (float64): the backward is dy * mask * scale for the same draws."""
    x = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)

    def f(x):
        torch.manual_seed(3)  # gradcheck calls f many times: the same draws each time
        return dropout(x, 0.3)

    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-8)
    out = f(x)
    (dx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    expected = (out != 0).double() / (1 - drop_threshold(0.3) / LEVELS)
    assert torch.equal(dx, expected)


def test_draws_replay_from_the_global_seed():
    x = torch.randn(64, 33)
    torch.manual_seed(7)
    a = dropout(x, 0.2)
    state = torch.get_rng_state()
    b_next = dropout(x, 0.2)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.2), a)
    torch.set_rng_state(state)
    assert torch.equal(dropout(x, 0.2), b_next)
    assert not torch.equal(a, b_next)


def test_identity_in_evaluation_and_at_zero_zeros_at_one():
    x = torch.randn(4, 5)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    layer = Dropout(0.5).eval()
    assert layer(x) is x
    assert layer.state_dict() == {} and repr(layer) == "Dropout(p=0.5)"
    with pytest.raises(ValueError, match=r"dropout probability: expected 0 <= p <= 1, got 1.5"):
        Dropout(1.5)


def test_dtype_and_shape_are_kept():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5).to(torch.bfloat16)
    out = dropout(x, 0.5)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert set(torch.unique(out / x).float().tolist()) <= {0.0, 2.0}


def test_bf16_survivors_are_scaled_in_fp32_and_rounded_once():
    """1 / 0.9 in bf16 is 1.109375 (0.16% low): survivors are x * (1 / (1 - p)) computed in fp32
    and rounded to bf16 once, as F.dropout rounds them."""
    torch.manual_seed(0)
    x = torch.randn(4096).to(torch.bfloat16)
    out = dropout(x, 0.1)
    kept = out != 0
    scale = LEVELS / (LEVELS - drop_threshold(0.1))
    assert torch.equal(out[kept], (x[kept].float() * scale).to(torch.bfloat16))


def test_the_numpy_mirror_draws_the_same_distribution():
    """reference.module.keep_scaled: the same rounding of p, the same scale, keep rate 1 - p."""
    rng = np.random.default_rng(0)
    keep = keep_scaled((N,), 0.1, rng)
    kept = 1 - drop_threshold(0.1) / LEVELS
    assert sorted(np.unique(keep).tolist()) == [0.0, pytest.approx(1 / kept, rel=1e-15)]
    _within(float((keep > 0).sum()), N, kept, "mirror's kept fraction")
