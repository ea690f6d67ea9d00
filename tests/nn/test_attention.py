"""Attention against PyTorch's own: F.scaled_dot_product_attention and nn.MultiheadAttention."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close

from tformer.nn.attention import MultiHeadAttention, scaled_dot_product_attention


@pytest.mark.parametrize("need_weights", [False, True])
def test_sdpa_matches_torch(need_weights):
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)
    mask = torch.rand(2, 1, 5, 7) < 0.7
    mask[..., 0] = True  # every query keeps a key: torch's own output is then defined
    out, weights = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), what="output")
    if need_weights:
        assert_close(weights.sum(-1), torch.ones(2, 3, 5), what="rows sum to 1")


def test_self_attention_matches_nn_multihead_attention():
    d, h = 16, 4
    theirs = torch.nn.MultiheadAttention(d, h, batch_first=True).eval()
    ours = MultiHeadAttention(d, h).eval()
    ours.qkv_proj.weight.data.copy_(theirs.in_proj_weight)  # [q; k; v] stacked
    ours.qkv_proj.bias.data.copy_(theirs.in_proj_bias)
    ours.out_proj.load_state_dict(theirs.out_proj.state_dict())
    x = torch.randn(2, 6, d)
    kpm = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    with torch.no_grad():
        expected, expected_w = theirs(x, x, x, key_padding_mask=kpm, average_attn_weights=False)
        out = ours(x, mask=~kpm[:, None, None, :], need_weights=True)
    assert_close(out.output, expected, what="output")
    assert_close(out.weights, expected_w, what="weights")


def test_cross_attention_matches_nn_multihead_attention():
    d, h = 16, 2
    theirs = torch.nn.MultiheadAttention(d, h, batch_first=True).eval()
    ours = MultiHeadAttention(d, h, cross=True).eval()
    ours.q_proj.weight.data.copy_(theirs.in_proj_weight[:d])
    ours.q_proj.bias.data.copy_(theirs.in_proj_bias[:d])
    ours.kv_proj.weight.data.copy_(theirs.in_proj_weight[d:])
    ours.kv_proj.bias.data.copy_(theirs.in_proj_bias[d:])
    ours.out_proj.load_state_dict(theirs.out_proj.state_dict())
    x, memory = torch.randn(2, 3, d), torch.randn(2, 5, d)
    with torch.no_grad():
        expected, _ = theirs(x, memory, memory)
        out = ours(x, memory).output
    assert_close(out, expected, what="output")


def test_d_model_must_divide_into_heads():
    with pytest.raises(ValueError, match=r"d_model: expected a multiple of n_heads \(3\), got 16"):
        MultiHeadAttention(16, 3)


def test_fused_and_readable_paths_agree_on_gradients():
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5) < 0.6
    grads = []
    for need_weights in (False, True):
        out, _ = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    for a, b in zip(*grads, strict=True):
        assert_close(a, b, np.float64, what="gradient")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("need_weights", [False, True])
def test_a_memory_row_shared_by_its_beams_equals_the_memory_repeated(dtype, need_weights):
    """Beam search's beams of one source attend to its one memory row (g = 3 query rows per
    memory row, as one group of queries): the same outputs, weights and cache as attending to
    the memory repeated for each beam; cached steps too."""
    d, h, g = 16, 4, 3
    mha = MultiHeadAttention(d, h, cross=True).to(dtype).eval()
    x, memory = torch.randn(2 * g, 2, d, dtype=dtype), torch.randn(2, 5, d, dtype=dtype)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]  # (Bm, 1, 1, S)
    with torch.no_grad():
        shared = mha(x, memory, mask=mask, use_cache=True, need_weights=need_weights)
        repeated = mha(x, memory.repeat_interleave(g, 0), mask=mask.repeat_interleave(g, 0),
                       use_cache=True, need_weights=need_weights)
        cached = mha(x, None, mask=mask, past_key_value=shared.present)
    dt = np.float32 if dtype == torch.float32 else np.float64
    assert_close(shared.output, repeated.output, dt, what="output")
    assert_close(cached.output, repeated.output, dt, what="output from the cached memory")
    assert shared.present[0].shape == (2, h, 5, d // h)  # one row per source, not per beam
    assert_close(shared.present[0].repeat_interleave(g, 0), repeated.present[0], dt, what="keys")
    if need_weights:
        assert_close(shared.weights, repeated.weights, dt, what="weights")
    with pytest.raises(ValueError, match=r"memory: expected a batch that divides the query batch "
                                         r"\(6\), got 4"):
        mha(x, torch.randn(4, 5, d, dtype=dtype))
