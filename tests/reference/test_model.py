"""Backward of whole NumPy models against torch autograd, and against finite differences.

float64; metric per tensor: max |ours - torch| / max |torch| <= 1e-9 (helpers.GRAD_RTOL),
for every parameter (keys as the state dict). Batches hold padding and a row that is all
padding, so its queries may attend to nothing: their gradients must be finite and equal
to torch's.
"""

import itertools

import numpy as np
import pytest
import torch
from helpers import (
    GRAD_RTOL,
    assert_grads_match,
    copy_weights,
    finite_difference,
    padding_mask,
    relative_error,
)

from tformer import TransformerConfig
from tformer import reference as ref
from tformer.nn import model as torch_model

# Small tensors: one torch thread is as fast, and polite to a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")

B, S, T = 3, 7, 5


def _config(**changes):
    base = dict(d_model=16, n_heads=4, d_ff=32, n_layers=2, dropout=0.1, max_len=32,
                vocab_size=20)
    return TransformerConfig(**{**base, **changes})


def _pair(name, config):
    theirs = getattr(torch_model, name)(config).double().eval()
    ours = getattr(ref, name)(config, np.float64)
    copy_weights(theirs, ours)
    return theirs, ours


def _backprop(out, rng):
    """sum(out * g) for a random g: the backward pass starts from dout = g."""
    g = rng.standard_normal(tuple(out.shape))
    (out * torch.from_numpy(g)).sum().backward()
    return g


ENCODERS = list(itertools.product([False, True], ["relu", "gelu_tanh"],
                                  ["sinusoidal", "learned"], [False, True]))


@pytest.mark.parametrize(("norm_first", "activation", "positional", "padded"), ENCODERS)
def test_encoder_backward_matches_torch(norm_first, activation, positional, padded):
    config = _config(norm_first=norm_first, final_norm=norm_first, activation=activation,
                     positional=positional)
    theirs, ours = _pair("Encoder", config)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 20, (B, S))
    mask = padding_mask([S, 4, 0], S) if padded else None  # row 2 attends to nothing
    out = theirs(torch.from_numpy(ids), None if mask is None else torch.from_numpy(mask))
    g = _backprop(out.last_hidden_state, rng)
    mine, cache = ours.forward_train(ids, mask)
    assert relative_error(mine.last_hidden_state, out.last_hidden_state) <= GRAD_RTOL
    grads = ours.zero_grads()
    assert ours.backward(g, cache, grads) is None  # token ids have no gradient
    assert_grads_match(grads, theirs, "Encoder")


def test_bert_style_encoder_backward_matches_torch():
    """Token types, embedding LayerNorm, no sqrt(D) scale, gelu and the tanh pooler."""
    config = _config(type_vocab_size=2, embedding_norm=True, pooler=True, scale_embeddings=False,
                     activation="gelu", positional="learned")
    theirs, ours = _pair("Encoder", config)
    rng = np.random.default_rng(0)
    ids, types = rng.integers(0, 20, (B, S)), rng.integers(0, 2, (B, S))
    mask = padding_mask([S, 4, 0], S)
    out = theirs(torch.from_numpy(ids), torch.from_numpy(mask), token_type_ids=torch.from_numpy(types))
    g = rng.standard_normal(tuple(out.last_hidden_state.shape))
    g_pooled = rng.standard_normal(tuple(out.pooler_output.shape))
    loss = (out.last_hidden_state * torch.from_numpy(g)).sum()
    (loss + (out.pooler_output * torch.from_numpy(g_pooled)).sum()).backward()
    mine, cache = ours.forward_train(ids, mask, token_type_ids=types)
    assert relative_error(mine.pooler_output, out.pooler_output) <= GRAD_RTOL
    grads = ours.zero_grads()
    ours.backward(g, cache, grads, dpooled=g_pooled)
    assert_grads_match(grads, theirs, "BERT-style Encoder")


def test_encoder_on_embeddings_returns_their_gradient():
    config = _config(vocab_size=None)
    theirs, ours = _pair("Encoder", config)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, S, 16))
    tx = torch.from_numpy(x).requires_grad_()
    g = _backprop(theirs(tx).last_hidden_state, rng)
    _, cache = ours.forward_train(x)
    grads = ours.zero_grads()
    assert relative_error(ours.backward(g, cache, grads), tx.grad) <= GRAD_RTOL
    assert_grads_match(grads, theirs, "Encoder on embeddings")


SEQ2SEQ = list(itertools.product([False, True], ["shared", "separate", "untied"]))


