"""The kernels (tformer.nn.kernels) against the plain ones, on the same weights.

Tolerance: helpers.TOLERANCE (float32: max abs diff <= 1e-5); bfloat16: cosine >= 0.999 vs float32,
or <= 2e-2 max abs diff between two bf16 paths. The plain kernels are forced with
``kernels.readable()``; packing is turned off with ``skip_padding=False``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, padding_mask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tformer.nn import kernels
from tformer.nn.kernels import attention_kernels, linear_kernels
from tformer.nn.masks import make_mask
from tformer.nn.model import Encoder, EncoderClassifier

B, S = 4, 11
PROPERTY = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _readable(model, *args, **kwargs):
    with kernels.readable():
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
@pytest.fixture(params=list(itertools.product(["onednn", "mkl"], ["sdpa", "matmul"])))
def inference_kernel(request, monkeypatch):
    """Both linear kernels and both attention kernels, whichever this machine measures faster
    (tformer.nn.kernels.autotune)."""
    linear, attention = request.param
    monkeypatch.setattr(linear_kernels, "infer_kernel", lambda x, w, activation: linear)
    monkeypatch.setattr(attention_kernels, "attention_kernel", lambda q, k, v: attention)
    return request.param


@pytest.mark.parametrize("norm_first,activation,mask_kind,bias", list(itertools.product(
    [False, True], ["relu", "gelu", "gelu_tanh"], list(MASKS), [True, False])))
def test_inference_matches_readable(tiny_config, norm_first, activation, mask_kind, bias,
                                    inference_kernel):
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
    monkeypatch.setattr(linear_kernels, "_ONEDNN", False)
    model = Encoder(tiny_config.replace(norm_first=norm_first)).eval()
    mask = torch.from_numpy(MASKS["padding"])
    with torch.inference_mode():
        padded = model(_ids(tiny_config), mask, skip_padding=False).last_hidden_state
        packed = model(_ids(tiny_config), mask).last_hidden_state
        readable = _readable(model, _ids(tiny_config), mask).last_hidden_state
    assert_close(padded, readable, what="last_hidden_state, padded")
    assert_close(packed, readable, what="last_hidden_state, packed")


# Unpadded execution ---------------------------------------------------------------------------------
@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), norm_first=st.booleans(),
       lengths=st.lists(st.integers(0, S), min_size=1, max_size=6))
def test_packed_execution_matches_padded_computation(tiny_config, seed, norm_first, lengths):
    """The default (packed) path gives the padded computation's values; padded positions are zeros."""
    config = tiny_config.replace(norm_first=norm_first, final_norm=norm_first)
    model = Encoder(config).eval()
    g = torch.Generator().manual_seed(seed)
    mask = torch.from_numpy(padding_mask(lengths, S))
    mask = mask[:, torch.randperm(S, generator=g)]  # real tokens anywhere, not just on the left
    ids = torch.randint(0, config.vocab_size, mask.shape, generator=g)
    with torch.no_grad():
        packed = model(ids, mask).last_hidden_state
        readable = _readable(model, ids, mask).last_hidden_state
    assert_close(packed, readable, what="last_hidden_state")
    assert not packed[~mask].any(), "padded positions must be exactly zero"


def test_pack_groups_sequences_by_length():
    mask = torch.from_numpy(padding_mask([3, 1, 3, 0, 2], 4))
    packing = make_mask(mask, None, 5, 4, 4).packing
    index, groups = packing.index, packing.groups
    assert groups == ((1, 1), (2, 1), (3, 2))  # (length, count), the empty row dropped
    # Sequence order 1 (len 1), 4 (len 2), 0 and 2 (len 3); flat index = row * S + position.
    assert index.tolist() == [4, 16, 17, 0, 1, 2, 8, 9, 10]


# Training --------------------------------------------------------------------------------------
def _train_step(model, ids, mask, skip_padding=False):  # padded: the dropout draws line up
    torch.manual_seed(1)  # the same dropout draws for both paths
    model.zero_grad()
    out = model(ids, mask, skip_padding=skip_padding).last_hidden_state
    loss = (out * torch.linspace(-1, 1, out.size(-1))).square().mean()
    loss.backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("norm_first,dropout,kernel", list(itertools.product(
    [False, True], [0.0, 0.1], ["onednn", "onednn+mm"])))
