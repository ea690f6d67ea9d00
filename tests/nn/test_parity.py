"""PyTorch modules vs the NumPy reference on the same weights, in evaluation mode.

Tolerances (helpers.TOLERANCE): float64 max abs diff <= 1e-10, float32 <= 1e-5.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest
import torch
from helpers import assert_close, padding_mask

from tformer import reference as ref
from tformer.nn import kernels
from tformer.nn.cache import grow
from tformer.nn.model import Decoder, Encoder, EncoderClassifier, Seq2SeqTransformer

DTYPES = {np.float64: torch.float64, np.float32: torch.float32}
B, S, T = 3, 9, 6


def _pair(torch_cls, ref_cls, config, dtype):
    model = torch_cls(config).to(DTYPES[dtype]).eval()
    mirror = ref_cls(config, dtype)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert set(state) == set(mirror.state_dict()), "state-dict keys must be identical"
    mirror.load_state_dict(state)
    return model, mirror


def _masks(kind: str, rng: np.random.Generator):
    attention_mask = attn_mask = None
    if kind in ("padding", "both"):
        attention_mask = padding_mask([S, 5, 0], S)  # the last row is all padding
    if kind in ("general", "both"):
        attn_mask = rng.random((B, S, S)) < 0.6
        attn_mask[0, 2] = False  # a query that may attend nothing
    return attention_mask, attn_mask


def _t(x):
    return None if x is None else torch.from_numpy(x)


CASES = list(itertools.product(
    [np.float64, np.float32], [False, True], ["relu", "gelu", "gelu_tanh"],
    ["sinusoidal", "learned", "none"], ["none", "padding", "general", "both"],
))


@pytest.mark.parametrize("dtype,norm_first,activation,positional,mask_kind", CASES)
@pytest.mark.parametrize("kernel", ["default", "readable"])
def test_encoder_matches_reference(tiny_config, dtype, norm_first, activation, positional,
                                   mask_kind, kernel):
    """The matrix on both engines' kernels: ``default`` asks for nothing but the last state, so
    the fused linear, SDPA and packed execution run; ``readable`` runs the plain kernels and
    returns every hidden state and attention map."""
    config = tiny_config.replace(norm_first=norm_first, final_norm=norm_first,
                                 activation=activation, positional=positional)
    model, mirror = _pair(Encoder, ref.Encoder, config, dtype)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config.vocab_size, (B, S))
    attention_mask, attn_mask = _masks(mask_kind, rng)
    readable = kernel == "readable"
    kwargs = dict(output_attentions=readable, output_hidden_states=readable)
    with torch.no_grad(), (kernels.readable() if readable else contextlib.nullcontext()):
        ours = model(torch.from_numpy(ids), _t(attention_mask), attn_mask=_t(attn_mask), **kwargs)
    theirs = mirror(ids, attention_mask, attn_mask=attn_mask, **kwargs)
    assert_close(ours.last_hidden_state, theirs.last_hidden_state, dtype, what="last_hidden_state")
    if not readable:
        return
    assert_close(ours.last_hidden_state, theirs.last_hidden_state, dtype, what="last_hidden_state")
    assert len(ours.hidden_states) == len(theirs.hidden_states) == config.n_layers + 1
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states, strict=True)):
        assert_close(a, b, dtype, what=f"hidden_states[{i}]")
    for i, (a, b) in enumerate(zip(ours.attentions, theirs.attentions, strict=True)):
        assert_close(a, b, dtype, what=f"attentions[{i}]")
    assert np.isfinite(theirs.last_hidden_state).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_encoder_on_embeddings_matches_reference(tiny_config, dtype):
    config = tiny_config.replace(vocab_size=None)
    model, mirror = _pair(Encoder, ref.Encoder, config, dtype)
    x = np.random.default_rng(1).standard_normal((B, S, config.d_model)).astype(dtype)
    mask = padding_mask([S, 4, 7], S)
    with torch.no_grad():
        ours = model(torch.from_numpy(x), torch.from_numpy(mask)).last_hidden_state
    assert_close(ours, mirror(x, mask).last_hidden_state, dtype, what="last_hidden_state")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_bert_style_encoder_matches_reference(tiny_config, dtype):
    config = tiny_config.replace(positional="learned", type_vocab_size=2, embedding_norm=True,
                                 scale_embeddings=False, pooler=True, activation="gelu",
                                 attention_dropout=0.1, layer_norm_eps=1e-12)
    model, mirror = _pair(Encoder, ref.Encoder, config, dtype)
    rng = np.random.default_rng(2)
    ids, types = rng.integers(0, 50, (B, S)), rng.integers(0, 2, (B, S))
    mask = padding_mask([S, 3, 6], S)
    with torch.no_grad():
        ours = model(torch.from_numpy(ids), torch.from_numpy(mask),
                     token_type_ids=torch.from_numpy(types))
    theirs = mirror(ids, mask, token_type_ids=types)
    assert_close(ours.last_hidden_state, theirs.last_hidden_state, dtype, what="last_hidden_state")
    assert_close(ours.pooler_output, theirs.pooler_output, dtype, what="pooler_output")


@pytest.mark.parametrize("dtype,norm_first,shared", list(itertools.product(
    [np.float64, np.float32], [False, True], [True, False])))
def test_seq2seq_matches_reference(tiny_config, dtype, norm_first, shared):
    config = tiny_config.replace(norm_first=norm_first, final_norm=norm_first,
                                 tgt_vocab_size=None if shared else 40, tie_output=shared,
                                 n_decoder_layers=3)
    model, mirror = _pair(Seq2SeqTransformer, ref.Seq2SeqTransformer, config, dtype)
    rng = np.random.default_rng(3)
    src = rng.integers(0, 50, (B, S))
    tgt = rng.integers(0, config.target_vocab_size, (B, T))
    src_mask, tgt_mask = padding_mask([S, 4, 7], S), padding_mask([T, T, 2], T)
    with torch.no_grad():
        ours = model(torch.from_numpy(src), torch.from_numpy(tgt), torch.from_numpy(src_mask),
                     torch.from_numpy(tgt_mask), output_attentions=True)
    theirs = mirror(src, tgt, src_mask, tgt_mask, output_attentions=True)
    assert_close(ours.logits, theirs.logits, dtype, what="logits")
    for name in ("decoder_attentions", "cross_attentions"):
        for a, b in zip(getattr(ours, name), getattr(theirs, name), strict=True):
            assert_close(a, b, dtype, what=name)


@pytest.mark.parametrize("shared", [True, False])
def test_decode_without_the_projection_gives_the_hidden_state_both_engines(tiny_config, shared):
    """decode(..., project=False): no logits, and the decoder's last hidden state, whose product
    with output_weight is decode's logits; the same in the NumPy mirror (float64)."""
    config = tiny_config.replace(tgt_vocab_size=None if shared else 40, tie_output=shared)
    model, mirror = _pair(Seq2SeqTransformer, ref.Seq2SeqTransformer, config, np.float64)
    rng = np.random.default_rng(6)
    src, tgt = rng.integers(0, 50, (B, S)), rng.integers(0, config.target_vocab_size, (B, T))
    with torch.no_grad():
        memory = model.encode(torch.from_numpy(src)).last_hidden_state
        whole = model.decode(torch.from_numpy(tgt), memory)
        bare = model.decode(torch.from_numpy(tgt), memory, project=False)
    assert whole.decoder_last_hidden_state is None and bare.logits is None
    assert_close(bare.decoder_last_hidden_state @ model.output_weight.T, whole.logits.numpy(),
                 np.float64, what="hidden x output weight")
    theirs = mirror.decode(tgt, mirror.encode(src).last_hidden_state, project=False)
    assert theirs.logits is None
    assert_close(bare.decoder_last_hidden_state, theirs.decoder_last_hidden_state, np.float64,
                 what="hidden")