@pytest.mark.parametrize(("norm_first", "vocab"), SEQ2SEQ)
def test_seq2seq_backward_matches_torch(norm_first, vocab):
    config = _config(norm_first=norm_first, final_norm=norm_first,
                     tgt_vocab_size=None if vocab == "shared" else 13, tie_output=vocab != "untied")
    theirs, ours = _pair("Seq2SeqTransformer", config)
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(0, 20, (B, S)), rng.integers(0, config.target_vocab_size, (B, T))
    src_mask, tgt_mask = padding_mask([S, 4, 0], S), padding_mask([T, 2, 1], T)
    logits = theirs(*(torch.from_numpy(a) for a in (src, tgt, src_mask, tgt_mask))).logits
    g = _backprop(logits, rng)
    mine, cache = ours.forward_train(src, tgt, src_mask, tgt_mask)
    assert relative_error(mine, logits) <= GRAD_RTOL
    grads = ours.zero_grads()
    ours.backward(g, cache, grads)
    assert_grads_match(grads, theirs, f"Seq2SeqTransformer ({vocab})")


@pytest.mark.parametrize(("norm_first", "pooling", "padded"),
                         list(itertools.product([False, True], ["cls", "mean"], [False, True])))
def test_classifier_backward_matches_torch(norm_first, pooling, padded):
    config = _config(norm_first=norm_first, final_norm=norm_first, n_classes=3, pooling=pooling)
    theirs, ours = _pair("EncoderClassifier", config)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 20, (B, S))
    mask = padding_mask([S, 4, 0], S) if padded else None
    logits = theirs(torch.from_numpy(ids), None if mask is None else torch.from_numpy(mask)).logits
    g = _backprop(logits, rng)
    mine, cache = ours.forward_train(ids, mask)
    assert relative_error(mine, logits) <= GRAD_RTOL
    grads = ours.zero_grads()
    ours.backward(g, cache, grads)
    assert_grads_match(grads, theirs, "EncoderClassifier")


def test_classifier_with_bert_pooler_backward_matches_torch():
    """config.pooler: the head reads the pooler's output, and its gradient reaches the pooler."""
    config = _config(n_classes=3, pooler=True, type_vocab_size=2, embedding_norm=True,
                     positional="learned", scale_embeddings=False)
    theirs, ours = _pair("EncoderClassifier", config)
    rng = np.random.default_rng(1)
    ids, mask = rng.integers(0, 20, (B, S)), padding_mask([S, 4, 1], S)
    logits = theirs(torch.from_numpy(ids), torch.from_numpy(mask)).logits
    g = _backprop(logits, rng)
    mine, cache = ours.forward_train(ids, mask)
    assert relative_error(mine, logits) <= GRAD_RTOL
    grads = ours.zero_grads()
    ours.backward(g, cache, grads)
    assert_grads_match(grads, theirs, "EncoderClassifier with pooler")


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_backward_matches_finite_differences_with_dropout(pooling):
    """Through the dropout before the head too: a fixed seed draws the same masks each call."""
    config = _config(n_classes=3, pooling=pooling, attention_dropout=0.1)
    ours = ref.EncoderClassifier(config, np.float64)
    rng = np.random.default_rng(0)
    for value in ours.state_dict().values():
        value[...] = rng.standard_normal(value.shape) * 0.3 + (value if value.ndim == 1 else 0)
    ids, mask = rng.integers(0, 20, (B, S)), padding_mask([S, 4, 2], S)
    g = rng.standard_normal((B, 3))

    def loss():
        logits, _ = ours.forward_train(ids, mask, rng=np.random.default_rng(5))
        return float((logits * g).sum())

    logits, cache = ours.forward_train(ids, mask, rng=np.random.default_rng(5))
    assert not np.allclose(logits, ours(ids, mask).logits)  # dropout drew something
    grads = ours.zero_grads()
    ours.backward(g, cache, grads)
    state = ours.state_dict()
    for key in ["head.weight", "head.bias", "encoder.layers.1.ffn.down.weight", "encoder.tok_emb.weight"]:
        for index in [tuple(rng.integers(0, n) for n in state[key].shape) for _ in range(3)]:
            fd = finite_difference(loss, state[key], index)
            assert abs(fd - grads[key][index]) <= 1e-7 * max(1.0, abs(fd)), (key, index)