def test_training_matches_readable(tiny_config, norm_first, dropout, kernel, monkeypatch):
    """Same outputs and gradients, dropout included (the fused kernels draw in the same order),
    on the hidden states and on the attention weights (both paths draw those with
    tformer.nn.dropout in the explicit softmax). oneDNN's backward is forced on (it is chosen where
    it is measured faster) so it is tested anywhere.
    """
    monkeypatch.setattr(linear_kernels, "train_kernel", lambda x, w: kernel)
    config = tiny_config.replace(norm_first=norm_first, final_norm=norm_first, dropout=dropout,
                                 attention_dropout=dropout)
    model = Encoder(config).train()
    ids, mask = _ids(config), torch.from_numpy(MASKS["padding"])
    out, grads = _train_step(model, ids, mask)
    with kernels.readable():
        out_r, grads_r = _train_step(model, ids, mask)
    assert_close(out, out_r, what="output")
    for name in grads_r:
        assert_close(grads[name], grads_r[name], what=f"grad {name}")


@pytest.mark.parametrize("norm_first", [False, True])
def test_packed_training_matches_readable(tiny_config, norm_first):
    """Packed training (no dropout: packing changes the draws) gives the padded gradients."""
    config = tiny_config.replace(norm_first=norm_first, dropout=0.0)
    model = Encoder(config).train()
    ids, mask = _ids(config), torch.from_numpy(MASKS["padding"])
    _, grads = _train_step(model, ids, mask, skip_padding=None)
    model.zero_grad()
    out = _readable(model, ids, mask).last_hidden_state
    (out * torch.linspace(-1, 1, out.size(-1))).square().mean().backward()
    for name, p in model.named_parameters():
        assert_close(grads[name], p.grad, what=f"grad {name}")


@pytest.mark.parametrize("call_scores", [0.0, 500.0, 1e9])
def test_packed_training_in_buckets_matches_readable(tiny_config, call_scores, monkeypatch):
    """Attention under autograd, one call per group of lengths (0), per bucket of groups padded
    to its longest (500: some joined, some not), or one padded call (1e9): the padded
    computation's outputs and gradients, with an all-padding row and lengths 1 to S."""
    monkeypatch.setattr(attention_kernels, "attention_call_scores", lambda *a: call_scores)
    config = tiny_config.replace(dropout=0.0)
    model = Encoder(config).train()
    mask = torch.from_numpy(padding_mask([S, 1, 0, 3, 4, S, 9, 10, 4], S))
    ids = _ids(config, batch=mask.size(0))
    out, grads = _train_step(model, ids, mask, skip_padding=None)
    buckets = make_mask(mask, None, *mask.shape, mask.size(1)).packing.buckets(call_scores, config.n_heads)
    expected = {0.0: 6, 1e9: 1}  # 6 lengths: 1, 3, 4, 9, 10, S
    assert len(buckets) == expected[call_scores] if call_scores in expected else 1 < len(buckets) < 6
    out_r, grads_r = _train_step(model, ids, mask)
    assert_close(out, out_r, what="output")
    for name in grads_r:
        assert_close(grads[name], grads_r[name], what=f"grad {name}")


def test_an_attention_calls_price_is_measured_once_without_touching_the_draws(monkeypatch, tmp_path):
    """attention_call_scores: a call's price in scores, from two calls timed once (a positive
    number on any machine: a call has a cost of its own); measuring draws dropout on a forked
    generator, so a run's draws do not depend on whether it was known; 0 (a call per group)
    where nothing is known and nothing may be measured."""
    from tformer.nn.kernels import autotune

    monkeypatch.setattr(autotune, "_memory", {})
    monkeypatch.setattr(autotune, "_defaults", {})
    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path))  # (the session's cache: an earlier run's choices)
    with autotune.measuring(0.0):
        assert attention_kernels.attention_call_scores(4, 8, 0.1) == 0.0
    autotune._defaults.clear()
    state = torch.get_rng_state()
    scores = attention_kernels.attention_call_scores(4, 8, 0.1)
    assert torch.equal(torch.get_rng_state(), state)
    assert 0.0 < scores < math.inf
    monkeypatch.setattr(autotune, "decide", lambda *a, **k: pytest.fail("measured again"))
    assert attention_kernels.attention_call_scores(4, 8, 0.1) == scores


