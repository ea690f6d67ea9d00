"""Encoder and decoder layers (Vaswani et al. 2017, §3.1), post-norm or pre-norm.

Post-norm (the paper): x = LayerNorm(x + Dropout(Sublayer(x))).
Pre-norm (Xiong et al. 2020, used by most modern models): x = x + Dropout(Sublayer(LayerNorm(x))).
Dropout sits on each sub-layer output before the residual add (§5.4).

Shape legend: B batch, T target length, S source length, D model dim, H heads.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from tformer.attention import KeyValue, MultiHeadAttention
from tformer.config import TransformerConfig
from tformer.feedforward import FeedForward
from tformer.masks import Mask

# A decoder layer's cache: self-attention (k, v) then cross-attention (k, v).
LayerCache = tuple[Tensor, Tensor, Tensor, Tensor]


def _residual(x: Tensor, sublayer, norm: nn.LayerNorm, dropout: nn.Dropout, norm_first: bool
              ) -> tuple[Tensor, object]:
    """x + Dropout(Sublayer(x)), normalised before (pre-norm) or after (post-norm) (§5.4).

    ``sublayer(h, residual)`` returns (output [+ residual], extra). When dropout is inactive
    the residual goes in, so the add can fuse into the sub-layer's last matmul.
    """
    h = norm(x) if norm_first else x
    if dropout.training and dropout.p > 0:
        out, extra = sublayer(h, None)
        out = x + dropout(out)
    else:
        out, extra = sublayer(h, x)
    return (out if norm_first else norm(out)), extra


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
        self.dropout = nn.Dropout(c.dropout)

    def forward(
        self, x: Tensor, mask: Mask | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """
        Shape:
            x: (B, S, D), or packed real tokens (N, D); mask: a Mask over (B, H, S, S)
            returns x's shape and attention weights (B, H, S, S) or None
        """

        def attend(h: Tensor, residual: Tensor | None):
            out = self.self_attn(h, mask=mask, need_weights=need_weights, residual=residual)
            return out.output, out.weights

        def feed_forward(h: Tensor, residual: Tensor | None):
            return self.ffn(h, residual), None

        x, weights = _residual(x, attend, self.attn_norm, self.dropout, self.norm_first)
        x, _ = _residual(x, feed_forward, self.ffn_norm, self.dropout, self.norm_first)
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
        self.dropout = nn.Dropout(c.dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        self_mask: Mask | None = None,
        memory_mask: Mask | None = None,
        past_key_value: LayerCache | None = None,
        use_cache: bool = False,
        need_weights: bool = False,
    ) -> DecoderOutputs:
        """
        Shape:
            x: (B, T, D); memory: (B, S, D) (may be None once its keys/values are cached)
            self_mask: broadcastable to (B, H, T, T_past + T) — causal, built by the caller
            memory_mask: broadcastable to (B, H, T, S)
        """
        self_past: KeyValue | None = None
        cross_past: KeyValue | None = None
        if past_key_value is not None:
            self_past, cross_past = past_key_value[:2], past_key_value[2:]

        def self_attend(h: Tensor, residual: Tensor | None):
            out = self.self_attn(h, mask=self_mask, past_key_value=self_past,
                                 use_cache=use_cache, need_weights=need_weights, residual=residual)
            return out.output, (out.weights, out.present)

        def cross_attend(h: Tensor, residual: Tensor | None):
            out = self.cross_attn(h, memory, mask=memory_mask, past_key_value=cross_past,
                                  use_cache=use_cache, need_weights=need_weights, residual=residual)
            return out.output, (out.weights, out.present)

        def feed_forward(h: Tensor, residual: Tensor | None):
            return self.ffn(h, residual), None

        nf = self.norm_first
        x, (self_w, self_kv) = _residual(x, self_attend, self.self_attn_norm, self.dropout, nf)
        x, (cross_w, cross_kv) = _residual(x, cross_attend, self.cross_attn_norm, self.dropout, nf)
        x, _ = _residual(x, feed_forward, self.ffn_norm, self.dropout, nf)
        present = (*self_kv, *cross_kv) if use_cache else None
        return DecoderOutputs(x, self_w, cross_w, present)
