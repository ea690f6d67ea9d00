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


# Errors ------------------------------------------------------------------------------------
_QKV = {"q": (2, 4, 3, 8), "k": (2, 4, 5, 8), "v": (2, 4, 5, 8)}
_BAD_QKV = [
    ({"q": (2, 3, 8)}, None), ({"k": (2, 4, 8)}, None), ({"k": (2, 4, 5, 6)}, None),
    ({"k": (3, 4, 5, 8)}, None), ({"v": (2, 4, 6, 8)}, None), ({"v": (2, 2, 5, 8)}, None),
    ({}, (2, 1, 3, 4)), ({}, (3, 1, 1, 5)), ({}, (2, 4, 3, 5, 1)), ({}, (4, 5)),
]


@pytest.mark.parametrize(("shapes", "mask"), _BAD_QKV)
def test_scaled_dot_product_attention_names_a_bad_shape_as_the_reference_does(shapes, mask):
    """One line naming the argument, the expected and the actual shape, word for word the NumPy
    reference's, not torch's matmul or broadcasting error."""
    from tformer.reference.attention import scaled_dot_product_attention as reference

    arrays = {name: np.zeros(shapes.get(name, shape), dtype=np.float32) for name, shape in _QKV.items()}
    allowed = None if mask is None else np.ones(mask, dtype=bool)
    with pytest.raises(ValueError) as theirs:
        reference(arrays["q"], arrays["k"], arrays["v"], allowed)
    tensors = {name: torch.from_numpy(a) for name, a in arrays.items()}
    with pytest.raises(ValueError) as ours:
        scaled_dot_product_attention(tensors["q"], tensors["k"], tensors["v"],
                                     None if allowed is None else torch.from_numpy(allowed))
    assert str(ours.value) == str(theirs.value)
    assert "\n" not in str(ours.value) and str(ours.value).split(":")[0] in ("q", "k", "v", "mask")


@pytest.mark.parametrize(("cross", "x", "memory", "mask"), [
    *((cross, (2, 3, 16), (2, 5, 32), None) for cross in (False, True)),
    *((cross, (2, 3, 32, 1), (2, 5, 32), None) for cross in (False, True)),
    (True, (2, 3, 32), (2, 5, 8), None), (True, (2, 3, 32), (3, 5, 32), None),
    (False, (2, 3, 32), None, (2, 1, 4, 9)), (True, (2, 3, 32), (2, 5, 32), (2, 1, 3, 9)),
])
def test_multi_head_attention_names_a_bad_input_as_the_reference_does(cross, x, memory, mask):
    from tformer import reference

    ours_mha, theirs_mha = MultiHeadAttention(32, 4, cross=cross), reference.MultiHeadAttention(32, 4, cross=cross)
    arrays = [np.zeros(x, dtype=np.float32), np.zeros(memory, dtype=np.float32) if cross else None,
              None if mask is None else np.ones(mask, dtype=bool)]
    with pytest.raises(ValueError) as theirs:
        theirs_mha(*arrays)
    with pytest.raises(ValueError) as ours:
        ours_mha(*(None if a is None else torch.from_numpy(a) for a in arrays))
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("args, error, message", [
    ((0, 1), ValueError, r"^d_model: expected a positive int, got 0$"),  # was built, with 0-wide weights
    ((16, -2), ValueError, r"^n_heads: expected a positive int, got -2$"),
    ((16.0, 2), TypeError, r"^d_model: expected a positive int, got 16\.0$"),
    ((16, 2, 2.0), ValueError, r"^dropout: expected a probability in \[0, 1\), got 2\.0$"),  # was built
    ((16, 2, float("nan")), ValueError, r"^dropout: expected a probability in \[0, 1\), got nan$"),
])
def test_multi_head_attention_refuses_bad_sizes_as_the_reference_does(args, error, message):
    from tformer.reference.attention import MultiHeadAttention as Mirror

    for cls in (MultiHeadAttention, Mirror):
        with pytest.raises(error, match=message):
            cls(*args)
