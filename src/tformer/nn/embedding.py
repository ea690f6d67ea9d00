"""The input embeddings of every model: a token table and the positions added to it."""

from __future__ import annotations

from torch import nn

from tformer.config import TransformerConfig
from tformer.nn.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding


def positional_encoding(config: TransformerConfig) -> nn.Module | None:
    """The positions the config names: sinusoidal (Vaswani et al. 2017, §3.5), learned, or none."""
    if config.positional == "sinusoidal":
        return SinusoidalPositionalEncoding(config.d_model, config.max_len)
    if config.positional == "learned":
        return LearnedPositionalEmbedding(config.max_len, config.d_model)
    return None


def token_embedding(vocab_size: int, config: TransformerConfig) -> nn.Embedding:
    emb = nn.Embedding(vocab_size, config.d_model)
    # With the sqrt(D) scale, std D^-1/2 gives unit-variance inputs; BERT uses 0.02.
    nn.init.normal_(emb.weight, std=config.d_model**-0.5 if config.scale_embeddings else 0.02)
    return emb
