"""Scaled dot-product attention and multi-head attention (Vaswani et al. 2017, §3.2).

Shape legend: B batch, T query length, S key length, D model dim, H heads, Dh head dim.
Masks are boolean, True = may attend, broadcastable to (B, H, T, S) (see tformer.masks).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

KeyValue = tuple[Tensor, Tensor]  # cached (k, v), each (B, H, S, Dh)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(Dh)) v  (§3.2.1).

    A query row whose mask allows no key returns zeros (and zero weights), never NaN.

    Shape:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh); mask: broadcastable to (B, H, T, S)
        returns: output (B, H, T, Dh) and weights (B, H, T, S) or None
    """
    if not need_weights:
        return _sdpa_fused(q, k, v, mask, dropout_p), None
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if mask is not None:
        # finfo.min, not -inf: an all-blocked row then softmaxes to finite values that
        # are zeroed below, so no NaN reaches the forward or the backward pass.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    out = F.dropout(weights, dropout_p) @ v  # (B, H, T, Dh)
    return out, weights


def _sdpa_fused(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float) -> Tensor:
    """The same computation through PyTorch's fused kernel (no (T, S) matrix kept)."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    if mask is not None:
        # Our contract, whatever the backend: rows that may attend nothing are zero.
        out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return out


class AttentionOutput(NamedTuple):
    output: Tensor  # (B, T, D)
    weights: Tensor | None  # (B, H, T, S) when requested
    present: KeyValue | None  # (k, v) to cache when requested


class MultiHeadAttention(nn.Module):
    """Multi-head attention (§3.2.2).

    Self-attention projects q, k, v with one fused (D, 3D) matrix; cross-attention
    (``cross=True``) projects q from the decoder and k, v from the encoder memory.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        cross: bool = False,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(
                f"d_model: expected a multiple of n_heads ({n_heads}), got {d_model}"
            )
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout, self.cross = dropout, cross
        if cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, N, Dh)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        past_key_value: KeyValue | None = None,
        use_cache: bool = False,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """Attend from ``x`` to itself, or to ``memory`` when ``cross``.

        With a cache, self-attention appends the new keys/values to ``past_key_value``;
        cross-attention reuses it instead of projecting ``memory`` again.

        Shape:
            x: (B, T, D); memory: (B, S, D); mask: broadcastable to (B, H, T, S)
            returns output (B, T, D), weights (B, H, T, S) or None, present (k, v) or None
        """
        if self.cross:
            q = self._split_heads(self.q_proj(x))  # (B, H, T, Dh)
            if past_key_value is not None:
                k, v = past_key_value  # memory's keys/values, computed at step 0
            else:
                if memory is None:
                    raise ValueError("memory: cross-attention needs the encoder output")
                k, v = self.kv_proj(memory).chunk(2, dim=-1)  # 2 x (B, S, D)
                k, v = self._split_heads(k), self._split_heads(v)  # (B, H, S, Dh)
        else:
            q, k, v = self.qkv_proj(x).chunk(3, dim=-1)  # 3 x (B, T, D)
            q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
            if past_key_value is not None:
                k = torch.cat([past_key_value[0], k], dim=2)  # (B, H, S_past + T, Dh)
                v = torch.cat([past_key_value[1], v], dim=2)
        p = self.dropout if self.training else 0.0
        out, weights = scaled_dot_product_attention(q, k, v, mask, p, need_weights)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, self.d_model)  # (B, T, D)
        return AttentionOutput(self.out_proj(out), weights, (k, v) if use_cache else None)
