"""Encoder/Decoder behaviour: invariants (hypothesis), dropout, gradients, bad input, sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_close, copy_weights, padding_mask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tformer import TransformerConfig
from tformer.nn.model import Encoder, EncoderClassifier, Seq2SeqTransformer

# tiny_config is frozen, so sharing it across generated examples is safe.
PROPERTY = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _encoder(config: TransformerConfig, **changes) -> Encoder:
    """float32, the DEFAULT path users run (fused linear, SDPA, packed execution)."""
    return Encoder(config.replace(**changes)).eval()


# Invariants ------------------------------------------------------------------------------
@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), seq=st.integers(2, 12), norm_first=st.booleans())
def test_permutation_equivariant_without_positions(tiny_config, seed, seq, norm_first):
    """With no positional information, attention is a set operation (§3.5 is why positions exist)."""
    enc = _encoder(tiny_config, positional="none", norm_first=norm_first)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (2, seq), generator=g)
    perm = torch.randperm(seq, generator=g)
    with torch.no_grad():
        out = enc(ids).last_hidden_state
        out_perm = enc(ids[:, perm]).last_hidden_state
    assert_close(out[:, perm], out_perm, np.float32, what="permuted output")


@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), lengths=st.lists(st.integers(1, 10), min_size=1,
                                                         max_size=4))
def test_padding_contents_do_not_matter(tiny_config, seed, lengths):
    enc = _encoder(tiny_config)
    g = torch.Generator().manual_seed(seed)
    mask = torch.from_numpy(padding_mask(lengths, 10))
    ids = torch.randint(0, 50, (len(lengths), 10), generator=g)
    other = torch.where(mask, ids, torch.randint(0, 50, ids.shape, generator=g))
    with torch.no_grad():
        a = enc(ids, mask).last_hidden_state
        b = enc(other, mask).last_hidden_state
    assert_close(a, b, np.float32, what="outputs (zeros at padding)")


@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), lengths=st.lists(st.integers(1, 10), min_size=2,
                                                         max_size=4))
def test_batch_rows_are_independent(tiny_config, seed, lengths):
    enc = _encoder(tiny_config)
    g = torch.Generator().manual_seed(seed)
    mask = torch.from_numpy(padding_mask(lengths, 10))
    ids = torch.randint(0, 50, (len(lengths), 10), generator=g)
    with torch.no_grad():
        batched = enc(ids, mask).last_hidden_state
        for i in range(len(lengths)):
            alone = enc(ids[i : i + 1], mask[i : i + 1]).last_hidden_state
            assert_close(batched[i : i + 1], alone, np.float32, what=f"row {i}")


@PROPERTY
@given(seed=st.integers(0, 2**31 - 1), norm_first=st.booleans(), fused=st.booleans())
def test_fully_masked_rows_are_finite(tiny_config, seed, norm_first, fused):
    enc = Encoder(tiny_config.replace(norm_first=norm_first, dropout=0.0))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (2, 6), generator=g)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0, :3] = True  # row 1 has no real token at all
    out = enc(ids, mask, output_attentions=not fused).last_hidden_state
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in enc.parameters() if p.grad is not None)


@pytest.mark.parametrize("path", ["packed", "padded", "weights", "reference"])
def test_nan_or_inf_stored_at_padding_reaches_no_real_token(tiny_config, path):
    """Embeddings passed in may hold anything at padding (0 x NaN is NaN in weights @ v): each
    row's real tokens equal that row run alone, unpadded, on every path; the encoder's input,
    a decoder's left-padded target and its memory alike. float64, tolerance 1e-10; no positions,
    so that a left-padded row alone is the same sequence."""
    from tformer import reference
    from tformer.nn.model import Decoder

    torch.manual_seed(0)
    config = tiny_config.replace(vocab_size=None, dropout=0.0, positional="none")
    enc, dec = Encoder(config).eval().double(), Decoder(config).eval().double()
    lengths = [3, 5]
    mask = torch.from_numpy(padding_mask(lengths, 5))  # (B, S)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    x[0, 3], x[0, 4] = float("nan"), float("inf")  # at padding
    kwargs = {"padded": {"skip_padding": False}, "weights": {"output_attentions": True}}.get(path, {})
    if path == "reference":
        mirrors = reference.Encoder(config, dtype=np.float64), reference.Decoder(config, dtype=np.float64)
        copy_weights(enc, mirrors[0]), copy_weights(dec, mirrors[1])
        run_enc = lambda x, m: torch.from_numpy(mirrors[0](x.numpy(), m.numpy()).last_hidden_state)  # noqa: E731
        run_dec = lambda y, mem, ym, mm: torch.from_numpy(mirrors[1](  # noqa: E731
            y.numpy(), mem.numpy(), ym.numpy(), mm.numpy()).last_hidden_state)
    else:
        run_enc = lambda x, m: enc(x, m, **kwargs).last_hidden_state  # noqa: E731
        run_dec = lambda y, mem, ym, mm: dec(  # noqa: E731
            y, mem, ym, mm, output_attentions=path == "weights").last_hidden_state
    y = torch.randn(2, 5, 32, dtype=torch.float64)
    y[0, :2] = float("nan")  # the target's padding, on the left as in batched generation
    y_mask = mask.flip(1)
    with torch.no_grad():
        out, dec_out = run_enc(x, mask), run_dec(y, x, y_mask, mask)
        for i, n in enumerate(lengths):
            real = torch.ones(1, n, dtype=torch.bool)
            alone = run_enc(x[i : i + 1, :n], real)
            assert_close(out[i : i + 1, :n], alone, np.float64, what=f"encoder row {i}")
            alone = run_dec(y[i : i + 1, 5 - n :], x[i : i + 1, :n], real, real)
            assert_close(dec_out[i : i + 1, 5 - n :], alone, np.float64, what=f"decoder row {i}")


def test_query_with_nothing_to_attend_gets_zero_attention(tiny_config):
    from tformer.nn.attention import scaled_dot_product_attention

    q, k, v = (torch.randn(1, 2, 3, 4) for _ in range(3))
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    for need_weights in (False, True):
        out, weights = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
        assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 4))
        if need_weights:
            assert torch.equal(weights[:, :, 1], torch.zeros(1, 2, 3))


# Training behaviour ----------------------------------------------------------------------
def test_dropout_active_in_train_mode_only(tiny_config):
    enc = Encoder(tiny_config.replace(dropout=0.3, attention_dropout=0.2))
    ids = torch.randint(0, 50, (2, 8))
    enc.train()
    a, b = enc(ids).last_hidden_state, enc(ids).last_hidden_state
    assert not torch.allclose(a, b), "train mode: two passes should differ"
    enc.eval()
    with torch.no_grad():
        assert torch.equal(enc(ids).last_hidden_state, enc(ids).last_hidden_state)


@pytest.mark.parametrize("model", ["encoder", "seq2seq", "classifier"])
def test_gradients_reach_every_parameter(tiny_config, model):
    config = tiny_config.replace(type_vocab_size=2, embedding_norm=True, pooler=True,
                                 final_norm=True, positional="learned", n_classes=3)
    ids = torch.randint(0, 50, (2, 7))
    if model == "encoder":
        m = Encoder(config)
        out = m(ids, token_type_ids=torch.ones_like(ids))
        loss = out.last_hidden_state.sum() + out.pooler_output.sum()
    elif model == "seq2seq":
        m = Seq2SeqTransformer(config.replace(type_vocab_size=0, pooler=False, tie_output=False,
                                              tgt_vocab_size=30))
        loss = m(ids, torch.randint(0, 30, (2, 5))).logits.sum()
    else:
        m = EncoderClassifier(config.replace(pooler=False))
        loss = m(ids, token_type_ids=torch.ones_like(ids)).logits.sum()
    loss.backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert not missing, f"no gradient reached {missing}"


def test_kv_cache_matches_full_forward(tiny_config):
    model = Seq2SeqTransformer(tiny_config.replace(norm_first=True, final_norm=True)).eval()
    src, tgt = torch.randint(0, 50, (2, 9)), torch.randint(0, 50, (2, 8))
    src_mask = torch.from_numpy(padding_mask([9, 4]))
    with torch.no_grad():
        full = model(src, tgt, src_mask).logits
        memory = model.encode(src, src_mask).last_hidden_state
        past, steps = None, []
        for i in range(tgt.size(1)):
            out = model.decode(tgt[:, i : i + 1], memory, src_mask, past_key_values=past,
                               use_cache=True)
            past = out.past_key_values
            steps.append(out.logits)
    assert_close(torch.cat(steps, dim=1), full, np.float32, what="cached logits")


# Bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("make_input,error,words", [
    (lambda: torch.randint(0, 50, (2, 3, 4)), ValueError, ["x", "(B, S)", "(2, 3, 4)"]),
    (lambda: torch.randn(2, 5), TypeError, ["x", "integer", "float32"]),
    (lambda: torch.randint(50, 60, (2, 5)), ValueError, ["x", "[0, 50)", "59"]),
])
def test_bad_token_ids(tiny_config, make_input, error, words):
    with pytest.raises(error) as e:
        Encoder(tiny_config)(make_input())
    for w in words:
        assert w in str(e.value)


def test_bad_embeddings(tiny_config):
    enc = Encoder(tiny_config.replace(vocab_size=None))
    with pytest.raises(ValueError, match=r"x: expected shape \(B, S, D\) with D = 32, got \(2, 5, 16\)"):
        enc(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=r"x: expected shape \(B, S, D\).*got \(5, 32\)"):
        enc(torch.randn(5, 32))


def test_bad_masks(tiny_config):
    enc = Encoder(tiny_config)
    ids = torch.randint(0, 50, (2, 5))
    with pytest.raises(ValueError, match=r"attention_mask: expected shape \(B, S\) = \(2, 5\), got \(2, 6\)"):
        enc(ids, torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask: .*\(2, 5, 5\) or \(B, 1, T, S\), got \(3, 5, 5\)"):
        enc(ids, attn_mask=torch.ones(3, 5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="attention_mask: expected a bool or 0/1 integer mask"):
        enc(ids, torch.zeros(2, 5))



@pytest.mark.parametrize("impl", ["torch", "reference"])
def test_a_bad_source_or_memory_mask_is_named_as_the_caller_passed_it(tiny_config, impl):
    """Seq2SeqTransformer's src_attention_mask and tgt_attention_mask, and Decoder's
    memory_attention_mask: the error names the argument given, not the layers' attention_mask."""
    from tformer import reference

    cls, to = ((Seq2SeqTransformer, torch.from_numpy) if impl == "torch"
               else (reference.Seq2SeqTransformer, np.asarray))
    model = cls(tiny_config)
    src, tgt, wide = (to(np.zeros(shape, dtype=np.int64)) for shape in ((2, 4), (2, 3), (2, 5)))
    with pytest.raises(ValueError, match=r"^src_attention_mask: expected shape \(B, S\) = \(2, 4\), got \(2, 5\)$"):
        model(src, tgt, src_attention_mask=wide == 0)
    memory = model.encode(src).last_hidden_state  # (2, 4, D)
    with pytest.raises(ValueError, match=r"^memory_attention_mask: expected shape \(B, S\) = \(2, 4\), got \(2, 5\)$"):
        model.decode(tgt, memory, memory_attention_mask=wide == 0)
    for call in (lambda: model(src, tgt, tgt_attention_mask=wide == 0),
                 lambda: model.decode(tgt, memory, tgt_attention_mask=wide == 0)):
        with pytest.raises(ValueError, match=r"^tgt_attention_mask: expected shape \(B, S\) = \(2, 3\), got \(2, 5\)$"):
            call()


