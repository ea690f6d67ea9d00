"""Attention's kernels: SDPA's fused kernel or two matmuls, on fp32 or bf16 values, chosen by
measuring each shape class on this machine; and whether the encoder runs packed (real tokens
only) or on the padded batch.

Shape legend: B batch, H heads, T queries, S keys, Dh head dim.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from tformer.nn.kernels import autotune
from tformer.nn.kernels.switch import is_readable
from tformer.nn.kernels.tracing import tracing, values_readable

if TYPE_CHECKING:
    from tformer.nn.masks import Mask

# Past this many scores (B * H * T * S, 16 MiB of fp32) attention is SDPA's without measuring:
# two matmuls would form them all, and timing them costs as much as it could win.
_MATMUL_SCORES_MAX = 2**22


# Attention ------------------------------------------------------------------------------------
def attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, dropout_p: float) -> Tensor:
    """softmax(q k^T / sqrt(Dh)) v without returning the weights: SDPA's fused kernel, or, for
    an unmasked inference call, two matmuls where they are measured faster here.

    Rows that may attend nothing are not fixed here (the caller zeroes them).

    Shape: q (B, H, T, Dh); k, v (B, H, S, Dh); allowed broadcastable to (B, H, T, S) -> (B, H, T, Dh)
    """
    dtype = q.dtype
    unmasked = allowed is None and dropout_p == 0.0
    compute = attention_dtype(q, k, v) if unmasked else attention_dtype(q)
    if not compute == dtype == k.dtype == v.dtype:  # (no-op .to()s: 3 operator calls a step)
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
    with _as_they_are(q):  # autocast would cast them back to bf16
        if unmasked:
            out = _unmasked_attention(q, k, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
    return out if out.dtype == dtype else out.to(dtype)


def attention_as_is(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Unmasked attention without dropout on q, k, v in the dtype they come in, by the kernel
    measured faster for the shape: packed attention's call per group of lengths, whose layer
    chose its dtype once (``MultiHeadAttention._packed_dtype``).

    Shape: q, k, v (B, H, L, Dh) -> (B, H, L, Dh)
    """
    with _as_they_are(q):  # autocast would cast fp32 values to bf16
        return _unmasked_attention(q, k, v)


