"""Backward of the NumPy attention against torch autograd (float64, helpers.GRAD_RTOL).

Metric: per tensor, max |ours - torch| / max |torch| <= 1e-9.
"""

import numpy as np
import pytest
import torch
from helpers import (
    GRAD_RTOL,
    assert_grads_match,
    copy_weights,
    finite_difference,
    relative_error,
)

from tformer.nn.attention import MultiHeadAttention as TorchMHA
from tformer.nn.attention import scaled_dot_product_attention as torch_sdpa
from tformer.reference.attention import (
    MultiHeadAttention,
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_train,
)

# Small tensors: one torch thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")

B, H, T, S, DH = 2, 3, 4, 5, 6


def _mask(kind, rng):
    if kind == "none":
        return None
    mask = rng.random((B, 1, T, S)) < 0.6
    mask[0, 0, 1] = False  # a query that may attend to nothing
    mask[1, 0, :, 2] = False  # a key nobody sees
    return mask


@pytest.mark.parametrize("kind", ["none", "masked"])
def test_sdpa_backward_matches_torch(kind):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape) for shape in [(B, H, T, DH), (B, H, S, DH), (B, H, S, DH)])
    mask = _mask(kind, rng)
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    out, _ = torch_sdpa(tq, tk, tv, None if mask is None else torch.from_numpy(mask))
    g = rng.standard_normal(out.shape)
    (out * torch.from_numpy(g)).sum().backward()
    ours, weights, cache = scaled_dot_product_attention_train(q, k, v, mask)
    assert relative_error(ours, out) <= GRAD_RTOL
    assert relative_error(ours, scaled_dot_product_attention(q, k, v, mask)[0]) == 0
    dq, dk, dv = scaled_dot_product_attention_backward(g, cache)
    for name, mine, theirs in (("dq", dq, tq.grad), ("dk", dk, tk.grad), ("dv", dv, tv.grad)):
        assert np.isfinite(mine).all(), name
        assert relative_error(mine, theirs) <= GRAD_RTOL, name
    if mask is not None:  # the empty row: zero output, zero gradient to its query
        assert (ours[0, :, 1] == 0).all() and (dq[0, :, 1] == 0).all()
        assert (dk[1, :, 2] == 0).all()  # an unseen key gets no gradient


