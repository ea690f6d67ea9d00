"""Encoder and decoder layers (Vaswani et al. 2017, §3.1), post-norm or pre-norm.

Post-norm (the paper): x = LayerNorm(x + Dropout(Sublayer(x))).
Pre-norm (Xiong et al. 2020, used by most modern models): x = x + Dropout(Sublayer(LayerNorm(x))).
Dropout sits on each sub-layer output before the residual add (§5.4).

Shape legend: B batch, T target length, S source length, D model dim, H heads.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from tformer.config import TransformerConfig
from tformer.nn import kernels
from tformer.nn.attention import KeyValue, MultiHeadAttention
from tformer.nn.dropout import Dropout
from tformer.nn.feedforward import FeedForward
from tformer.nn.masks import Mask, Packing

# A decoder layer's cache: self-attention (k, v) then cross-attention (k, v).
LayerCache = tuple[Tensor, Tensor, Tensor, Tensor]


def _residual(x, sublayer, norm: nn.LayerNorm, dropout: Dropout, norm_first: bool):
    """Apply one residual sub-layer; `sublayer` returns (output, extra)."""
    if norm_first:
        out, extra = sublayer(norm(x))
        return x + dropout(out), extra
    out, extra = sublayer(x)
    return kernels.add_norm(x, dropout(out), norm), extra  # norm(x + ...), maybe one compiled pass


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in a residual connection."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, c.bias)
        self.attn_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation, c.bias)
        self.ffn_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.dropout = Dropout(c.dropout)

    def forward(self, x: Tensor, mask: Mask | Packing | None = None, need_weights: bool = False):
        """Shape: x (B, S, D) -> (B, S, D), weights (B, H, S, S) or None.

        With a ``Packing`` for a mask, x is the packed real tokens (rows, D) (Encoder.forward).
        """

        def attend(h):
            out = self.self_attn(h, mask=mask, need_weights=need_weights)
            return out.output, out.weights

        x, weights = _residual(x, attend, self.attn_norm, self.dropout, self.norm_first)
        x, _ = _residual(x, lambda h: (self.ffn(h), None), self.ffn_norm, self.dropout,
                         self.norm_first)
        return x, weights


class DecoderOutputs(NamedTuple):
    hidden: Tensor  # (B, T, D)
    self_weights: Tensor | None  # (B, H, T, T_total)
    cross_weights: Tensor | None  # (B, H, T, S)
    present: LayerCache | None


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder memory, then feed-forward (§3.1)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.attention_dropout, c.bias)
        self.self_attn_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.cross_attn = MultiHeadAttention(
            c.d_model, c.n_heads, c.attention_dropout, c.bias, cross=True
        )
        self.cross_attn_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation, c.bias)
        self.ffn_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps, bias=c.bias)
        self.dropout = Dropout(c.dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        self_mask: Mask | None = None,
        memory_mask: Mask | None = None,
        past_key_value: LayerCache | None = None,
        use_cache: bool = False,
        need_weights: bool = False,
        grow_cache: bool = True,
    ) -> DecoderOutputs:
        """``grow_cache`` as in MultiHeadAttention: False leaves the self-attention cache as it
        is, and ``present`` holds the new positions' keys/values (and the cross-attention's).

        Shape:
            x: (B, T, D); memory: (B, S, D) (may be None once its keys/values are cached)
            self_mask: broadcastable to (B, H, T, T_past + T) — causal, built by the caller
            memory_mask: broadcastable to (B, H, T, S)
        """
        self_past: KeyValue | None = None
        cross_past: KeyValue | None = None
        if past_key_value is not None:
            self_past, cross_past = past_key_value[:2], past_key_value[2:]

        def self_attend(h):
            out = self.self_attn(h, mask=self_mask, past_key_value=self_past, use_cache=use_cache,
                                 need_weights=need_weights, grow_cache=grow_cache)
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
