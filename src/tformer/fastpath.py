"""Fast paths for the encoder: the readable modules' numbers, computed faster on CPU.

The readable modules (layers.py, attention.py, feedforward.py) define what is computed; the
functions here compute the same thing, in the same order (dropout draws included), and
tests/test_fastpath.py proves each equal to the readable path (max abs difference <= 1e-5 in
float32). ``Encoder.forward`` chooses them; every condition that decides says why in one line
(``why_not``), and ``with fastpath.disabled():`` runs the readable path only.

Where the time goes, and what this file does about it (profiles in benchmarks/README.md):
- Matrix multiplies are ~80% of an encoder layer. ``torch.ops.mkldnn._linear_pointwise`` runs
  them through oneDNN, which on AVX-512 CPUs is ~2x faster than the MKL sgemm behind F.linear,
  forward and backward. Without autograd it also fuses the bias, the activation and the
  residual add into the multiply. Without oneDNN (or for other dtypes): F.linear, same code.
- Every fresh activation buffer costs page faults and a pass over memory: no separate bias copy,
  activation or residual tensor; q, k, v are views into the fused projection, read strided by SDPA.
- Padded batches: with ``skip_padding=True`` the position-wise work (projections, FFN, norms)
  runs on the real tokens only, packed as (N, D), and attention runs once per group of
  equal-length sequences. Padded positions are not computed: the layers leave zeros there.

Shape legend: B batch, S length, N real tokens, D model dim, H heads, Dh head dim, F FFN dim.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from tformer.layers import EncoderLayer

# oneDNN's fused linear: present in CPU builds with MKL-DNN; float32 and bfloat16.
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_ONEDNN_DTYPES = (torch.float32, torch.bfloat16)
# Our activation names -> oneDNN's (attr, algorithm).
_ONEDNN_ACTIVATION = {"relu": ("relu", ""), "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh")}
_ACTIVATION = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}

Attend = Callable[[Tensor], Tensor]  # fused qkv (..., 3D) -> attention output (..., D)

_enabled = True


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the readable path only (to compare, or to debug): ``with fastpath.disabled(): ...``."""
    global _enabled
    previous, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = previous


def why_not(h: Tensor, attn_mask: Tensor | None, need_weights: bool, need_hidden: bool) -> str | None:
    """Why the encoder must run its readable loop, or None when the fast path applies."""
    if not _enabled:
        return "disabled by tformer.fastpath.disabled()"
    if need_weights or need_hidden:
        return "attention weights or hidden states requested: the readable loop returns them"
    if attn_mask is not None:
        return "a general attn_mask: the fast path knows padding masks only"
    if h.device.type != "cpu" or h.dtype not in _ONEDNN_DTYPES:
        return "not float32/bfloat16 on CPU: nothing faster than the readable path there"
    return None


# Leaves ------------------------------------------------------------------------------------
def _onednn_linear(x: Tensor, w: Tensor, b: Tensor | None, attr: str = "none",
                   algorithm: str = "") -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, attr, [], algorithm)