def test_sdpa_attention_dropout_backward_by_finite_differences():
    """Attention dropout (not in torch's reach with the same draws): the same rng seed
    gives the same mask, so the loss is a smooth function of q we can difference."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape) for shape in [(B, H, T, DH), (B, H, S, DH), (B, H, S, DH)])
    g = rng.standard_normal((B, H, T, DH))

    def loss():
        out, _, _ = scaled_dot_product_attention_train(q, k, v, None, 0.3, np.random.default_rng(7))
        return float((out * g).sum())

    _, _, cache = scaled_dot_product_attention_train(q, k, v, None, 0.3, np.random.default_rng(7))
    assert cache[4] is not None and (cache[4] == 0).any()  # some weights were dropped
    dq, dk, dv = scaled_dot_product_attention_backward(g, cache)
    for array, grad in ((q, dq), (k, dk), (v, dv)):
        for index in [(0, 0, 0, 0), (1, 2, 3, 5), (1, 1, 2, 3)]:
            if index[2] < array.shape[2]:
                fd = finite_difference(loss, array, index)
                assert abs(fd - grad[index]) <= 1e-6 * max(1.0, abs(fd))



@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("kind", ["none", "masked"])
def test_multi_head_attention_backward_matches_torch(cross, kind):
    rng = np.random.default_rng(0)
    d, heads = 12, 3
    torch_mha = TorchMHA(d, heads, cross=cross).double().eval()
    ours = MultiHeadAttention(d, heads, cross=cross).astype(np.float64)
    copy_weights(torch_mha, ours)
    x = rng.standard_normal((B, T, d))
    memory = rng.standard_normal((B, S, d)) if cross else None
    mask = _mask(kind, rng)
    if mask is not None and not cross:
        mask = mask[..., :T]
        mask[0, 0, 1] = False
    tx = torch.from_numpy(x).requires_grad_()
    tm = torch.from_numpy(memory).requires_grad_() if cross else None
    out = torch_mha(tx, tm, mask=None if mask is None else torch.from_numpy(mask)).output
    g = rng.standard_normal(out.shape)
    (out * torch.from_numpy(g)).sum().backward()
    y, _, cache = ours.forward_train(x, memory, mask)
    assert relative_error(y, out) <= GRAD_RTOL
    grads = ours.zero_grads()
    dx, dmemory = ours.backward(g, cache, grads)
    assert_grads_match(grads, torch_mha, "MultiHeadAttention")
    assert relative_error(dx, tx.grad) <= GRAD_RTOL
    if cross:
        assert relative_error(dmemory, tm.grad) <= GRAD_RTOL
    else:
        assert dmemory is None


def test_a_memory_row_shared_by_its_beams_matches_torch():
    """The mirror's cross-attention with g = 2 query rows per memory row (beam search's beams of
    a source) against torch's, and against the memory repeated per beam; float64."""
    rng = np.random.default_rng(0)
    d, heads, g = 12, 3, 2
    torch_mha = TorchMHA(d, heads, cross=True).double().eval()
    ours = MultiHeadAttention(d, heads, cross=True).astype(np.float64)
    copy_weights(torch_mha, ours)
    x, memory = rng.standard_normal((B * g, T, d)), rng.standard_normal((B, S, d))
    mask = np.ones((B, 1, 1, S), dtype=bool)
    mask[1, ..., 3:] = False
    out = ours(x, memory, mask, use_cache=True)
    with torch.no_grad():
        expected = torch_mha(torch.from_numpy(x), torch.from_numpy(memory),
                             mask=torch.from_numpy(mask)).output.numpy()
    repeated = ours(x, memory.repeat(g, axis=0), mask.repeat(g, axis=0)).output
    assert relative_error(out.output, expected) <= 1e-12
    assert relative_error(out.output, repeated) <= 1e-12
    assert out.present[0].shape == (B, heads, S, d // heads)
    assert relative_error(ours(x, None, mask, past_key_value=out.present).output, expected) <= 1e-12


@pytest.mark.parametrize(("args", "message"), [
    (((B, H, T, DH), (B, H, S, DH), (B, H, S + 1, DH)),
     rf"^v: expected shape \(B, H, S, Dh\) = \({B}, {H}, {S}, {DH}\), got \({B}, {H}, {S + 1}, {DH}\)$"),
    (((B, H, T, DH), (B, H, S, DH - 1), (B, H, S, DH)), r"^k: expected shape \(B, H, S, Dh\)"),
    (((T, DH), (B, H, S, DH), (B, H, S, DH)), rf"^q: expected shape \(B, H, T, Dh\), got \({T}, {DH}\)$"),
    (((B, H, T, DH), (B, H, S, DH), (B, H, S, DH), (T, S - 1)),
     rf"^mask: expected a shape broadcastable to \(B, H, T, S\) = \({B}, {H}, {T}, {S}\), "
     rf"got \({T}, {S - 1}\)$"),
])
def test_sdpa_names_a_misshapen_argument(args, message):
    """One line naming the argument, not NumPy's matmul or broadcasting error."""
    arrays = [np.ones(shape) for shape in args[:3]] + [np.ones(shape, bool) for shape in args[3:]]
    for sdpa in (scaled_dot_product_attention, scaled_dot_product_attention_train):
        with pytest.raises(ValueError, match=message):
            sdpa(*arrays)


@pytest.mark.parametrize("cross", [False, True])
def test_multi_head_attention_names_a_misshapen_input(cross):
    mha = MultiHeadAttention(12, 3, cross=cross)
    memory = np.ones((B, S, 12))
    with pytest.raises(ValueError, match=r"^x: expected shape \(B, S, D\) with D = 12, got \(2, 4, 8\)$"):
        mha(np.ones((B, T, 8)), memory)
    with pytest.raises(ValueError, match=r"^x: expected shape \(B, S, D\) with D = 12, got \(4, 12\)$"):
        mha.forward_train(np.ones((T, 12)), memory)
    if cross:
        with pytest.raises(ValueError, match=r"^memory: expected shape \(B, S, D\) with D = 12"):
            mha(np.ones((B, T, 12)), np.ones((B, S, 8)))