def test_sequence_longer_than_learned_positions(tiny_config):
    enc = Encoder(tiny_config.replace(positional="learned", max_len=8))
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_len 8"):
        enc(torch.randint(0, 50, (1, 9)))
    # Sinusoids have no such limit: they extend.
    assert Encoder(tiny_config.replace(max_len=8))(torch.randint(0, 50, (1, 9))) is not None


# Sizes -----------------------------------------------------------------------------------
def test_parameter_count_of_paper_base_encoder():
    """Table 3 "base": d 512, 8 heads, ff 2048, 6 layers; counted by hand."""
    d, f, n = 512, 2048, 6
    attention = 3 * d * d + 3 * d + d * d + d  # fused qkv + output projection, with biases
    ffn = d * f + f + f * d + d
    norms = 2 * 2 * d
    expected = n * (attention + ffn + norms)
    assert expected == 18_914_304
    enc = Encoder(TransformerConfig(d_model=d, n_heads=8, d_ff=f, n_layers=n))
    assert sum(p.numel() for p in enc.parameters()) == expected


def test_token_types_cannot_be_passed_positionally_as_a_mask(tiny_config):
    """Issue 4's call order (ids, mask, token_type_ids) must fail loudly, not mask silently."""
    enc = Encoder(tiny_config.replace(type_vocab_size=2))
    ids = torch.randint(0, 50, (2, 2))
    with pytest.raises(TypeError):
        enc(ids, torch.ones(2, 2, dtype=torch.bool), torch.zeros(2, 2, dtype=torch.long))
    assert enc(ids, torch.ones(2, 2, dtype=torch.bool),
               token_type_ids=torch.zeros(2, 2, dtype=torch.long)).last_hidden_state.shape == (2, 2, 32)


@pytest.mark.parametrize("cls", [Encoder, EncoderClassifier, Seq2SeqTransformer])
@pytest.mark.parametrize("config, message", [
    (5, r"^config: expected a TransformerConfig, got int$"),
    ({"d_model": 16}, r"^config: expected a TransformerConfig, got dict \(TransformerConfig\.from_dict reads a "
                      r"dict\)$"),
])
def test_a_model_refuses_a_config_of_another_type(cls, config, message):
    # Was "'int' object has no attribute 'vocab_size'" (or 'n_classes').
    with pytest.raises(TypeError, match=message):
        cls(config)