class _OneDNNLinear(torch.autograd.Function):
    """F.linear with oneDNN forward and backward: y = x W^T + b, dx = dy W, dW = dy^T x."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return _onednn_linear(x, w, b)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, w = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.size(-1))  # (N, out)
        dx = _onednn_linear(dy, w.t(), None) if ctx.needs_input_grad[0] else None  # (..., in)
        dw = db = None
        if ctx.needs_input_grad[1]:
            dw = _onednn_linear(dy2.t(), x.reshape(-1, x.size(-1)).t(), None)  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(dim=0)  # (out,)
        return dx, dw, db


def linear(x: Tensor, layer: nn.Linear, activation: str | None = None,
           residual: Tensor | None = None) -> Tensor:
    """activation(layer(x)) or layer(x) + residual, in one oneDNN call when available.

    Shape: x (..., in) -> (..., out); residual (..., out)
    """
    w, b = layer.weight, layer.bias
    if not (_ONEDNN and x.dtype in _ONEDNN_DTYPES):  # nothing faster for this dtype
        y = F.linear(x, w, b)
    elif torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, b)):
        y = _OneDNNLinear.apply(x, w, b)  # autograd: the fused epilogues below have no backward
    elif residual is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, w, b, "add")
    else:
        attr, algorithm = _ONEDNN_ACTIVATION[activation] if activation else ("none", "")
        return _onednn_linear(x, w, b, attr, algorithm)
    if activation is not None:
        y = _ACTIVATION[activation](y)
    return y if residual is None else y + residual


def _norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def encoder_layer(layer: EncoderLayer, x: Tensor, attend: Attend) -> Tensor:
    """EncoderLayer.forward: the same maths, in the same order (dropout draws included).

    Post-norm: x = LN(x + Attn(x)); x = LN(x + FFN(x)). Pre-norm: x = x + Attn(LN(x)); x = x + FFN(LN(x)).

    Shape: x (..., D) -> (..., D); ``attend`` maps the fused projection (..., 3D) to (..., D).
    """
    attn, ffn = layer.self_attn, layer.ffn
    p = layer.dropout.p if layer.training else 0.0

    def out(h: Tensor, proj: nn.Linear, residual: Tensor) -> Tensor:  # residual + Dropout(proj(h))
        if p == 0.0:
            return linear(h, proj, residual=residual)  # the add fused into the multiply
        return residual + F.dropout(linear(h, proj), p)

    if layer.norm_first:
        x = out(attend(linear(_norm(layer.attn_norm, x), attn.qkv_proj)), attn.out_proj, x)
        return out(linear(_norm(layer.ffn_norm, x), ffn.up, ffn.activation), ffn.down, x)
    x = _norm(layer.attn_norm, out(attend(linear(x, attn.qkv_proj)), attn.out_proj, x))
    return _norm(layer.ffn_norm, out(linear(x, ffn.up, ffn.activation), ffn.down, x))


# Attention ---------------------------------------------------------------------------------------
_BF16_SCORES_MAX = 2**24  # B * H * T * S up to 32 MiB of bf16 scores: materialising them is cheap


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float) -> Tensor:
    """softmax(q k^T / sqrt(Dh)) v through SDPA, or two bf16 matmuls when that is faster.

    Shape: q (B, H, T, Dh); k, v (B, H, S, Dh); mask broadcastable to (B, H, T, S) -> (B, H, T, Dh)
    """
    b, h, t, _ = q.shape
    if q.dtype == torch.bfloat16 and dropout_p == 0.0 and b * h * t * k.size(2) <= _BF16_SCORES_MAX:
        return _matmul_attention(q, k, v, mask)  # bf16: SDPA's flash kernel runs at half this speed
    return F.scaled_dot_product_attention(q, k, v, mask, dropout_p)


def _matmul_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    scores = q @ k.transpose(-2, -1)  # (B, H, T, S)
    scores.mul_(q.size(-1) ** -0.5)
    if mask is not None:
        scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)  # as the readable path
    return scores.softmax(dim=-1) @ v  # (B, H, T, Dh)


# Attention over a padded batch ---------------------------------------------------------------
def dense_attend(n_heads: int, mask: Tensor | None, empty_rows: Tensor | None,
                 dropout_p: float) -> Attend:
    """SDPA on views of the fused projection; rows that may attend nothing are zeroed.

    Shape: qkv (B, S, 3D) -> (B, S, D); mask and empty_rows broadcastable to (B, H, S, S), (B, H, S, 1)
    """

    def attend(qkv: Tensor) -> Tensor:
        b, s, three_d = qkv.shape
        q, k, v = qkv.view(b, s, 3, n_heads, three_d // (3 * n_heads)).permute(2, 0, 3, 1, 4)
        out = attention(q, k, v, mask, dropout_p)  # (B, H, S, Dh)
        if empty_rows is not None:
            out = out.masked_fill(empty_rows, 0.0)
        return out.transpose(1, 2).reshape(b, s, three_d // 3)  # (B, S, D), a view

    return attend


# Unpadded execution ------------------------------------------------------------------------------
def pack(attention_mask: Tensor) -> tuple[Tensor, list[tuple[int, int]]]:
    """The real tokens' flat indices, sequences sorted by length, and the (length, count) groups.

    Sorting puts sequences of equal length next to each other, so each group's tokens are one
    contiguous (count * length, D) block that attention can process as a batch.

    Shape: attention_mask (B, S) bool -> index (N,) into B * S
    """
    b, s = attention_mask.shape
    lengths = attention_mask.sum(dim=1)  # (B,)
    order = torch.argsort(lengths, stable=True)  # (B,)
    flat = order[:, None] * s + torch.arange(s, device=order.device)  # (B, S) in sorted order
    index = flat[attention_mask[order]]  # (N,)
    sizes, counts = torch.unique_consecutive(lengths[order], return_counts=True)
    pairs = zip(sizes.tolist(), counts.tolist(), strict=True)
    groups = [(size, count) for size, count in pairs if size > 0]  # all-padding rows: nothing to do
    return index, groups


def packed_attend(n_heads: int, groups: list[tuple[int, int]], dropout_p: float) -> Attend:
    """Attention within each sequence of a packed batch, one SDPA per group of equal lengths.

    Shape: qkv (N, 3D) -> (N, D)
    """

    def attend(qkv: Tensor) -> Tensor:
        n, three_d = qkv.shape
        d = three_d // 3
        outputs, start = [], 0
        for length, count in groups:
            block = qkv[start : start + count * length]  # (count * length, 3D)
            q, k, v = block.view(count, length, 3, n_heads, d // n_heads).permute(2, 0, 3, 1, 4)
            out = attention(q, k, v, None, dropout_p)  # (count, H, L, Dh)
            outputs.append(out.transpose(1, 2).reshape(count * length, d))
            start += count * length
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)  # (N, D)

    return attend


# The whole stack ----------------------------------------------------------------------------------
def encoder_layers(layers: nn.ModuleList, h: Tensor, attention_mask: Tensor | None,
                   mask: Tensor | None, skip_padding: bool) -> Tensor:
    """Run every encoder layer on h (B, S, D); with skip_padding, on its real tokens only.

    ``mask`` is the combined (B, 1, 1, S) mask from ``build_attention_mask``.
    """
    attn = layers[0].self_attn
    n_heads, dropout_p = attn.n_heads, attn.dropout if attn.training else 0.0
    if skip_padding and attention_mask is not None:
        b, s, d = h.shape
        index, groups = pack(attention_mask.to(torch.bool))
        out = h.new_zeros(b * s, d)
        if not groups:  # no real token anywhere
            return out.view(b, s, d)
        x = h.reshape(b * s, d)[index]  # (N, D)
        attend = packed_attend(n_heads, groups, dropout_p)
        for layer in layers:
            x = encoder_layer(layer, x, attend)
        out[index] = x
        return out.view(b, s, d)
    empty_rows = None
    if mask is not None and not bool(mask.any(dim=-1).all()):
        empty_rows = ~mask.any(dim=-1, keepdim=True)  # (B, 1, 1, 1): sequences with no real token
    attend = dense_attend(n_heads, mask, empty_rows, dropout_p)
    for layer in layers:
        h = encoder_layer(layer, h, attend)
    return h
