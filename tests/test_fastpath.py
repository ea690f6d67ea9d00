"""The fast paths (tformer.fastpath) against the readable path, on the same weights.

Tolerance: helpers.TOLERANCE (float32: max abs diff <= 1e-5); bfloat16: cosine >= 0.999 vs float32.
The readable path is forced with ``fastpath.disabled()``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, padding_mask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tformer import fastpath
from tformer.model import Encoder, EncoderClassifier

B, S = 4, 11
PROPERTY = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _readable(model, *args, **kwargs):
    with fastpath.disabled():
        return model(*args, **kwargs)


def _ids(config, seed=0, batch=B, seq=S):
    return torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))


MASKS = {
    "none": None,
    "padding": padding_mask([S, 7, 3, 9], S),
    "all-padding row": padding_mask([S, 0, 5, 2], S),
    "left padding": padding_mask([S, 7, 3, 9], S)[:, ::-1].copy(),
}


# Inference ------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first,activation,mask_kind,bias", list(itertools.product(
    [False, True], ["relu", "gelu", "gelu_tanh"], list(MASKS), [True, False])))
def test_inference_matches_readable(tiny_config, norm_first, activation, mask_kind, bias):
    config = tiny_config.replace(norm_first=norm_first, final_norm=norm_first, activation=activation,
                                 bias=bias)
    model = Encoder(config).eval()
    mask = MASKS[mask_kind]
    mask = None if mask is None else torch.from_numpy(mask)
    with torch.no_grad():
        fast = model(_ids(config), mask).last_hidden_state
        readable = _readable(model, _ids(config), mask).last_hidden_state
    assert_close(fast, readable, what=f"last_hidden_state ({mask_kind})")


@pytest.mark.parametrize("norm_first", [False, True])
def test_inference_without_onednn_matches_readable(tiny_config, norm_first, monkeypatch):
    """The fallback to F.linear (a torch build without MKL-DNN) gives the same numbers too."""
    monkeypatch.setattr(fastpath, "_ONEDNN", False)
    model = Encoder(tiny_config.replace(norm_first=norm_first)).eval()
    mask = torch.from_numpy(MASKS["padding"])
    with torch.inference_mode():
        fast = model(_ids(tiny_config), mask).last_hidden_state
        packed = model(_ids(tiny_config), mask, skip_padding=True).last_hidden_state
        readable = _readable(model, _ids(tiny_config), mask).last_hidden_state
    assert_close(fast, readable, what="last_hidden_state")
    assert_close(packed, readable, where=mask, what="real tokens, skip_padding")


# Unpadded execution ---------------------------------------------------------------------------------
@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), norm_first=st.booleans(),
       lengths=st.lists(st.integers(0, S), min_size=1, max_size=6))
def test_skip_padding_matches_padded_computation(tiny_config, seed, norm_first, lengths):
    """Real tokens get the padded computation's values; padded positions are zeros."""
    config = tiny_config.replace(norm_first=norm_first, final_norm=norm_first)
    model = Encoder(config).eval()
    g = torch.Generator().manual_seed(seed)
    mask = torch.from_numpy(padding_mask(lengths, S))
    mask = mask[:, torch.randperm(S, generator=g)]  # real tokens anywhere, not just on the left
    ids = torch.randint(0, config.vocab_size, mask.shape, generator=g)
    with torch.no_grad():
        packed = model(ids, mask, skip_padding=True).last_hidden_state
        readable = _readable(model, ids, mask).last_hidden_state
    assert_close(packed, readable, where=mask, what="real tokens")
    zeros = torch.zeros(config.d_model)
    pad_value = model.final_norm(zeros) if config.final_norm else zeros  # nothing computed there
    assert_close(packed[~mask], pad_value.expand_as(packed[~mask]), what="padded positions")


def test_pack_groups_sequences_by_length():
    mask = torch.from_numpy(padding_mask([3, 1, 3, 0, 2], 4))
    index, groups = fastpath.pack(mask)
    assert groups == [(1, 1), (2, 1), (3, 2)]  # (length, count), the empty row dropped
    # Sequence order 1 (len 1), 4 (len 2), 0 and 2 (len 3); flat index = row * S + position.
    assert index.tolist() == [4, 16, 17, 0, 1, 2, 8, 9, 10]


# Training --------------------------------------------------------------------------------------
def _train_step(model, ids, mask, skip_padding=False):
    torch.manual_seed(1)  # the same dropout draws for both paths
    model.zero_grad()
    out = model(ids, mask, skip_padding=skip_padding).last_hidden_state
    loss = (out * torch.linspace(-1, 1, out.size(-1))).square().mean()
    loss.backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("norm_first,dropout", list(itertools.product([False, True], [0.0, 0.1])))
def test_training_matches_readable(tiny_config, norm_first, dropout):
    """Same outputs and gradients, dropout included (the fast path draws in the same order)."""
    config = tiny_config.replace(norm_first=norm_first, final_norm=norm_first, dropout=dropout,
                                 attention_dropout=dropout)
    model = Encoder(config).train()
    ids, mask = _ids(config), torch.from_numpy(MASKS["padding"])
    out, grads = _train_step(model, ids, mask)
    with fastpath.disabled():
        out_r, grads_r = _train_step(model, ids, mask)
    assert_close(out, out_r, what="output")
    for name in grads_r:
        assert_close(grads[name], grads_r[name], what=f"grad {name}")