def attention_past_and_new(q: Tensor, past_k: Tensor, past_v: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q [past_k; k]^T / sqrt(Dh)) [past_v; v] for one query a row, without concatenating:
    the past's scores and the new position's share one maximum and one sum. Scores and weights
    in float32 at least (a bf16 cache's are (B, H, 1, L) values: cheap to convert).

    Shape: q, k, v (B, H, 1, Dh); past_k, past_v (B, H, L, Dh) -> (B, H, 1, Dh)
    """
    exact = torch.promote_types(q.dtype, torch.float32)
    with _as_they_are(q):  # autocast would cast them to bf16
        q = q * (1.0 / math.sqrt(q.size(-1)))  # 1/sqrt(Dh) scales q (Dh values, not L scores)
        past = (q @ past_k.transpose(-2, -1)).to(exact)  # (B, H, 1, L)
        new = (q.to(exact) * k.to(exact)).sum(dim=-1, keepdim=True)  # (B, H, 1, 1)
        top = torch.maximum(past.amax(dim=-1, keepdim=True), new)  # (B, H, 1, 1) one max for both
        past, new = (past - top).exp(), (new - top).exp()
        total = past.sum(dim=-1, keepdim=True) + new  # (B, H, 1, 1) the softmax's denominator
        out = (past.to(past_v.dtype) @ past_v).to(exact) + new * v.to(exact)  # (B, H, 1, Dh)
        return (out / total).to(q.dtype)


def _as_they_are(q: Tensor) -> contextlib.AbstractContextManager:
    """A block where CPU autocast, if on, leaves attention's values in the dtype they have."""
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        return torch.autocast("cpu", enabled=False)
    return contextlib.nullcontext()


def _unmasked_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Unmasked attention without dropout by the kernel measured faster for the shape."""
    if attention_kernel(q, k, v) == "matmul":
        return _matmul_attention(q, k, v)
    return F.scaled_dot_product_attention(q, k, v)


def attention_dtype(q: Tensor, k: Tensor | None = None, v: Tensor | None = None) -> torch.dtype:
    """The dtype attention computes in. bf16 values on CPU (precision "bf16", autocast
    training) are computed in fp32, the same values, unless this is an unmasked inference call
    (k and v given: packed groups, cached decoding steps) and attention on the bf16 values as
    they are was measured faster on this machine for the shape class. Which wins depends on
    the CPU: on an AMD EPYC Zen 4 (avx512_bf16, no AMX) SDPA's bf16 flash kernel ran at a third
    to a half of its fp32 one, forward and backward; on a Zen 5 two bf16 matmuls beat every fp32
    kernel 1.5-3x at inference on short lengths. bf16 scores cost 1e-5 of min cosine on
    all-MiniLM-L6-v2 (0.99995 -> 0.99994). Packed attention converts a layer's q, k, v once, by
    the choice for its group of most tokens, and every group computes in that dtype: converting
    per group where a group's own choice differed (3 small copies, and the output back) cost
    more than the choice gained (a bf16 sentence-encoding run of all-MiniLM-L6-v2 ~0.93x the
    time without, Intel Xeon with AMX)."""
    if q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return q.dtype  # a GPU's SDPA kernels (flash, memory-efficient) take bf16 as it is
    if k is None or v is None or why_not_measured_attention(q, k, v) is not None:
        return torch.float32  # masked or dropout (no k, v given), training, tracing: fp32
    return torch.float32 if autotune.choose("attention-bf16", _attention_shape(q, k), lambda: {
        "fp32": lambda: _unmasked_attention(q.float(), k.float(), v.float()),
        "bf16": lambda: _unmasked_attention(q, k, v)}) == "fp32" else torch.bfloat16


def _matmul_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The explicit formula, unmasked: scores, softmax, weighted sum; 1/sqrt(Dh) scales q (as
    SDPA's kernels do), not the scores: T x Dh values, not T x S. Fast while the scores fit
    in the caches. bf16 scores are softmaxed in fp32, the weights multiplied in bf16: torch's
    bf16 softmax on CPU took 3.7x its fp32 one's time (32 x 12 heads x 45^2 scores, Intel Xeon,
    2 threads): the formula took 1.0x the time of SDPA's bf16 flash kernel there, now 0.6x."""
    scores = (q * (1.0 / math.sqrt(q.size(-1)))) @ k.transpose(-2, -1)
    return scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v.dtype) @ v


def attention_kernel(q: Tensor, k: Tensor, v: Tensor) -> str:
    """"sdpa" or "matmul" for an unmasked attention call without dropout: the faster measured on
    this device for the shape class (the score count's and the key length's powers of two).
    SDPA's flash kernel walks the keys in blocks; two matmuls form all the scores, which is
    1.5-3x faster while they fit in the caches (batches of short sequences, packed groups) and
    up to 5x slower past them (AMD EPYC Zen 4: faster below about 2^20 scores)."""
    if why_not_measured_attention(q, k, v) is not None:
        return "sdpa"
    scores = q.shape[:-1].numel() * k.size(-2)
    if scores > _MATMUL_SCORES_MAX:
        return "sdpa"  # the scores would not fit in any cache, and memory grows as their square
    return autotune.choose("attention-infer", _attention_shape(q, k), lambda: {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "matmul": lambda: _matmul_attention(q, k, v)}, device=q.device)


# Under autograd a packed batch's attention runs once per bucket of its groups of lengths, each
# bucket padded to its longest (tformer.nn.masks.Packing.buckets): the two calls timed to price a
# call against its scores, (sequences, length) each.
_CALL_SHAPES = {"small": (1, 8), "large": (8, 32)}


