"""NumPy mirror of tformer.attention (Vaswani et al. 2017, §3.2).

Shape legend: B batch, T query length, S key length, D model dim, H heads, Dh head dim.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tformer.reference.masks import Mask, as_mask
from tformer.reference.module import Linear, Module

KeyValue = tuple[np.ndarray, np.ndarray]  # cached (k, v), each (B, H, S, Dh)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e


def scaled_dot_product_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: Mask | np.ndarray | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """softmax(q k^T / sqrt(Dh)) v (§3.2.1); rows with no key to attend return zeros.

    Shape:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh); mask: broadcastable to (B, H, T, S)
        returns output (B, H, T, Dh) and weights (B, H, T, S) or None
    """
    mask = as_mask(mask)
    scores = q @ k.swapaxes(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    if mask is not None:
        scores = np.where(mask.allowed, scores, np.finfo(scores.dtype).min)
    weights = softmax(scores, axis=-1)
    if mask is not None:
        weights = np.where(mask.attends_nothing, 0.0, weights).astype(q.dtype)
    out = weights @ v  # (B, H, T, Dh)
    return out, (weights if need_weights else None)


class AttentionOutput(NamedTuple):
    output: np.ndarray  # (B, T, D)
    weights: np.ndarray | None  # (B, H, T, S)
    present: KeyValue | None


class MultiHeadAttention(Module):
    """Multi-head attention (§3.2.2); fused (D, 3D) projection, or q + kv when ``cross``."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        cross: bool = False,
    ) -> None:
        if d_model % n_heads:
            raise ValueError(
                f"d_model: expected a multiple of n_heads ({n_heads}), got {d_model}"
            )
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout, self.cross = dropout, cross
        if cross:
            self.q_proj = Linear(d_model, d_model, bias=bias)
            self.kv_proj = Linear(d_model, 2 * d_model, bias=bias)
        else:
            self.qkv_proj = Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: np.ndarray) -> np.ndarray:
        b, n, _ = x.shape
        return x.reshape(b, n, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)  # (B, H, N, Dh)

    def forward(
        self,
        x: np.ndarray,
        memory: np.ndarray | None = None,
        mask: Mask | np.ndarray | None = None,
        past_key_value: KeyValue | None = None,
        use_cache: bool = False,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """
        Shape:
            x: (B, T, D); memory: (B, S, D); mask: broadcastable to (B, H, T, S)
            returns output (B, T, D), weights (B, H, T, S) or None, present (k, v) or None
        """
        if self.cross:
            q = self._split_heads(self.q_proj(x))  # (B, H, T, Dh)
            if past_key_value is not None:
                k, v = past_key_value
            else:
                if memory is None:
                    raise ValueError("memory: cross-attention needs the encoder output")
                k, v = np.split(self.kv_proj(memory), 2, axis=-1)  # 2 x (B, S, D)
                k, v = self._split_heads(k), self._split_heads(v)  # (B, H, S, Dh)
        else:
            q, k, v = np.split(self.qkv_proj(x), 3, axis=-1)  # 3 x (B, T, D)
            q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
            if past_key_value is not None:
                k = np.concatenate([past_key_value[0], k], axis=2)  # (B, H, S_past + T, Dh)
                v = np.concatenate([past_key_value[1], v], axis=2)
        out, weights = scaled_dot_product_attention(q, k, v, mask, 0.0, need_weights)
        b, _, t, _ = out.shape
        out = out.transpose(0, 2, 1, 3).reshape(b, t, self.d_model)  # (B, T, D)
        return AttentionOutput(self.out_proj(out), weights, (k, v) if use_cache else None)
