"""NumPy mirror of tformer.nn.layers: encoder and decoder layers, post-norm or pre-norm.

Post-norm (the paper): x = LayerNorm(x + Sublayer(x)).
Pre-norm: x = x + Sublayer(LayerNorm(x)). (Dropout is the identity in ``forward``: evaluation
mode; ``forward_train`` applies it and returns the cache that ``backward`` consumes.)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tformer.config import TransformerConfig
from tformer.reference.attention import KeyValue, MultiHeadAttention
from tformer.reference.feedforward import FeedForward
from tformer.reference.module import Dropout, LayerNorm, Module

# A decoder layer's cache: self-attention (k, v) then cross-attention (k, v).
LayerCache = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _residual(x, sublayer, norm: LayerNorm, dropout: Dropout, norm_first: bool):
    """Apply one residual sub-layer; `sublayer` returns (output, extra)."""
    if norm_first:
        out, extra = sublayer(norm(x))
        return x + dropout(out), extra
    out, extra = sublayer(x)
    return norm(x + dropout(out)), extra


def _residual_train(x, sublayer_train, norm: LayerNorm, dropout: Dropout, norm_first: bool, rng):
    """_residual for training; `sublayer_train` returns (output, extra, cache)."""
    if norm_first:
        h, norm_cache = norm.forward_train(x)
        out, extra, sub_cache = sublayer_train(h)
        out, drop_cache = dropout.forward_train(out, rng)
        return x + out, extra, (norm_cache, sub_cache, drop_cache)
    out, extra, sub_cache = sublayer_train(x)
    out, drop_cache = dropout.forward_train(out, rng)
    y, norm_cache = norm.forward_train(x + out)
    return y, extra, (norm_cache, sub_cache, drop_cache)


def _residual_backward(dy, cache, sublayer_backward, norm: LayerNorm, dropout: Dropout,
                       norm_first: bool, grads: dict, norm_prefix: str):
    """Back through one residual sub-layer; `sublayer_backward(dout, cache)` returns dinput.

    Pre-norm, y = x + f(norm(x)): dx = dy + (the path through f). The identity carries dy
    to x unchanged, through every layer of the stack, which is why pre-norm trains deep
    stacks without warmup (Xiong et al. 2020). Post-norm, y = norm(x + f(x)): every
    gradient passes through each layer's norm first.
    """
    norm_cache, sub_cache, drop_cache = cache
    if norm_first:
        dh = sublayer_backward(dropout.backward(dy, drop_cache), sub_cache)
        return dy + norm.backward(dh, norm_cache, grads, norm_prefix)
    dz = norm.backward(dy, norm_cache, grads, norm_prefix)  # z = x + f(x)
    return dz + sublayer_backward(dropout.backward(dz, drop_cache), sub_cache)


class EncoderLayer(Module):
    """Self-attention then feed-forward, each wrapped in a residual connection."""

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

    def forward_train(self, x: np.ndarray, mask: np.ndarray | None = None, rng=None):
        """forward, with dropout from `rng`, and the cache for ``backward``.

        Shape: x (B, S, D) -> (B, S, D), weights (B, H, S, S), cache
        """

        def attend(h):
            out, weights, cache = self.self_attn.forward_train(h, mask=mask, rng=rng)
            return out, weights, cache

        def ffn(h):
            out, cache = self.ffn.forward_train(h)
            return out, None, cache

        nf = self.norm_first
        x, weights, attn_cache = _residual_train(x, attend, self.attn_norm, self.dropout, nf, rng)
        x, _, ffn_cache = _residual_train(x, ffn, self.ffn_norm, self.dropout, nf, rng)
        return x, weights, (attn_cache, ffn_cache)

    def backward(self, dy: np.ndarray, cache, grads: dict, prefix: str = "") -> np.ndarray:
        """Shape: dy (B, S, D) -> dx (B, S, D). The sub-layers in reverse order."""
        attn_cache, ffn_cache = cache
        nf = self.norm_first

        def ffn_back(d, c):
            return self.ffn.backward(d, c, grads, prefix + "ffn.")

        def attn_back(d, c):
            return self.self_attn.backward(d, c, grads, prefix + "self_attn.")[0]

        dy = _residual_backward(dy, ffn_cache, ffn_back, self.ffn_norm, self.dropout, nf,
                                grads, prefix + "ffn_norm.")
        return _residual_backward(dy, attn_cache, attn_back, self.attn_norm, self.dropout, nf,
                                  grads, prefix + "attn_norm.")


class DecoderOutputs(NamedTuple):
    hidden: np.ndarray  # (B, T, D)
    self_weights: np.ndarray | None  # (B, H, T, T_total)
    cross_weights: np.ndarray | None  # (B, H, T, S)
    present: LayerCache | None


class DecoderLayer(Module):
    """Masked self-attention, cross-attention to the encoder memory, then feed-forward (§3.1)."""

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
        grow_cache: bool = True,
    ) -> DecoderOutputs:
        """``grow_cache`` as in MultiHeadAttention.

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

    def forward_train(self, x, memory, self_mask=None, memory_mask=None, rng=None):
        """forward (no KV cache), with dropout from `rng`, and the cache for ``backward``.

        Shape: x (B, T, D); memory (B, S, D) -> (B, T, D), cache
        """

        def self_attend(h):
            out, weights, cache = self.self_attn.forward_train(h, mask=self_mask, rng=rng)
            return out, weights, cache

        def cross_attend(h):
            out, weights, cache = self.cross_attn.forward_train(h, memory, mask=memory_mask,
                                                                rng=rng)
            return out, weights, cache

        def ffn(h):
            out, cache = self.ffn.forward_train(h)
            return out, None, cache

        nf = self.norm_first
        x, _, c1 = _residual_train(x, self_attend, self.self_attn_norm, self.dropout, nf, rng)
        x, _, c2 = _residual_train(x, cross_attend, self.cross_attn_norm, self.dropout, nf, rng)
        x, _, c3 = _residual_train(x, ffn, self.ffn_norm, self.dropout, nf, rng)
        return x, (c1, c2, c3)

    def backward(self, dy, cache, grads: dict, prefix: str = ""):
        """Shape: dy (B, T, D) -> dx (B, T, D), dmemory (B, S, D).

        The memory feeds only the cross-attention's keys and values, so its gradient
        comes from there alone.
        """
        c1, c2, c3 = cache
        nf = self.norm_first
        dmemory = []

        def ffn_back(d, c):
            return self.ffn.backward(d, c, grads, prefix + "ffn.")

        def cross_back(d, c):
            dh, dmem = self.cross_attn.backward(d, c, grads, prefix + "cross_attn.")
            dmemory.append(dmem)
            return dh

        def self_back(d, c):
            return self.self_attn.backward(d, c, grads, prefix + "self_attn.")[0]

        dy = _residual_backward(dy, c3, ffn_back, self.ffn_norm, self.dropout, nf, grads,
                                prefix + "ffn_norm.")
        dy = _residual_backward(dy, c2, cross_back, self.cross_attn_norm, self.dropout, nf,
                                grads, prefix + "cross_attn_norm.")
        dy = _residual_backward(dy, c1, self_back, self.self_attn_norm, self.dropout, nf, grads,
                                prefix + "self_attn_norm.")
        return dy, dmemory[0]
