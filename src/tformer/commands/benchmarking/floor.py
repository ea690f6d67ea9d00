"""The floor: a tutorial-style NumPy encoder in float64. Not part of tformer; only `tformer bench` runs it.

Written the way courses and blog posts write a Transformer encoder: float64 throughout, one
attention head at a time, separate q/k/v projections, softmax and layer norm spelled out, every
step a new array. tformer's NumPy reference must be at least 3x faster than this (issue 5).
GELU uses the same erf as the reference (NumPy has none), so the outputs agree.

It reads a tformer ``Encoder`` state dict (BERT-style or embedding-input configs, post- or pre-norm).
"""

from __future__ import annotations

import numpy as np

from tformer.config import TransformerConfig
from tformer.reference.feedforward import erf


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def activation(x, name):
    if name == "relu":
        return np.maximum(x, 0)
    if name == "gelu":
        return 0.5 * x * (1 + erf(x / np.sqrt(2)))
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def attention(x, w, prefix, n_heads, key_mask):
    """Multi-head self-attention, one head at a time. x: (B, S, D); key_mask: (B, S) or None."""
    d = x.shape[-1]
    dh = d // n_heads
    qkv_w, qkv_b = w[prefix + "qkv_proj.weight"], w[prefix + "qkv_proj.bias"]
    wq, wk, wv = qkv_w[:d], qkv_w[d : 2 * d], qkv_w[2 * d :]
    bq, bk, bv = qkv_b[:d], qkv_b[d : 2 * d], qkv_b[2 * d :]
    heads = []
    for h in range(n_heads):
        cols = slice(h * dh, (h + 1) * dh)
        q = x @ wq[cols].T + bq[cols]  # (B, S, Dh)
        k = x @ wk[cols].T + bk[cols]
        v = x @ wv[cols].T + bv[cols]
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(dh)  # (B, S, S)
        if key_mask is not None:
            scores = np.where(key_mask[:, None, :], scores, -1e30)
        heads.append(softmax(scores) @ v)
    concat = np.concatenate(heads, axis=-1)  # (B, S, D)
    return concat @ w[prefix + "out_proj.weight"].T + w[prefix + "out_proj.bias"]


def feed_forward(x, w, prefix, act):
    hidden = activation(x @ w[prefix + "up.weight"].T + w[prefix + "up.bias"], act)
    return hidden @ w[prefix + "down.weight"].T + w[prefix + "down.bias"]


class FloorEncoder:
    """Call with token ids (B, S) (or embeddings (B, S, D)) and an optional (B, S) mask."""

    def __init__(self, config: TransformerConfig, state: dict):
        self.config = config
        self.w = {k: np.asarray(v, dtype=np.float64) for k, v in state.items()}

    def __call__(self, x, attention_mask=None):
        c, w = self.config, self.w
        mask = None if attention_mask is None else np.asarray(attention_mask, dtype=bool)
        if c.vocab_size:
            x = w["tok_emb.weight"][x] * c.embedding_scale
        x = np.asarray(x, dtype=np.float64)
        if c.positional == "learned":
            x = x + w["pos_emb.weight"][: x.shape[1]]
        elif c.positional == "sinusoidal":
            pos = np.arange(x.shape[1])[:, None]
            i = np.arange(0, c.d_model, 2)
            angles = pos / 10000 ** (i / c.d_model)
            pe = np.zeros((x.shape[1], c.d_model))
            pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles[:, : c.d_model // 2])
            x = x + pe
        if c.type_vocab_size:
            x = x + w["type_emb.weight"][0]
        if c.embedding_norm:
            x = layer_norm(x, w["emb_norm.weight"], w["emb_norm.bias"], c.layer_norm_eps)
        for i in range(c.n_layers):
            p = f"layers.{i}."

            def norm(y, name, p=p):
                return layer_norm(y, w[p + name + ".weight"], w[p + name + ".bias"], c.layer_norm_eps)

            if c.norm_first:
                x = x + attention(norm(x, "attn_norm"), w, p + "self_attn.", c.n_heads, mask)
                x = x + feed_forward(norm(x, "ffn_norm"), w, p + "ffn.", c.activation)
            else:
                x = norm(x + attention(x, w, p + "self_attn.", c.n_heads, mask), "attn_norm")
                x = norm(x + feed_forward(x, w, p + "ffn.", c.activation), "ffn_norm")
        if c.final_norm:
            x = layer_norm(x, w["final_norm.weight"], w["final_norm.bias"], c.layer_norm_eps)
        return x