def attention_call_scores(heads: int, head_dim: int, dropout_p: float,
                          device: torch.device | None = None) -> float:
    """How many scores (query x key x head) cost as much as one attention call more, forward
    and backward, as training runs it here (masked, the model's attention dropout, autocast as
    the caller has it): a call on a few short sequences is ~25 operators, ~1.2 ms on an Intel
    Xeon at 1 thread, where a score costs ~60 ns; a batch of 32 short texts in 16 groups of
    lengths spent a quarter of a fine-tune step in attention calls. From a small and a larger
    call, measured once per machine (autotune.timings; the dropout draws on a forked generator,
    so that a run draws the same whether or not this was known); 0 (a call per group) where
    nothing is known and nothing is left to measure with."""
    from tformer.nn.attention import scaled_dot_product_attention

    device = device or torch.device("cpu")
    autocast = torch.is_autocast_enabled(device.type)

    def call(count: int, length: int):
        g = torch.Generator().manual_seed(0)  # never the global generator
        q, k, v = (torch.randn(count, heads, length, head_dim, generator=g).to(device).requires_grad_()
                   for _ in range(3))
        keys = torch.ones(count, 1, 1, length, dtype=torch.bool, device=device)
        dy = torch.randn(count, heads, length, head_dim, generator=g).to(device)  # dense, as a loss sends

        def run() -> None:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [],
                                       device_type=device.type):
                out, _ = scaled_dot_product_attention(q, k, v, keys, dropout_p)
                out.float().backward(dy)
        return run

    seconds = autotune.timings(
        "attention-call", f"{heads}x{head_dim} dropout {dropout_p:g}{' autocast' if autocast else ''}",
        lambda: {name: call(*shape) for name, shape in _CALL_SHAPES.items()}, device=device)
    if seconds is None:
        return 0.0
    scores = {name: heads * count * length * length for name, (count, length) in _CALL_SHAPES.items()}
    per_score = max(seconds["large"] - seconds["small"], 1e-12) / (scores["large"] - scores["small"])
    return max(seconds["small"] / per_score - scores["small"], 0.0)


def why_not_measured_attention(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """Why an unmasked attention call takes SDPA on fp32 values without a measured choice of
    kernel and dtype, or None to measure."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return "training: SDPA's backward"
    if tracing() or is_in_torch_dispatch_mode():
        return "compilers and exporters take SDPA"
    return None  # measured on q's own device (tformer.nn.kernels.autotune keys choices by device)


def _attention_shape(q: Tensor, k: Tensor) -> str:
    """The shape class of an attention call: powers of two of its score count and key length,
    the head dim and the dtype."""
    scores = q.shape[:-1].numel() * k.size(-2)
    return f"{1 << (scores - 1).bit_length()}/{1 << (k.size(-2) - 1).bit_length()}x{q.size(-1)}/" \
           f"{str(q.dtype).removeprefix('torch.')}"


def why_not_fused_attention(q: Tensor, k: Tensor, dropout_p: float, need_weights: bool) -> str | None:
    """Why attention must form the (T, S) weights with the explicit softmax, or None to fuse."""
    if need_weights:
        return "attention weights requested: only the explicit softmax forms them"
    if dropout_p > 0.0 and q.device.type == "cpu":
        # SDPA's CPU kernels have no dropout: it falls back to its own explicit softmax, and
        # draws with torch's per-element dropout (tformer.nn.dropout says why that is slow).
        # A GPU's flash and memory-efficient kernels draw dropout inside the fused kernel.
        return "attention dropout on CPU: the explicit softmax draws it with tformer.nn.dropout"
    if is_readable():
        return "kernels.readable() asks for the explicit softmax"
    return None


# Execution ------------------------------------------------------------------------------------
def why_not_packed(mask: Mask | None, general_mask: bool, need_weights: bool,
                   skip_padding: bool | None) -> str | None:
    """Why the encoder must run on the padded batch, or None to run on real tokens only."""
    if skip_padding is False:
        return "skip_padding=False asks for padded execution"
    if mask is None or mask.padding is None:
        return "no padding mask: every position is a real token"
    if general_mask:
        return "a general attn_mask: packed attention knows padding only"
    if need_weights:
        return "attention weights requested: they are (B, H, S, S), a padded layout"
    if is_readable():
        return "kernels.readable() runs the padded batch"
    if not values_readable(mask.padding):
        return "packing reads the mask's values: not while tracing (compile, export) or on meta"
    if mask.padding.device.type != "cpu" and skip_padding is None:
        # One SDPA call per layer on the padded batch, where packing makes one per group of
        # equal lengths (each a kernel launch) and reads the mask's values (a device sync).
        return "on a GPU the padded batch runs as one attention call per layer"
    if not mask.has_padding:
        return "no padded position: nothing to skip"
    if not mask.packing.groups:
        return "no real token anywhere: nothing to compute"
    return None