def test_packed_autocast_attention_with_dropout_keeps_bf16_values_and_the_same_numbers(tiny_config,
                                                                                        monkeypatch):
    """Under autocast with attention dropout (the explicit softmax) a layer's packed q, k, v
    stay bf16: converting them to fp32 only had autocast convert them back for its bf16
    products. Outputs and gradients are bit-for-bit those of the fp32 copies."""
    from tformer.nn.attention import MultiHeadAttention

    config = tiny_config.replace(attention_dropout=0.1)
    model = Encoder(config).train()
    mask = torch.from_numpy(padding_mask([S, 1, 3, 4, S, 9, 4], S))
    ids = _ids(config, batch=mask.size(0))
    qkv = torch.zeros(2, 3 * config.d_model, dtype=torch.bfloat16)
    packing = make_mask(mask, None, *mask.shape, mask.size(1)).packing
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.layers[0].self_attn._packed_dtype(qkv, packing, 0.1) == torch.bfloat16

    def step():
        torch.manual_seed(1)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(ids, mask).last_hidden_state
        out.float().square().mean().backward()
        return out.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()}

    out, grads = step()
    monkeypatch.setattr(MultiHeadAttention, "_packed_dtype", lambda *a: torch.float32)
    out_fp32, grads_fp32 = step()
    assert torch.equal(out, out_fp32)
    for name in grads:
        assert torch.equal(grads[name], grads_fp32[name]), name


