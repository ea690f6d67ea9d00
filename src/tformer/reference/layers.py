"""NumPy mirror of tformer.layers: encoder and decoder layers, post-norm or pre-norm.

Post-norm (the paper): x = LayerNorm(x + Sublayer(x)).
Pre-norm: x = x + Sublayer(LayerNorm(x)). (Dropout is the identity here: evaluation mode.)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tformer.config import TransformerConfig
from tformer.reference.attention import KeyValue, MultiHeadAttention
from tformer.reference.feedforward import FeedForward
from tformer.reference.module import Dropout, LayerNorm, Module

LayerCache = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _residual(x, sublayer, norm: LayerNorm, dropout: Dropout, norm_first: bool):
    """Apply one residual sub-layer; `sublayer` returns (output, extra)."""
    if norm_first:
        out, extra = sublayer(norm(x))
        return x + dropout(out), extra
    out, extra = sublayer(x)
    return norm(x + dropout(out)), extra


class EncoderLayer(Module):
    def __init__(self, config: TransformerConfig):
        c = config
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, c.bias)
        self.attn_norm = LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation, c.bias)
        self.ffn_norm = LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.dropout = Dropout(c.dropout)

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None, need_weights: bool = False):
        """Shape: x (B, S, D) -> (B, S, D), weights (B, H, S, S) or None."""

        def attend(h):
            out = self.self_attn(h, mask=mask, need_weights=need_weights)
            return out.output, out.weights

        x, weights = _residual(x, attend, self.attn_norm, self.dropout, self.norm_first)
        x, _ = _residual(x, lambda h: (self.ffn(h), None), self.ffn_norm, self.dropout,
                         self.norm_first)
        return x, weights


class DecoderOutputs(NamedTuple):
    hidden: np.ndarray
    self_weights: np.ndarray | None
    cross_weights: np.ndarray | None
    present: LayerCache | None


class DecoderLayer(Module):
    def __init__(self, config: TransformerConfig):
        c = config
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, c.bias)
        self.self_attn_norm = LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.cross_attn = MultiHeadAttention(
            c.d_model, c.n_heads, c.attention_dropout, c.bias, cross=True
        )
        self.cross_attn_norm = LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation, c.bias)
        self.ffn_norm = LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.dropout = Dropout(c.dropout)

    def forward(
        self,
        x: np.ndarray,
        memory: np.ndarray | None,
        self_mask: np.ndarray | None = None,
        memory_mask: np.ndarray | None = None,
        past_key_value: LayerCache | None = None,
        use_cache: bool = False,
        need_weights: bool = False,
    ) -> DecoderOutputs:
        """Shape: x (B, T, D); memory (B, S, D) -> (B, T, D)."""
        self_past: KeyValue | None = None
        cross_past: KeyValue | None = None
        if past_key_value is not None:
            self_past, cross_past = past_key_value[:2], past_key_value[2:]

        def self_attend(h):
            out = self.self_attn(h, mask=self_mask, past_key_value=self_past,
                                 use_cache=use_cache, need_weights=need_weights)
            return out.output, (out.weights, out.present)

        def cross_attend(h):
            out = self.cross_attn(h, memory, mask=memory_mask, past_key_value=cross_past,
                                  use_cache=use_cache, need_weights=need_weights)
            return out.output, (out.weights, out.present)

        nf = self.norm_first
        x, (self_w, self_kv) = _residual(x, self_attend, self.self_attn_norm, self.dropout, nf)
        x, (cross_w, cross_kv) = _residual(x, cross_attend, self.cross_attn_norm, self.dropout, nf)
        x, _ = _residual(x, lambda h: (self.ffn(h), None), self.ffn_norm, self.dropout, nf)
        present = (*self_kv, *cross_kv) if use_cache else None
        return DecoderOutputs(x, self_w, cross_w, present)