@pytest.mark.parametrize("norm_first", [False, True])
def test_seq2seq_backward_matches_finite_differences_with_dropout(norm_first):
    """Independent of torch, and through dropout: a fixed seed draws the same masks on every
    call, so the loss is a smooth function of the weights and central differences
    (h = 1e-6) must agree with the backward pass to ~1e-7 relative."""
    config = _config(norm_first=norm_first, final_norm=norm_first, attention_dropout=0.1,
                     positional="learned")
    ours = ref.Seq2SeqTransformer(config, np.float64)
    rng = np.random.default_rng(0)
    for value in ours.state_dict().values():
        value[...] = rng.standard_normal(value.shape) * 0.3 + (value if value.ndim == 1 else 0)
    src, tgt = rng.integers(0, 20, (B, S)), rng.integers(0, 20, (B, T))
    src_mask, tgt_mask = padding_mask([S, 4, 0], S), padding_mask([T, 2, 1], T)
    g = rng.standard_normal((B, T, 20))

    def loss():
        logits, _ = ours.forward_train(src, tgt, src_mask, tgt_mask, np.random.default_rng(5))
        return float((logits * g).sum())

    _, cache = ours.forward_train(src, tgt, src_mask, tgt_mask, np.random.default_rng(5))
    grads = ours.zero_grads()
    ours.backward(g, cache, grads)
    state = ours.state_dict()
    checked = ["src_emb.weight", "encoder.layers.0.self_attn.qkv_proj.weight",
               "encoder.layers.1.ffn_norm.weight", "decoder.layers.0.cross_attn.kv_proj.weight",
               "decoder.layers.1.self_attn.out_proj.bias", "decoder.pos_emb.weight"]
    for key in checked:
        for index in [tuple(rng.integers(0, n) for n in state[key].shape) for _ in range(3)]:
            fd = finite_difference(loss, state[key], index)
            assert abs(fd - grads[key][index]) <= 1e-7 * max(1.0, abs(fd)), (key, index)


EDGES = [  # (d_model, n_heads, lengths): one head; D not a power of two; length-1 rows
    (15, 1, [4, 1, 0]),
    (12, 3, [1, 0]),
    (12, 3, [1]),
]


@pytest.mark.parametrize(("d_model", "n_heads", "lengths"), EDGES)
@pytest.mark.parametrize("norm_first", [False, True])
def test_edge_shapes_backward_match_torch(d_model, n_heads, lengths, norm_first):
    """Encoder, classifier (mean pooling) and seq2seq at the edges, dropout 0: gradients
    finite and equal to torch's (an all-padding row has a query that attends to nothing).
    Where torch's gradient is rounding noise on an exact zero (a single key makes the
    softmax constant, so a query gets no gradient) ours must be within 1e-12 of 0."""
    config = _config(d_model=d_model, n_heads=n_heads, d_ff=2 * d_model + 1, dropout=0.0,
                     norm_first=norm_first, final_norm=norm_first, n_classes=3, pooling="mean",
                     positional="learned", activation="gelu")
    rng = np.random.default_rng(0)
    b, s = len(lengths), max(lengths)
    ids, mask = rng.integers(0, 20, (b, s)), padding_mask(lengths, s)
    tgt, tgt_mask = rng.integers(0, 20, (b, s)), padding_mask([min(n + 1, s) for n in lengths], s)
    calls = {
        "Encoder": (lambda m, *a: m(*a).last_hidden_state, (ids, mask)),
        "EncoderClassifier": (lambda m, *a: m(*a).logits, (ids, mask)),
        "Seq2SeqTransformer": (lambda m, *a: m(*a).logits, (ids, tgt, mask, tgt_mask)),
    }
    for name, (output, args) in calls.items():
        theirs, ours = _pair(name, config)
        g = _backprop(output(theirs, *map(torch.from_numpy, args)), rng)
        mine, cache = ours.forward_train(*args)
        grads = ours.zero_grads()
        ours.backward(g, cache, grads)
        assert relative_error(mine.last_hidden_state if name == "Encoder" else mine,
                              output(theirs, *map(torch.from_numpy, args))) <= GRAD_RTOL, name
        assert set(grads) == {key for key, _ in theirs.named_parameters()}, name
        for key, p in theirs.named_parameters():
            assert np.isfinite(grads[key]).all(), (name, key)
            if p.grad.abs().max() <= 1e-14:
                assert np.abs(grads[key]).max() <= 1e-12, (name, key)
            else:
                assert relative_error(grads[key], p.grad) <= GRAD_RTOL, (name, key)


def test_decoder_names_a_cache_of_the_wrong_depth_as_torch_does():
    """past_key_values holding fewer layers than the decoder: one line naming it, in NumPy as
    in PyTorch (it was an IndexError, and extra layers were silently ignored)."""
    config = _config(vocab_size=None)
    theirs, ours = _pair("Decoder", config)
    x, memory = np.ones((1, 1, 16)), np.ones((1, 3, 16))
    past = ours(x, memory, use_cache=True).past_key_values
    torch_past = theirs(torch.from_numpy(x), torch.from_numpy(memory), use_cache=True).past_key_values
    for model, cache, to in ((ours, past, np.asarray), (theirs, torch_past, torch.from_numpy)):
        for wrong in (cache[:1], cache + cache[:1]):
            with pytest.raises(ValueError, match=r"^past_key_values: expected 2 layers, got [13]$"):
                model(to(x), to(memory), past_key_values=wrong)