def test_packed_attention_backward_makes_no_pass_per_group(tiny_config, monkeypatch):
    """Under autograd the groups are split apart once and joined once: the backward makes no
    zero tensor of the layer's whole (rows, 3D) projection per group (slices of it did: a fifth
    of a fine-tune step on 32 short texts in 16 groups)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    monkeypatch.setattr(attention_kernels, "attention_call_scores", lambda *a: 0.0)  # a call per group
    config = tiny_config.replace(dropout=0.0, n_layers=1)
    model = Encoder(config).train()
    mask = torch.from_numpy(padding_mask([1, 2, 3, 4, 5, 6, 7, 8], S))
    out = model(_ids(config, batch=8), mask).last_hidden_state
    whole = (64, 3 * config.d_model)  # the packed rows (36 tokens, rounded up to 64) x q, k, v

    class Count(TorchDispatchMode):
        made = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if isinstance(result, torch.Tensor) and tuple(result.shape) == whole:
                Count.made += 1
            return result

    with Count():
        out.square().sum().backward()
    assert Count.made <= 2, f"{Count.made} tensors of the whole projection for 8 groups"


@pytest.mark.parametrize("kernel", kernels.TRAIN_KERNELS)
def test_onednn_linear_backward_matches_f_linear(monkeypatch, kernel):
    monkeypatch.setattr(linear_kernels, "train_kernel", lambda x, w: kernel)
    layer = torch.nn.Linear(16, 24)
    x = torch.randn(3, 5, 16, requires_grad=True)
    y = kernels.linear(x, layer, "gelu")
    expected = F.gelu(F.linear(x, layer.weight, layer.bias))
    assert_close(y, expected, what="forward")
    grads = torch.autograd.grad(y.square().sum(), [x, layer.weight, layer.bias])
    grads_r = torch.autograd.grad(expected.square().sum(), [x, layer.weight, layer.bias])
    for name, a, b in zip(["x", "weight", "bias"], grads, grads_r, strict=True):
        assert_close(a, b, what=f"grad {name}")
    layer.weight.requires_grad_(False)  # only the bias trains: still the autograd kernel
    (grad_b,) = torch.autograd.grad(kernels.linear(x.detach(), layer).sum(), [layer.bias])
    assert_close(grad_b, torch.full((24,), 15.0), what="bias-only grad")


@pytest.mark.skipif(not linear_kernels._ONEDNN, reason="this torch build has no oneDNN linear")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_packed_inference_weight_follows_its_weight(monkeypatch, dtype):
    """oneDNN's linear reads its weight packed once: the same numbers as F.linear, packed again
    after an in-place change (an optimizer step, load_state_dict), never once per call."""
    if dtype == torch.bfloat16 and not linear_kernels._ONEDNN_BF16:
        pytest.skip("no bf16 inner product on this CPU")
    monkeypatch.setattr(linear_kernels, "infer_kernel", lambda x, w, activation: "onednn")
    layer = torch.nn.Linear(16, 24).to(dtype)
    x = torch.randn(7, 16, dtype=dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: two bf16 roundings of one sum
    with torch.no_grad():
        for _ in range(2):
            assert kernels.packed_weight(layer.weight) is layer.weight  # it may train: plain
    layer.requires_grad_(False)  # frozen, as the inference loaders give it
    with torch.no_grad():
        first = kernels.linear(x, layer, "relu")
        assert (first.float() - F.relu(F.linear(x, layer.weight, layer.bias)).float()).abs().max() <= tolerance
        packed = kernels.packed_weight(layer.weight)  # the second use: packed
        assert packed is not layer.weight and packed.is_mkldnn
        assert kernels.packed_weight(layer.weight) is packed  # made once
        layer.weight.mul_(-1)
        assert kernels.packed_weight(layer.weight) is layer.weight  # its version moved: plain,
        assert kernels.packed_weight(layer.weight).is_mkldnn  # then packed again
        fresh = torch.randn(24, 16, dtype=dtype)
        assert kernels.packed_weight(fresh) is fresh  # a weight seen once is not copied
        second = kernels.linear(x, layer)
        assert (second.float() - F.linear(x, layer.weight, layer.bias).float()).abs().max() <= tolerance
        if dtype == torch.bfloat16:  # the same parameter, its data swapped for fp32's
            layer.float()
            third = kernels.linear(x.float(), layer)
            assert third.dtype == torch.float32
            assert (third - F.linear(x.float(), layer.weight, layer.bias)).abs().max() <= 1e-5
    assert set(layer.state_dict()) == {"weight", "bias"}


def test_validation_between_fused_adamw_steps_sees_the_new_weights(monkeypatch):
    """torch's fused AdamW writes the weights without moving their version counter: a packed
    copy of a training weight would go stale, so a weight that trains is never packed."""
    monkeypatch.setattr(linear_kernels, "infer_kernel", lambda x, w, activation: "onednn")
    layer = torch.nn.Linear(16, 24)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1, fused=True)
    x = torch.randn(7, 16)
    for _ in range(3):
        with torch.no_grad():  # a validation, twice: a frozen weight would be packed by now
            for _ in range(2):
                y = kernels.linear(x, layer)
        assert_close(y, F.linear(x, layer.weight, layer.bias), what="validation after a step")
        F.linear(x, layer.weight, layer.bias).square().sum().backward()
        opt.step()
        opt.zero_grad()


def test_the_training_kernel_is_timed_on_a_dense_gradient(monkeypatch, tmp_path):
    """The measurement sends back what a loss sends back: a dense gradient. A stride-0 tensor
    of ones (what `.sum().backward()` gives) makes each kernel copy it first, and the choice
    then times the copies, not the GEMMs (it picked MKL's slower backward on an AVX-512 EPYC)."""
    from tformer.nn.kernels import autotune

    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    seen = []
    backward = linear_kernels._OneDNNLinear.backward

    def recording(ctx, dy):
        seen.append(dy.stride())
        return backward(ctx, dy)

    monkeypatch.setattr(linear_kernels._OneDNNLinear, "backward", staticmethod(recording))
    linear_kernels.train_kernel(torch.randn(6, 16, requires_grad=True), torch.randn(24, 16))
    assert seen and all(0 not in stride for stride in seen), seen


def test_the_attention_kernel_is_measured_only_for_unmasked_inference(monkeypatch, tmp_path):
    """Two matmuls replace SDPA only where they can: no grad (SDPA's backward), no mask, no
    dropout, a score count that fits in memory; there the faster measured here wins, per class."""
    from tformer.nn.kernels import autotune

    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    with torch.no_grad():
        chosen = attention_kernels.attention_kernel(q, k, v)
    assert chosen in ("sdpa", "matmul")
    assert [key for key in autotune._memory] == ["attention-infer | 256/8x8/float32"]  # 150 scores, 5 keys
    assert attention_kernels.attention_kernel(q.requires_grad_(), k, v) == "sdpa"  # training
    huge = torch.empty(1, 1, 2**11, 8).expand(64, 1, 2**11, 8)  # 2^28 scores
    assert attention_kernels.attention_kernel(huge, huge, huge) == "sdpa"
    monkeypatch.setattr(attention_kernels, "attention_kernel", lambda *a: pytest.fail("masked: no choice"))
    kernels.attention(q.detach(), k, v, torch.ones(5, 5, dtype=torch.bool), 0.0)
    kernels.attention(q.detach(), k, v, None, 0.1)


def test_matmul_attention_equals_sdpa():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64) for _ in range(3))
    assert_close(attention_kernels._matmul_attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                 np.float64, what="matmul attention")
    # bf16 values (softmaxed in fp32): bf16 out, as close to the float64 result as SDPA's bf16 kernel
    low = [t.bfloat16() for t in (q, k, v)]
    exact = F.scaled_dot_product_attention(*(t.double() for t in low))
    got, fused = attention_kernels._matmul_attention(*low), F.scaled_dot_product_attention(*low)
    assert got.dtype == torch.bfloat16
    assert (got.double() - exact).abs().max() <= max(1e-2, 1.5 * (fused.double() - exact).abs().max())


