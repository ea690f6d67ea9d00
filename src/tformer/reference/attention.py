"""NumPy mirror of tformer.nn.attention (Vaswani et al. 2017, §3.2).

Shape legend: B batch, T query length, S key length, D model dim, H heads, Dh head dim.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tformer.config import check_positive, check_probability
from tformer.reference.inputs import check_embeddings
from tformer.reference.masks import Mask, as_mask
from tformer.reference.module import Linear, Module, keep_scaled

KeyValue = tuple[np.ndarray, np.ndarray]  # cached (k, v), each (B, H, S, Dh)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e


def check_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Mask | None) -> None:
    """One line naming the argument for mis-shaped inputs, not NumPy's matmul or broadcasting
    error. Shape: q (B, H, T, Dh); k, v (B, H, S, Dh); mask broadcastable to (B, H, T, S)."""
    for name, x, n in (("q", q, "T"), ("k", k, "S")):
        if x.ndim != 4:
            raise ValueError(f"{name}: expected shape (B, H, {n}, Dh), got {x.shape}")
    (b, h, t, dh), s = q.shape, k.shape[2]
    for name, x in (("k", k), ("v", v)):
        if x.shape != (b, h, s, dh):
            raise ValueError(f"{name}: expected shape (B, H, S, Dh) = {(b, h, s, dh)}, got {x.shape}")
    allowed = () if mask is None else mask.allowed.shape
    trailing = (b, h, t, s)[4 - len(allowed) :] if len(allowed) <= 4 else None
    if trailing is None or any(m not in (1, n) for m, n in zip(allowed, trailing, strict=True)):
        raise ValueError(f"mask: expected a shape broadcastable to (B, H, T, S) = {(b, h, t, s)}, "
                         f"got {allowed}")


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
    check_qkv(q, k, v, mask)
    scores = q @ k.swapaxes(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    if mask is not None:
        scores = np.where(mask.allowed, scores, np.finfo(scores.dtype).min)
    weights = softmax(scores, axis=-1)
    if mask is not None:
        weights = np.where(mask.attends_nothing, 0.0, weights).astype(q.dtype)
    out = weights @ v  # (B, H, T, Dh)
    return out, (weights if need_weights else None)


def scaled_dot_product_attention_train(q, k, v, mask=None, dropout_p: float = 0.0, rng=None):
    """scaled_dot_product_attention that also returns the cache its backward needs.

    Shape: as scaled_dot_product_attention; returns out (B, H, T, Dh), weights, cache.
    """
    mask = as_mask(mask)
    check_qkv(q, k, v, mask)
    root = math.sqrt(q.shape[-1])
    scores = q @ k.swapaxes(-2, -1) / root  # (B, H, T, S)
    if mask is not None:
        scores = np.where(mask.allowed, scores, np.finfo(scores.dtype).min)
    weights = softmax(scores, axis=-1)  # (B, H, T, S)
    if mask is not None:
        weights = np.where(mask.attends_nothing, 0.0, weights).astype(q.dtype)
    keep = None
    dropped = weights
    if rng is not None and dropout_p > 0:
        keep = keep_scaled(weights.shape, dropout_p, rng).astype(q.dtype)
        dropped = weights * keep
    out = dropped @ v  # (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh)
    return out, weights, (q, k, v, weights, keep, dropped, root)


def scaled_dot_product_attention_backward(dout: np.ndarray, cache: tuple):
    """Gradients of out = dropout(P) v with P = softmax(q k^T / sqrt(Dh)), row by row.

    The product: dv = P^T dout and dP = dout v^T (then through the dropout mask).
    The softmax Jacobian: p = softmax(s) has dp_i/ds_j = p_i (delta_ij - p_j), so
        ds_j = sum_i dp_i p_i (delta_ij - p_j) = p_j (dp_j - sum_i dp_i p_i),
    one row-wise dot product instead of a (S, S) matrix per row.
    Masked keys have p_j = 0 exactly (exp(finfo.min - max) underflows to 0), so ds_j = 0:
    no gradient flows to a key a query may not see. A row that may attend to nothing has
    all its weights set to 0 in the forward (its output is the constant 0), so the same
    formula gives it ds = 0 and dv += 0: finite and correct, never NaN.
    The scores: s = q k^T / sqrt(Dh), so dq = ds k / sqrt(Dh) and dk = ds^T q / sqrt(Dh).

    Shape: dout (B, H, T, Dh) -> dq (B, H, T, Dh), dk, dv (B, H, S, Dh)
    """
    q, k, v, weights, keep, dropped, root = cache
    dv = dropped.swapaxes(-2, -1) @ dout  # (B, H, S, T) @ (B, H, T, Dh) -> (B, H, S, Dh)
    dweights = dout @ v.swapaxes(-2, -1)  # (B, H, T, Dh) @ (B, H, Dh, S) -> (B, H, T, S)
    if keep is not None:
        dweights = dweights * keep
    dscores = weights * (dweights - (dweights * weights).sum(axis=-1, keepdims=True))
    dq = dscores @ k / root  # (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh)
    dk = dscores.swapaxes(-2, -1) @ q / root  # (B, H, S, T) @ (B, H, T, Dh) -> (B, H, S, Dh)
    return dq, dk, dv


def _queries_per_memory_row(queries: int, memory_rows: int) -> int:
    """How many consecutive query rows share each memory row (beam search's beams of a source)."""
    if memory_rows < 1 or queries % memory_rows:
        raise ValueError(f"memory: expected a batch that divides the query batch ({queries}), "
                         f"got {memory_rows}")
    return queries // memory_rows


def _group(q: np.ndarray, g: int) -> np.ndarray:
    """(Bm * g, H, T, X) -> (Bm, H, g * T, X): the queries of g consecutive rows as one row's."""
    if g == 1:
        return q
    bg, h, t, x = q.shape
    return q.reshape(bg // g, g, h, t, x).swapaxes(1, 2).reshape(bg // g, h, g * t, x)


def _ungroup(out: np.ndarray, g: int) -> np.ndarray:
    """The inverse of ``_group``: (Bm, H, g * T, X) -> (Bm * g, H, T, X)."""
    if g == 1:
        return out
    b, h, gt, x = out.shape
    return out.reshape(b, h, g, gt // g, x).swapaxes(1, 2).reshape(b * g, h, gt // g, x)


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
        check_positive("d_model", d_model)
        check_positive("n_heads", n_heads)
        check_probability("dropout", dropout)
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
        grow_cache: bool = True,
    ) -> AttentionOutput:
        """``grow_cache=False``: ``present`` holds the new positions' keys/values only (the
        caller appends them; the torch engine's compiled decoding step does).

        Shape:
            x: (B, T, D); memory: (Bm, S, D), Bm dividing B (g = B / Bm consecutive rows
            share a memory row); mask: broadcastable to (B, H, T, S) (cross: (Bm, H, T, S))
            returns output (B, T, D), weights (B, H, T, S) or None, present (k, v) or None
        """
        check_embeddings(x, self.d_model, "x")
        if memory is not None:
            check_embeddings(memory, self.d_model, "memory")
        g = 1  # query rows per memory row
        if self.cross:
            q = self._split_heads(self.q_proj(x))  # (B, H, T, Dh)
            if past_key_value is not None:
                k, v = past_key_value
            else:
                if memory is None:
                    raise ValueError("memory: cross-attention needs the encoder output")
                k, v = np.split(self.kv_proj(memory), 2, axis=-1)  # 2 x (Bm, S, D)
                k, v = self._split_heads(k), self._split_heads(v)  # (Bm, H, S, Dh)
            g = _queries_per_memory_row(q.shape[0], k.shape[0])
            q = _group(q, g)  # (Bm, H, g * T, Dh)
            present = (k, v)
        else:
            q, k, v = np.split(self.qkv_proj(x), 3, axis=-1)  # 3 x (B, T, D)
            q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
            present = (k, v)  # this call's positions
            if past_key_value is not None:
                k = np.concatenate([past_key_value[0], k], axis=2)  # (B, H, S_past + T, Dh)
                v = np.concatenate([past_key_value[1], v], axis=2)
            if grow_cache:
                present = (k, v)
        out, weights = scaled_dot_product_attention(q, k, v, mask, 0.0, need_weights)
        out, weights = _ungroup(out, g), None if weights is None else _ungroup(weights, g)
        b, _, t, _ = out.shape
        out = out.transpose(0, 2, 1, 3).reshape(b, t, self.d_model)  # (B, T, D)
        return AttentionOutput(self.out_proj(out), weights, present if use_cache else None)

    def _merge_heads(self, x: np.ndarray) -> np.ndarray:
        b, _, n, _ = x.shape
        return x.transpose(0, 2, 1, 3).reshape(b, n, self.d_model)  # (B, H, N, Dh) -> (B, N, D)

    def forward_train(self, x, memory=None, mask=None, rng=None):
        """forward (no KV cache) that also returns the cache for ``backward``.

        Shape: x (B, T, D); memory (B, S, D) when cross -> output (B, T, D), weights, cache
        """
        check_embeddings(x, self.d_model, "x")
        if memory is not None:
            check_embeddings(memory, self.d_model, "memory")
        if self.cross:
            q = self._split_heads(self.q_proj(x))  # (B, H, T, Dh)
            kv = self.kv_proj(memory)  # (B, S, 2D)
            k, v = np.split(kv, 2, axis=-1)  # 2 x (B, S, D)
            k, v = self._split_heads(k), self._split_heads(v)  # (B, H, S, Dh)
        else:
            q, k, v = np.split(self.qkv_proj(x), 3, axis=-1)  # 3 x (B, T, D)
            q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        out, weights, attn_cache = scaled_dot_product_attention_train(
            q, k, v, mask, self.dropout, rng
        )
        merged = self._merge_heads(out)  # (B, T, D)
        return self.out_proj(merged), weights, (x, memory, attn_cache, merged)

    def backward(self, dy, cache, grads: dict, prefix: str = ""):
        """Back through out_proj, the heads and the projections.

        Splitting into heads is a reshape and a transpose, so its backward is the inverse
        reshape; the fused projection's gradient is the three (B, T, D) gradients side by
        side, in the order q, k, v the forward split them.

        Shape: dy (B, T, D) -> dx (B, T, D), dmemory (B, S, D) or None (self-attention)
        """
        x, memory, attn_cache, merged = cache
        dmerged = self.out_proj.backward(dy, merged, grads, prefix + "out_proj.")  # (B, T, D)
        dout = self._split_heads(dmerged)  # (B, H, T, Dh)
        dq, dk, dv = scaled_dot_product_attention_backward(dout, attn_cache)
        dq, dk, dv = self._merge_heads(dq), self._merge_heads(dk), self._merge_heads(dv)
        if self.cross:
            dx = self.q_proj.backward(dq, x, grads, prefix + "q_proj.")
            dkv = np.concatenate([dk, dv], axis=-1)  # (B, S, 2D)
            dmemory = self.kv_proj.backward(dkv, memory, grads, prefix + "kv_proj.")
            return dx, dmemory
        dqkv = np.concatenate([dq, dk, dv], axis=-1)  # (B, T, 3D)
        return self.qkv_proj.backward(dqkv, x, grads, prefix + "qkv_proj."), None