@pytest.mark.parametrize("grow_cache", [True, False])
def test_decoder_cache_matches_reference(tiny_config, grow_cache):
    """Step-by-step decoding with the cache, PyTorch vs NumPy (float64); with grow_cache=False
    each step returns its new positions only, which the caller appends (tformer.nn.cache.grow,
    np.concatenate)."""
    config = tiny_config.replace(vocab_size=None)
    model, mirror = _pair(Decoder, ref.Decoder, config, np.float64)
    rng = np.random.default_rng(4)
    memory = rng.standard_normal((B, S, config.d_model))
    y = rng.standard_normal((B, T, config.d_model))
    mem_mask = padding_mask([S, 4, 7], S)
    past_t = past_r = None
    for i in range(T):
        with torch.no_grad():
            out_t = model(torch.from_numpy(y[:, i : i + 1]), torch.from_numpy(memory),
                          memory_attention_mask=torch.from_numpy(mem_mask),
                          past_key_values=past_t, use_cache=True, grow_cache=grow_cache)
        out_r = mirror(y[:, i : i + 1], memory, memory_attention_mask=mem_mask,
                       past_key_values=past_r, use_cache=True, grow_cache=grow_cache)
        assert_close(out_t.last_hidden_state, out_r.last_hidden_state, np.float64, what=f"step {i}")
        for new_t, new_r in zip(out_t.past_key_values, out_r.past_key_values, strict=True):
            assert_close(new_t[0], new_r[0], np.float64, what=f"step {i} keys")
        if grow_cache or past_t is None:
            past_t, past_r = out_t.past_key_values, out_r.past_key_values
        else:
            past_t = grow(past_t, out_t.past_key_values)
            past_r = tuple((np.concatenate([p[0], n[0]], axis=2), np.concatenate([p[1], n[1]], axis=2),
                            *p[2:]) for p, n in zip(past_r, out_r.past_key_values, strict=True))


@pytest.mark.parametrize("changes", [{"pooling": "cls"}, {"pooling": "mean"},
                                     {"pooler": True, "type_vocab_size": 2}])
def test_classifier_matches_reference(tiny_config, changes):
    config = tiny_config.replace(n_classes=5, **changes)
    model, mirror = _pair(EncoderClassifier, ref.EncoderClassifier, config, np.float64)
    ids = np.random.default_rng(5).integers(0, 50, (B, S))
    mask = padding_mask([S, 2, 5], S)
    with torch.no_grad():
        ours = model(torch.from_numpy(ids), torch.from_numpy(mask)).logits
    assert_close(ours, mirror(ids, mask).logits, np.float64, what="logits")


def test_reference_loads_safetensors(tiny_config, tmp_path):
    from safetensors.torch import save_file

    model, _ = _pair(Encoder, ref.Encoder, tiny_config, np.float32)
    save_file(model.state_dict(), tmp_path / "model.safetensors")
    mirror = ref.Encoder(tiny_config, np.float32)
    mirror.load_safetensors(tmp_path / "model.safetensors")
    ids = np.random.default_rng(6).integers(0, 50, (B, S))
    with torch.no_grad():
        ours = model(torch.from_numpy(ids)).last_hidden_state
    assert_close(ours, mirror(ids).last_hidden_state, np.float32, what="last_hidden_state")