@pytest.mark.parametrize("norm_first", [False, True])
def test_skip_padding_training_matches_readable(tiny_config, norm_first):
    """Packed training (no dropout: packing changes the draws) gives the padded gradients."""
    config = tiny_config.replace(norm_first=norm_first, dropout=0.0)
    model = Encoder(config).train()
    ids, mask = _ids(config), torch.from_numpy(MASKS["padding"])
    _, grads = _train_step(model, ids, mask, skip_padding=True)
    model.zero_grad()
    out = _readable(model, ids, mask).last_hidden_state
    out = out * mask[..., None]  # what the packed path returns: zeros at padded positions
    (out * torch.linspace(-1, 1, out.size(-1))).square().mean().backward()
    for name, p in model.named_parameters():
        assert_close(grads[name], p.grad, what=f"grad {name}")


def test_onednn_linear_backward_matches_f_linear():
    layer = torch.nn.Linear(16, 24)
    x = torch.randn(3, 5, 16, requires_grad=True)
    y = fastpath.linear(x, layer, "gelu", residual=torch.ones(3, 5, 24))
    expected = F.gelu(F.linear(x, layer.weight, layer.bias)) + 1
    assert_close(y, expected, what="forward")
    grads = torch.autograd.grad(y.square().sum(), [x, layer.weight, layer.bias])
    grads_r = torch.autograd.grad(expected.square().sum(), [x, layer.weight, layer.bias])
    for name, a, b in zip(["x", "weight", "bias"], grads, grads_r, strict=True):
        assert_close(a, b, what=f"grad {name}")
    layer.weight.requires_grad_(False)  # only the bias trains: still the autograd kernel
    (grad_b,) = torch.autograd.grad(fastpath.linear(x.detach(), layer).sum(), [layer.bias])
    assert_close(grad_b, torch.full((24,), 15.0), what="bias-only grad")


# Choosing the path ------------------------------------------------------------------------------
@pytest.mark.parametrize("case,reason", [
    (dict(need_weights=True), "attention weights"),
    (dict(attn_mask=torch.ones(S, S, dtype=torch.bool)), "attn_mask"),
    (dict(dtype=torch.float64), "float32/bfloat16"),
])
def test_why_not_names_the_reason(case, reason):
    h = torch.zeros(B, S, 8, dtype=case.get("dtype", torch.float32))
    why = fastpath.why_not(h, case.get("attn_mask"), case.get("need_weights", False), False)
    assert reason in why
    assert fastpath.why_not(torch.zeros(B, S, 8), None, False, False) is None
    with fastpath.disabled():
        assert "disabled" in fastpath.why_not(torch.zeros(B, S, 8), None, False, False)


def test_classifier_uses_the_fast_encoder(tiny_config):
    model = EncoderClassifier(tiny_config.replace(n_classes=3, pooling="mean")).eval()
    mask = torch.from_numpy(MASKS["padding"])
    with torch.no_grad():
        assert_close(model(_ids(tiny_config), mask).logits,
                     _readable(model, _ids(tiny_config), mask).logits, what="logits")


# bfloat16 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("skip_padding", [False, True])
def test_bfloat16_inference_is_close_to_float32(tiny_config, skip_padding):
    """The opt-in bf16 path (``model.to(torch.bfloat16)``): last hidden state cosine >= 0.999."""
    config = tiny_config.replace(d_model=64, n_heads=4, d_ff=256, n_layers=4, positional="learned",
                                 embedding_norm=True, scale_embeddings=False, activation="gelu")
    model = Encoder(config).eval()
    ids, mask = _ids(config, seq=32, batch=6), torch.from_numpy(padding_mask([32, 20, 9, 32, 1, 17], 32))
    with torch.inference_mode():
        fp32 = model(ids, mask).last_hidden_state
        bf16 = model.to(torch.bfloat16)(ids, mask, skip_padding=skip_padding).last_hidden_state
    assert bf16.dtype == torch.bfloat16
    cos = F.cosine_similarity(bf16.float()[mask], fp32[mask], dim=-1)
    assert float(cos.min()) >= 0.999, f"min cosine {float(cos.min()):.5f} < 0.999"
    assert np.isfinite(bf16.float().numpy()).all()


def test_bfloat16_matmul_attention_matches_sdpa():
    """bf16's two-matmul attention (masks and rows that may attend nothing included) vs SDPA in fp32."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=g) for _ in range(3))
    mask = torch.from_numpy(padding_mask([7, 4], 7))[:, None, None, :]  # (B, 1, 1, S)
    out = fastpath.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, 0.0).float()
    expected = F.scaled_dot_product_attention(q, k, v, mask)
    cos = F.cosine_similarity(out.flatten(0, 2), expected.flatten(0, 2), dim=-1)
    assert float(cos.min()) >= 0.999


# The NumPy reference's float32 erf ---------------------------------------------------------------
def test_reference_float32_erf_is_float32_accurate():
    """float32 arrays take the cheaper rational erf; it stays within float32 rounding of math.erf."""
    import math

    from tformer.reference.feedforward import erf, gelu

    x = np.linspace(-12, 12, 200_001).astype(np.float32)
    expected = np.array([math.erf(v) for v in x.astype(np.float64)])
    assert erf(x).dtype == np.float32
    assert np.abs(erf(x) - expected).max() <= 1e-6
    t = torch.from_numpy(x)
    assert_close(gelu(x), F.gelu(t), np.float32, what="gelu float32")