# Choosing the kernel ------------------------------------------------------------------------------
def test_why_not_onednn_names_the_reason():
    w = torch.zeros(8, 8)
    assert kernels.why_not_onednn(torch.zeros(2, 8), w) is None or not linear_kernels._ONEDNN
    assert "float32 and bfloat16" in kernels.why_not_onednn(torch.zeros(2, 8).double(), w.double())
    assert "dtypes differ" in kernels.why_not_onednn(torch.zeros(2, 8).double(), w)
    with kernels.readable():
        assert "readable" in kernels.why_not_onednn(torch.zeros(2, 8), w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "autocast" in kernels.why_not_onednn(torch.zeros(2, 8), w)


def test_why_not_packed_names_the_reason():
    real = torch.from_numpy(MASKS["padding"])
    mask = make_mask(real, None, B, S, S)
    full = make_mask(torch.ones(B, S, dtype=torch.bool), None, B, S, S)
    assert kernels.why_not_packed(mask, False, False, None) is None
    assert kernels.why_not_packed(mask, False, False, True) is None
    assert "skip_padding=False" in kernels.why_not_packed(mask, False, False, False)
    assert "no padding mask" in kernels.why_not_packed(None, False, False, None)
    assert "attn_mask" in kernels.why_not_packed(mask, True, False, None)
    assert "weights" in kernels.why_not_packed(mask, False, True, None)
    assert "nothing to skip" in kernels.why_not_packed(full, False, False, None)
    with kernels.readable():
        assert "readable" in kernels.why_not_packed(mask, False, False, None)
    empty = make_mask(torch.zeros(B, S, dtype=torch.bool), None, B, S, S)
    assert "no real token" in kernels.why_not_packed(empty, False, False, None)


def test_classifier_uses_the_fast_encoder(tiny_config):
    model = EncoderClassifier(tiny_config.replace(n_classes=3, pooling="mean")).eval()
    mask = torch.from_numpy(MASKS["padding"])
    with torch.no_grad():
        assert_close(model(_ids(tiny_config), mask).logits,
                     _readable(model, _ids(tiny_config), mask).logits, what="logits")


# bfloat16 ---------------------------------------------------------------------------------------
@pytest.fixture(params=["fp32", "bf16"])
def bf16_attention(request, monkeypatch):
    """Unmasked bf16 attention at inference on fp32 copies or on the bf16 values, whichever this
    machine would measure faster (both forced here)."""
    from tformer.nn.kernels import autotune

    choose = autotune.choose

    def forced(name, shape_class, candidates, measure=None, **device):
        return request.param if name == "attention-bf16" else choose(name, shape_class, candidates, measure,
                                                                      **device)

    monkeypatch.setattr(autotune, "choose", forced)
    return request.param


@pytest.mark.parametrize("skip_padding", [False, None])
def test_bfloat16_inference_is_close_to_float32(tiny_config, skip_padding, bf16_attention):
    """A bf16 model (``model.to(torch.bfloat16)``): last hidden state cosine >= 0.999 vs float32."""
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
    assert not bf16[~mask].any()


# Autocast ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask_kind", ["none", "padding"])
def test_autocast_bf16_inference_runs_and_matches_readable(tiny_config, mask_kind):
    """Autocast bf16 around the default forward works and agrees with the readable path in bf16."""
    model = Encoder(tiny_config.replace(norm_first=True, final_norm=True)).eval()
    mask = None if MASKS[mask_kind] is None else torch.from_numpy(MASKS[mask_kind])
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        default = model(_ids(tiny_config), mask).last_hidden_state
        readable = _readable(model, _ids(tiny_config), mask).last_hidden_state
    fp32 = _readable(model, _ids(tiny_config), mask).last_hidden_state.detach()
    diff = float((default.float() - readable.float()).abs().max())
    assert diff <= 2e-2, f"autocast default vs readable: max abs diff {diff:.3e} > 2e-2"
    real = torch.ones(B, S, dtype=torch.bool) if mask is None else mask
    cos = F.cosine_similarity(default.float()[real], fp32[real], dim=-1)
    assert float(cos.min()) >= 0.999


def test_autocast_bf16_training_step_matches_readable(tiny_config):
    """A training step under autocast: the default path's gradients agree with the readable path's."""
    model = Encoder(tiny_config.replace(dropout=0.0)).train()
    ids, mask = _ids(tiny_config), torch.from_numpy(MASKS["padding"])

    def step():
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(ids, mask).last_hidden_state
        out.float().square().mean().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    grads = step()
    with kernels.readable():
        grads_r = step()
    for name, g in grads_r.items():
        cos = F.cosine_similarity(grads[name].flatten(), g.flatten(), dim=0)
        assert float(cos) >= 0.99, f"grad {name}: cosine {float(cos):.4f} < 0.99"


# Zeros at padding ------------------------------------------------------------------------------
@pytest.mark.parametrize("readable,outputs,dtype,train", list(itertools.product(
    [False, True], [False, True], [torch.float32, torch.float64, torch.bfloat16], [False, True])))
def test_padded_positions_are_zeros_everywhere(tiny_config, readable, outputs, dtype, train):
    """Every path, every output: padded positions hold exactly zero."""
    model = Encoder(tiny_config.replace(norm_first=True, final_norm=True)).to(dtype).train(train)
    mask = torch.from_numpy(MASKS["all-padding row"])
    kwargs = dict(output_hidden_states=outputs, output_attentions=outputs)
    if readable:
        out = _readable(model, _ids(tiny_config), mask, **kwargs)
    else:
        out = model(_ids(tiny_config), mask, **kwargs)
    states = [out.last_hidden_state, *(out.hidden_states or ())]
    for i, h in enumerate(states):
        assert h.dtype == dtype
        assert not h[~mask].any(), f"state {i}: non-zero at padded positions"
        assert h[mask].abs().sum() > 0


def test_autocast_bf16_attention_matches_the_explicit_formula():
    """Under autocast (bf16 training) attention is SDPA's, masks and rows that may attend
    nothing included; the readable formula gives the same within bf16's rounding."""
    from tformer.nn.attention import scaled_dot_product_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=g) for _ in range(3))
    mask = torch.from_numpy(padding_mask([7, 4], 7))[:, None, None, :]  # (B, 1, 1, S)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert kernels.why_not_fused_attention(q.bfloat16(), k.bfloat16(), 0.0, False) is None
        fused, _ = scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
        with kernels.readable():
            explicit, _ = scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask)
    expected = F.scaled_dot_product_attention(q, k, v, mask)
    for out in (fused, explicit):
        cos = F.cosine_similarity(out.float().flatten(0, 2), expected.flatten(0, 2), dim=-1)
        assert float(cos.min()) >= 0.999


