"""tformer vs torch.nn.TransformerEncoder / nn.Transformer on converted weights (<= 1e-5)."""

import numpy as np
import pytest
import torch
from helpers import assert_close
from torch import nn

from tformer.export.torch_nn import from_torch_encoder, from_torch_transformer, to_torch_encoder
from tformer.nn.model import Encoder


def _torch_encoder(norm_first: bool, activation: str, d=32, h=4, f=64, n=2):
    layer = nn.TransformerEncoderLayer(d, h, f, 0.1, activation, batch_first=True,
                                       norm_first=norm_first)
    norm = nn.LayerNorm(d) if norm_first else None
    return nn.TransformerEncoder(layer, n, norm=norm, enable_nested_tensor=False).eval()


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_from_torch_encoder_matches_on_real_tokens(norm_first, activation):
    theirs = _torch_encoder(norm_first, activation)
    ours = from_torch_encoder(theirs).eval()
    x = torch.randn(3, 7, 32)
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, 4:] = kpm[2, 1:] = True
    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=kpm)
        out = ours(x, attention_mask=~kpm).last_hidden_state
    assert_close(out, expected, np.float32, where=~kpm, what="real-token outputs")


@pytest.mark.parametrize("norm_first", [False, True])
def test_round_trip_through_torch(tiny_config, norm_first):
    config = tiny_config.replace(vocab_size=None, positional="none", norm_first=norm_first,
                                 final_norm=norm_first, activation="gelu")
    ours = Encoder(config).eval()
    back = from_torch_encoder(to_torch_encoder(ours))
    assert back.config == config.replace(max_len=back.config.max_len)
    for k, v in ours.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k


def test_single_layer_converts():
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    ours = from_torch_encoder(layer).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        assert_close(ours(x).last_hidden_state, layer(x), what="output")


@pytest.mark.parametrize("norm_first", [False, True])
def test_from_torch_transformer_matches(norm_first):
    theirs = nn.Transformer(32, 4, 2, 3, 64, 0.1, batch_first=True, norm_first=norm_first).eval()
    encoder, decoder = from_torch_transformer(theirs)
    encoder.eval(), decoder.eval()
    src, tgt = torch.randn(2, 6, 32), torch.randn(2, 5, 32)
    src_kpm = torch.tensor([[False] * 6, [False] * 3 + [True] * 3])
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    with torch.no_grad():
        expected = theirs(src, tgt, tgt_mask=causal, src_key_padding_mask=src_kpm,
                          memory_key_padding_mask=src_kpm)
        memory = encoder(src, ~src_kpm).last_hidden_state
        out = decoder(tgt, memory, memory_attention_mask=~src_kpm).last_hidden_state
    assert_close(out, expected, what="decoder output")


def test_refuses_sequence_first_and_embeddings():
    with pytest.raises(ValueError, match="batch_first=True"):
        from_torch_encoder(nn.TransformerEncoderLayer(16, 2, 32))
    with pytest.raises(ValueError, match="no embeddings"):
        to_torch_encoder(Encoder(__import__("tformer").TransformerConfig(
            d_model=16, n_heads=2, vocab_size=10)))


@pytest.mark.parametrize("bias", [True, False])
def test_layers_only_converts_the_stack_of_an_encoder_with_embeddings(tiny_config, bias):
    """The bench's torch.nn contender: tformer embeds, torch.nn runs the converted layers (the
    final norm without bias too, when the config has none)."""
    config = tiny_config.replace(norm_first=True, final_norm=True, bias=bias, activation="gelu",
                                 dropout=0.0)
    ours = Encoder(config).eval()
    with pytest.raises(ValueError, match="has no embeddings"):
        to_torch_encoder(ours)
    stack = to_torch_encoder(ours, layers_only=True).eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        assert_close(stack(ours.embed(ids)), ours(ids).last_hidden_state, what="layers only")
