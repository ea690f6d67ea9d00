"""tformer.formats.hf_xlm: a classifier without BERT's pooler as transformers'
XLMForSequenceClassification. Parity against the real class (random weights, no download):
the same logits on unpadded inputs; a padded batch differs (the export's stated limit)."""

from __future__ import annotations

import re

import pytest
import torch

from tformer.config import TransformerConfig, bert_layout
from tformer.formats import hf_xlm
from tformer.nn.model import EncoderClassifier
from tformer.nn.positional import sinusoidal_table

TOLERANCE = 1e-5  # logits, float32


def _classifier(pooling: str = "mean", **changes) -> EncoderClassifier:
    """A tiny BERT-layout classifier with every table and norm away from its initial values."""
    config = bert_layout(TransformerConfig(d_model=32, n_heads=4, d_ff=128, n_layers=2), max_len=24,
                         vocab_size=50, n_classes=3, pooling=pooling, pooler=False, **changes)
    model = EncoderClassifier(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "type_emb" in name or name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    return model


def _xlm(model: EncoderClassifier, token_types: bool):
    from transformers import XLMConfig, XLMForSequenceClassification

    hf = hf_xlm.config_to_hf(model.config, ["a", "b", "c"], pad_id=0, bos_id=1, eos_id=2)
    theirs = XLMForSequenceClassification(XLMConfig(**hf)).eval()
    c = model.config  # a sinusoidal model keeps no table: the export passes the one it adds
    sinusoids = sinusoidal_table(c.max_len, c.d_model) if c.positional == "sinusoidal" else None
    state = hf_xlm.to_hf(model.state_dict(), model.config, token_types, sinusoids)
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert (missing, unexpected) == ([], [])  # the key sets match
    return theirs


def _inputs(length: int, pair: bool, seed: int = 0):
    ids = torch.randint(1, 50, (1, length), generator=torch.Generator().manual_seed(seed))  # (1, S), no pad
    types = torch.zeros_like(ids)
    if pair:
        types[:, length // 2:] = 1
    return ids, types


@pytest.mark.parametrize("changes", [{}, {"positional": "sinusoidal", "scale_embeddings": True},
                                     {"positional": "none", "activation": "relu"}, {"type_vocab_size": 0},
                                     {"d_ff": 40}, {"d_ff": 40, "activation": "relu"}],
                         ids=["bert-layout", "sinusoids-scaled", "no-positions-relu", "no-types", "narrow-ffn",
                              "narrow-ffn-relu"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
@pytest.mark.parametrize("token_types", [False, True])
def test_xlm_gives_the_classifiers_logits_on_unpadded_inputs(changes, pooling, token_types):
    model = _classifier(pooling, **changes)
    token_types = token_types and model.config.type_vocab_size >= 2
    theirs = _xlm(model, token_types)
    worst = 0.0
    for length in (1, 2, 7, 24):
        ids, types = _inputs(length, pair=token_types)
        with torch.no_grad():
            ours = model(ids, torch.ones_like(ids), types if model.config.type_vocab_size else None).logits
            got = theirs(input_ids=ids, attention_mask=torch.ones_like(ids),
                         **({"token_type_ids": types} if token_types else {})).logits
        worst = max(worst, (got - ours).abs().max().item())
    assert worst <= TOLERANCE, f"max |logits difference| {worst:.2e}"


def test_a_padded_batch_averages_over_its_padding_in_xlm_the_stated_limit():
    """XLMSequenceSummary's mean runs over every position: the unpadded row agrees, the padded
    one does not (mean pooling); the first-token summary ("cls") agrees on both."""
    ids = torch.randint(1, 50, (2, 10), generator=torch.Generator().manual_seed(0))  # (2, S)
    mask = torch.ones_like(ids)
    mask[1, 6:], ids[1, 6:] = 0, 0
    for pooling in ("mean", "cls"):
        model = _classifier(pooling)
        theirs = _xlm(model, token_types=False)
        with torch.no_grad():
            diff = (theirs(input_ids=ids, attention_mask=mask).logits - model(ids, mask).logits).abs().amax(-1)
        assert diff[0] <= TOLERANCE
        assert (diff[1] > 1e-3) if pooling == "mean" else (diff[1] <= TOLERANCE), (pooling, diff)


def test_the_token_type_fold_adds_each_type_to_each_real_token():
    """words'[i] + words'[t] = words[i] + type[t] for i >= 1, t in {0, 1} (XLM adds words'[t])."""
    model = _classifier()
    state = model.state_dict()
    folded = hf_xlm.fold_embeddings(state, model.config, token_types=True)
    words, types = state["encoder.tok_emb.weight"], state["encoder.type_emb.weight"]
    new = folded["encoder.tok_emb.weight"]  # (V, D)
    for t in (0, 1):
        assert torch.allclose(new[1:] + new[t], words[1:] + types[t], atol=1e-6)
    assert torch.equal(folded["encoder.pos_emb.weight"], state["encoder.pos_emb.weight"])
    single = hf_xlm.fold_embeddings(state, model.config, token_types=False)
    assert torch.equal(single["encoder.tok_emb.weight"], words)
    assert torch.allclose(single["encoder.pos_emb.weight"], state["encoder.pos_emb.weight"] + types[0])


def test_the_table_covers_the_state_dict_exactly_and_writes_xlms_shapes():
    model = _classifier()
    out = hf_xlm.to_hf(model.state_dict(), model.config, token_types=False)
    assert {k: tuple(v.shape) for k, v in out.items()} == hf_xlm.xlm_shapes(model.config)
    extra = {**model.state_dict(), "encoder.pooler.weight": torch.zeros(32, 32)}
    with pytest.raises(ValueError, match=r"^state dict: expected the keys \[\] and no others, got also "
                                         r"\['encoder.pooler.weight'\]"):
        hf_xlm.to_hf(extra, model.config, token_types=False)


def test_a_narrower_feed_forward_network_is_padded_with_zero_units():
    """d_ff 40 < 4 * 32: lin1 gets 88 zero rows (and bias), lin2 88 zero columns."""
    model = _classifier(d_ff=40)
    out = hf_xlm.to_hf(model.state_dict(), model.config, token_types=False)
    state = model.state_dict()
    up, down = state["encoder.layers.0.ffn.up.weight"], state["encoder.layers.0.ffn.down.weight"]
    assert torch.equal(out["transformer.ffns.0.lin1.weight"][:40], up)
    assert not out["transformer.ffns.0.lin1.weight"][40:].any() and not out["transformer.ffns.0.lin1.bias"][40:].any()
    assert torch.equal(out["transformer.ffns.0.lin2.weight"][:, :40], down)
    assert not out["transformer.ffns.0.lin2.weight"][:, 40:].any()


@pytest.mark.parametrize("changes, field", [
    ({"d_ff": 256}, "d_ff"), ({"norm_first": True}, "norm_first"), ({"activation": "gelu_tanh"}, "activation"),
    ({"pooler": True}, "pooler"), ({"embedding_norm": False}, "embedding_norm"), ({"bias": False}, "bias"),
])
def test_what_xlm_cannot_express_is_refused_naming_the_field(changes, field):
    config = _classifier().config.replace(**changes)
    with pytest.raises(hf_xlm.Inexpressible, match=rf"^config\.{field}: XLMForSequenceClassification needs ") as e:
        hf_xlm.config_to_hf(config, ["a", "b", "c"], pad_id=0)
    assert e.value.field == field and e.value.got == changes[field]


# Reading back (config_from_hf, from_hf): the encoder of the layout tformer writes ------------------
@pytest.mark.parametrize("changes", [{}, {"d_ff": 40, "activation": "relu"}], ids=["bert-layout", "narrow-relu"])
@pytest.mark.parametrize("token_types", [False, True])
def test_the_written_xlm_reads_back_as_the_same_encoder(changes, token_types):
    """to_hf then from_hf: an encoder giving the classifier's encoder outputs on real tokens (the
    types folded into the tables come back as a type table: zeros, or word rows 0 and 1)."""
    from tformer.nn.model import Encoder

    model = _classifier(**changes)
    hf = hf_xlm.config_to_hf(model.config, ["a", "b", "c"], pad_id=0)
    config = hf_xlm.config_from_hf(hf)
    assert (config.d_ff, config.activation, config.pooler) == (model.config.d_ff, model.config.activation, False)
    state = hf_xlm.clean_state_dict(hf_xlm.to_hf(model.state_dict(), model.config, token_types))
    encoder = Encoder(config)
    encoder.load_state_dict(hf_xlm.from_hf(state, config, token_types, torch.cat))
    ids, types = _inputs(24, pair=token_types)
    mask = torch.ones_like(ids)
    mask[:, 20:] = 0
    with torch.no_grad():
        ours = model.encoder(ids, mask, token_type_ids=types).last_hidden_state  # (1, S, D)
        back = encoder.eval()(ids, mask, token_type_ids=types).last_hidden_state
    assert (ours[mask.bool()] - back[mask.bool()]).abs().max() <= TOLERANCE


def test_an_export_without_tformer_d_ff_reads_every_unit_and_gives_the_same_outputs():
    """An export from before config.json said the trained width: all 4 * D units come back (the
    padding among them, zero), and the encoder computes the same outputs."""
    from tformer.nn.model import Encoder

    model = _classifier(d_ff=40)
    hf = hf_xlm.config_to_hf(model.config, ["a", "b", "c"], pad_id=0)
    assert hf["tformer_d_ff"] == 40
    del hf["tformer_d_ff"]
    config = hf_xlm.config_from_hf(hf)
    assert config.d_ff == 128
    state = hf_xlm.clean_state_dict(hf_xlm.to_hf(model.state_dict(), model.config, False))
    encoder = Encoder(config).eval()
    encoder.load_state_dict(hf_xlm.from_hf(state, config, False, torch.cat))
    ids, _ = _inputs(24, pair=False)
    with torch.no_grad():
        ours = model.encoder(ids).last_hidden_state
        back = encoder(ids).last_hidden_state
    assert (ours - back).abs().max() <= TOLERANCE


@pytest.mark.parametrize("tensor", ["lin1.weight", "lin1.bias", "lin2.weight"])
def test_units_past_tformer_d_ff_that_are_not_zero_are_refused_naming_the_tensor(tensor):
    model = _classifier(d_ff=40)
    config = hf_xlm.config_from_hf(hf_xlm.config_to_hf(model.config, ["a", "b", "c"], pad_id=0))
    state = hf_xlm.clean_state_dict(hf_xlm.to_hf(model.state_dict(), model.config, False))
    t = state[f"ffns.1.{tensor}"]
    if tensor == "lin2.weight":
        t[3, 100] = 0.5  # (D, 4D): a column past unit 40
    else:
        t[100] = 0.5  # a row (or bias) past unit 40
    with pytest.raises(ValueError, match="^" + re.escape(
            f"w.safetensors: transformer.ffns.1.{tensor}: expected zero past the first 40 units "
            "(config.json's tformer_d_ff), got non-zero values there")):
        hf_xlm.from_hf(state, config, False, torch.cat, "w.safetensors")


@pytest.mark.parametrize("value", [0, 129, 40.0, True, "40"])
def test_a_bad_tformer_d_ff_is_refused_naming_the_key(value):
    hf = hf_xlm.config_to_hf(_classifier().config, ["a", "b", "c"], pad_id=0)
    with pytest.raises(ValueError, match="^" + re.escape(
            f"in/config.json: tformer_d_ff: expected the feed-forward units the run trained, an int in "
            f"1..128 (4 * emb_dim), got {value!r}")):
        hf_xlm.config_from_hf({**hf, "tformer_d_ff": value}, "in/config.json")


@pytest.mark.parametrize("changes, message", [
    ({"sinusoidal_embeddings": True}, "sinusoidal_embeddings: expected false (tformer writes a learned "
                                      "position table), got true"),
    ({"causal": True}, "causal: expected false (an encoder attends both ways), got true"),
    ({"is_encoder": False}, "is_encoder: expected true"),
    ({"n_langs": 2, "use_lang_emb": True}, "n_langs: expected 1 (or use_lang_emb false: tformer's encoder has no "
                                           "language embeddings), got 2"),
    ({"model_type": "bert"}, "model_type: expected 'xlm', got 'bert'"),
    ({"emb_dim": 30}, "emb_dim: expected a multiple of n_heads (4), got 30"),
])
def test_a_foreign_xlm_layout_is_refused_naming_its_key(changes, message):
    hf = hf_xlm.config_to_hf(_classifier().config, ["a", "b", "c"], pad_id=0)
    with pytest.raises(ValueError, match="^" + re.escape(f"in/config.json: {message}")):
        hf_xlm.config_from_hf({**hf, **changes}, "in/config.json")
    assert hf_xlm.config_from_hf({**hf, "n_langs": 2, "use_lang_emb": False}).n_layers == 2  # no lang table used