def test_bfloat16_attention_outside_autocast_is_fp32_attention_of_the_same_values():
    """Precision "bf16" (bf16 q, k, v, no autocast): the fused kernel takes softmax(q k^T) v in
    fp32 on the bf16 values and rounds only the output to bf16 (relative error <= 2^-8)."""
    from tformer.nn.attention import scaled_dot_product_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=g).bfloat16() for _ in range(3))
    mask = torch.from_numpy(padding_mask([7, 4], 7))[:, None, None, :]  # (B, 1, 1, S)
    assert kernels.why_not_fused_attention(q, k, 0.0, False) is None
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), mask)
    assert out.dtype == torch.bfloat16
    assert float(((out.double() - expected).abs() / expected.abs().clamp(min=1e-3)).max()) <= 2**-8


@pytest.mark.parametrize("activation", list(kernels.ACTIVATIONS))
def test_in_place_activations_equal_the_plain_ones_bit_for_bit(activation):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 4
    y = x.clone()
    out = kernels.ACTIVATIONS_IN_PLACE[activation](y)
    assert out.data_ptr() == y.data_ptr()  # no second buffer
    assert torch.equal(y, kernels.ACTIVATIONS[activation][0](x))


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


def test_bfloat16_unmasked_attention_at_inference_in_the_measured_dtype(bf16_attention):
    """Unmasked bf16 attention without grad: on fp32 copies, softmax(q k^T) v rounded once to
    bf16 (relative error <= 2^-8 against float64 on the same values); on the bf16 values,
    with both kernels, the scores and weights rounded to bf16 too (max abs diff <= 2e-2,
    cosine >= 0.9999 against float64 on the same values)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 3, 9, 8, generator=g).bfloat16() for _ in range(3))
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    for attention in ("sdpa", "matmul"):
        with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
            mp.setattr(attention_kernels, "attention_kernel", lambda q, k, v, kernel=attention: kernel)
            expected_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[bf16_attention]
            assert kernels.attention_dtype(q, k, v) == expected_dtype
            out = kernels.attention(q, k, v, None, 0.0)
        assert out.dtype == torch.bfloat16
        if bf16_attention == "fp32":
            error = ((out.double() - expected).abs() / expected.abs().clamp(min=1e-3)).max()
            assert float(error) <= 2**-8, f"{attention}: relative error {float(error):.2e}"
        else:
            assert float((out.double() - expected).abs().max()) <= 2e-2, attention
            cos = F.cosine_similarity(out.double().flatten(0, 2), expected.flatten(0, 2), dim=-1)
            assert float(cos.min()) >= 0.9999, f"{attention}: min cosine {float(cos.min()):.6f}"


def test_the_bf16_attention_dtype_is_measured_only_for_unmasked_inference(monkeypatch, tmp_path):
    """bf16 values stay bf16 in attention only where measured faster for the shape class: never
    under a mask or dropout (no shapes given), with grad (SDPA's backward) or for other dtypes."""
    from tformer.nn.kernels import autotune

    monkeypatch.setenv("TFORMER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    q, k, v = (torch.randn(2, 3, 5, 8).bfloat16() for _ in range(3))
    assert kernels.attention_dtype(q) == torch.float32  # masked or dropout: no choice
    assert kernels.attention_dtype(q.float(), k.float(), v.float()) == torch.float32
    assert kernels.attention_dtype(q.double(), k, v) == torch.float64
    assert kernels.attention_dtype(q.clone().requires_grad_(), k, v) == torch.float32  # training
    assert not any(key.startswith("attention-bf16") for key in autotune._memory)
    with torch.no_grad():
        chosen = kernels.attention_dtype(q, k, v)
    assert chosen in (torch.float32, torch.bfloat16)
    decision = autotune._memory["attention-bf16 | 256/8x8/bfloat16"]  # 150 scores, 5 keys
    assert set(decision["seconds"]) == {"fp32", "bf16"}
    assert (chosen == torch.bfloat16) == (decision["choice"] == "bf16")


@pytest.mark.parametrize("layer_dtype", [torch.float32, torch.bfloat16])
def test_packed_inference_runs_every_group_in_its_layers_dtype(tiny_config, monkeypatch, layer_dtype):
    """At inference a packed layer's q, k, v are converted once, to the dtype chosen for its
    group of most tokens, and every group of lengths computes in it, whatever its own shape's
    choice (per-group conversions cost more than they gained); the hidden states are the
    padded computation's (bf16 weights: cosine >= 0.9999 at real tokens)."""
    from tformer.nn.attention import MultiHeadAttention
    from tformer.nn.precision import to_precision

    model = to_precision(Encoder(tiny_config).eval(), "bf16")
    mask = torch.from_numpy(padding_mask([S, 1, 3, 4, S, 9, 4], S))
    ids = _ids(tiny_config, batch=mask.size(0))
    seen = []
    as_is = attention_kernels.attention_as_is
    monkeypatch.setattr(MultiHeadAttention, "_packed_dtype", lambda *a: layer_dtype)
    monkeypatch.setattr(kernels, "attention_as_is",  # as attention.py looks it up
                        lambda q, k, v: seen.append((q.dtype, k.dtype, v.dtype)) or as_is(q, k, v),
                        raising=False)
    monkeypatch.setattr(attention_kernels, "attention_dtype", lambda *a: pytest.fail("chosen per group"))
    with torch.inference_mode():
        packed = model(ids, mask).last_hidden_state.float()
    groups = len(make_mask(mask, None, *mask.shape, mask.size(1)).packing.groups)
    assert seen == [(layer_dtype,) * 3] * (groups * tiny_config.n_layers)
    monkeypatch.undo()
    with torch.inference_mode():
        padded = model(ids, mask, skip_padding=False).last_hidden_state.float()
    real = mask.bool()
    cos = F.cosine_similarity(packed[real], padded[real], dim=-1)
    assert float(cos.min()) >= 0.9999
