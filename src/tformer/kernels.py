"""Which kernel computes a step: the choice, made here, with a one-line reason per condition.

The modules (attention.py, feedforward.py, layers.py, model.py) say *what* is computed; they
call this file for *how*. Every fast kernel computes the plain kernel's numbers, in the same
order (dropout draws included), and tests/test_kernels.py proves each equal to the plain one
(float32 <= 1e-5, float64 <= 1e-10). ``with kernels.readable():`` runs the plain kernels only:
F.linear, an explicit softmax for attention, and padded execution.

Where the time goes, and what the choices here do about it (profiles in benchmarks/README.md):
- Matrix multiplies are ~80% of an encoder layer. oneDNN's ``_linear_pointwise`` runs them,
  and without autograd fuses the bias and the activation into the multiply (no separate
  activation buffer: one pass less over memory). Fusing the residual add too bought nothing
  measurable (paired, same run, AVX2 EPYC: dense-base 0.995x, train-base 0.98x with it off,
  both inside the noise), so the layers add it themselves, as the NumPy mirror does.
- Padded batches: the position-wise work (projections, FFN, norms) can run on the real tokens
  only, packed as (N, D), with attention once per group of equal-length sequences
  (``Encoder.forward`` chooses this through ``why_not_packed``).

Shape legend: B batch, S length, N real tokens, D model dim, H heads, Dh head dim.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import is_in_torch_dispatch_mode
from torch.utils.weak import WeakIdKeyDictionary

from tformer import autotune
from tformer.masks import Mask
from tformer.tracing import tracing, values_readable

# config.ACTIVATIONS' names -> (the plain function, oneDNN's post-op name and algorithm for it)
ACTIVATIONS = {
    "relu": (F.relu, "relu", ""),
    "gelu": (F.gelu, "gelu", "none"),  # exact: x * Phi(x), with the erf (Hendrycks & Gimpel 2016)
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "gelu", "tanh"),
}
# The same functions, overwriting their input (a buffer nothing else reads; no autograd): the
# same values, bit for bit, without a second buffer of the input's size.
ACTIVATIONS_IN_PLACE = {
    "relu": torch.relu_,
    "gelu": torch.ops.aten.gelu_,
    "gelu_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
}

# oneDNN's fused linear: in CPU builds with MKL-DNN. Its bf16 inner product needs CPU
# instructions (avx512_bf16 or AMX) that not every machine has.
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_ONEDNN_BF16 = _ONEDNN and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
# oneDNN's int8 linear (u8 activations x s8 weights, int32 sums), for tformer.int8.
_ONEDNN_INT8 = hasattr(torch.ops, "onednn") and hasattr(torch.ops.onednn, "qlinear_pointwise")
# Training through oneDNN's linear (forward and backward) or MKL's (F.linear): which is faster
# depends on the machine (oneDNN's ran 1.2x-2.2x MKL's GEMMs on one AVX-512 CPU, and made a
# BERT-base step 1.34x slower on another), so it is measured here per shape class
# (tformer.autotune), never chosen from CPU flags.
# Past this many scores (B * H * T * S, 16 MiB of fp32) attention is SDPA's without measuring:
# two matmuls would form them all, and timing them costs as much as it could win.
_MATMUL_SCORES_MAX = 2**22

_readable = False


@contextlib.contextmanager
def readable() -> Iterator[None]:
    """Run the plain kernels only (to compare, to debug, to read): ``with kernels.readable():``."""
    global _readable
    previous, _readable = _readable, True
    try:
        yield
    finally:
        _readable = previous


# Linear ---------------------------------------------------------------------------------------
def why_not_onednn(x: Tensor, weight: Tensor) -> str | None:
    """Why a linear must run as F.linear, or None when oneDNN's fused linear applies."""
    if _readable:
        return "kernels.readable() asks for the plain kernels"
    if not _ONEDNN:
        return "this torch build has no oneDNN fused linear"
    if tracing():
        return "compilers and exporters know F.linear, not oneDNN's custom op"
    if is_in_torch_dispatch_mode():
        return "a dispatch mode (FLOP counter, fake tensors) is watching: it knows aten's linear"
    if x.device.type != "cpu":
        return "oneDNN's linear is a CPU kernel"
    if torch.is_autocast_enabled(x.device.type):
        return "autocast casts F.linear's inputs itself; oneDNN would get mixed dtypes"
    if x.dtype != weight.dtype:
        return "input and weight dtypes differ: F.linear raises the error users expect"
    if x.dtype == torch.bfloat16 and not _ONEDNN_BF16:
        return "this CPU lacks the bf16 instructions oneDNN's inner product needs"
    if x.dtype not in (torch.float32, torch.bfloat16):
        return "oneDNN's linear takes float32 and bfloat16 only"
    return None


def _onednn_linear(x: Tensor, w: Tensor, b: Tensor | None, attr: str = "none",
                   algorithm: str = "") -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, attr, [], algorithm)


# Frozen weights (requires_grad False: what the inference loaders give, SentenceEncoder's and a
# run's) in oneDNN's blocked layout, made once per weight. Read from the plain layout, oneDNN
# reorders the weight on every call: packed once, its multiply ran 3-9% faster at 1,000+ rows
# and 15-40% at 16-64 (a decoding step) for fp32 and bf16 alike (AMD EPYC Zen 4; the hint's row
# count barely mattered from 16 up). The cost: a second copy of each weight used so. A weight
# that trains is read as it is: an optimizer can write it without a trace (torch's fused AdamW
# leaves its version counter as it was; so do writes through ``.data``), and a stale copy
# would compute with old weights (a run's validations did, before this rule).
_PACK_ROWS = 64
_packed: WeakIdKeyDictionary = WeakIdKeyDictionary()


def packed_weight(w: Tensor) -> Tensor:
    """w (out, in) in oneDNN's layout for its inner product where w is frozen, else w.

    Packed at its second use unchanged: a weight made afresh for each call (never seen twice)
    is not copied for nothing, and one that is written between calls stays plain.
    """
    if w.requires_grad:
        return w  # it may train: see above
    # What the packed copy was made from: its writes, its storage (``.data =`` and
    # ``module.to(dtype)`` swap it in place of the same parameter), its dtype and shape.
    made_from = (w._version, w.data_ptr(), w.dtype, w.shape)
    entry = _packed.get(w)
    if entry is None or entry[0] != made_from:
        _packed[w] = (made_from, None)  # seen once, as it is now
        return w
    if entry[1] is None:
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), _PACK_ROWS)
        _packed[w] = entry = (made_from, packed)
    return entry[1]


class _OneDNNLinear(torch.autograd.Function):
    """F.linear with oneDNN forward and backward: y = x W^T + b, dx = dy W, dW = dy^T x.

    With ``mm_weight_grad``, dW is MKL's ``mm``: it reads dy^T and x^T where they lie, where
    oneDNN first copies them contiguous. Which is faster depends on the shape (the copy costs
    most where the layer's output is wide), so it is a third measured candidate."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor | None, mm_weight_grad: bool = False) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias, ctx.mm_weight_grad = b is not None, mm_weight_grad
        return _onednn_linear(x, w, b)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, w = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.size(-1))  # (N, out)
        dx = _onednn_linear(dy, w.t(), None) if ctx.needs_input_grad[0] else None  # (..., in)
        dw = db = None
        if ctx.needs_input_grad[1]:
            x2 = x.reshape(-1, x.size(-1))  # (N, in)
            dw = torch.mm(dy2.t(), x2) if ctx.mm_weight_grad else _onednn_linear(dy2.t(), x2.t(), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(dim=0)  # (out,)
        return dx, dw, db, None


def _shape_class(x: Tensor, w: Tensor) -> tuple[int, str]:
    """(rows, "in x out / rows / dtype"): the token count rounded up to a power of two."""
    tokens = max(x.numel() // max(x.size(-1), 1), 1)
    rows = 1 << (tokens - 1).bit_length()  # 1000 tokens -> 1024
    return rows, f"{w.size(1)}x{w.size(0)}/{rows}/{str(x.dtype).removeprefix('torch.')}"


def infer_kernel(x: Tensor, w: Tensor, activation: str | None) -> str:
    """"onednn" (bias and activation fused into the multiply) or "mkl" (F.linear, then the
    activation) without autograd: the faster measured on this machine for the shape class,
    oneDNN's timed as it will run (its weight packed where frozen: ``packed_weight``)."""
    rows, shape = _shape_class(x, w)
    frozen = not w.requires_grad

    def candidates() -> dict[str, Callable[[], None]]:  # made only when a measurement is due
        g = torch.Generator().manual_seed(0)  # never the global generator
        a = torch.randn(rows, w.size(1), generator=g, dtype=x.dtype)
        m = torch.randn(w.shape, generator=g, dtype=w.dtype)
        bias = torch.zeros(w.size(0), dtype=w.dtype)
        plain, attr, algorithm = ACTIVATIONS[activation] if activation else (None, "none", "")
        m_onednn = torch.ops.mkldnn._reorder_linear_weight(m, _PACK_ROWS) if frozen else m
        return {"onednn": lambda: _onednn_linear(a, m_onednn, bias, attr, algorithm),
                "mkl": lambda: F.linear(a, m, bias) if plain is None else plain(F.linear(a, m, bias))}

    weights = "packed" if frozen else "plain"
    return autotune.choose("linear-infer", f"{shape}/{activation or 'none'}/{weights}", candidates)


TRAIN_KERNELS = ("mkl", "onednn", "onednn+mm")  # F.linear; _OneDNNLinear; with mm's dW


def train_kernel(x: Tensor, w: Tensor) -> str:
    """One of TRAIN_KERNELS for a linear under autograd: the fastest forward + backward measured
    on this machine for the shape class (in x out, the token count's power of two, the dtype)."""
    rows, shape = _shape_class(x, w)

    def candidates() -> dict[str, Callable[[], None]]:  # made only when a measurement is due
        g = torch.Generator().manual_seed(0)  # never the global generator: dropout draws stay put
        a = torch.randn(rows, w.size(1), generator=g, dtype=x.dtype).requires_grad_()
        m = torch.randn(w.shape, generator=g, dtype=w.dtype).requires_grad_()
        bias = torch.zeros(w.size(0), dtype=w.dtype).requires_grad_()
        # A dense gradient, as a loss sends back: `.sum().backward()` would send a stride-0
        # tensor of ones, which each kernel copies first, and time the copies, not the GEMMs.
        dy = torch.randn(rows, w.size(0), generator=g, dtype=x.dtype)

        def step(apply) -> Callable[[], None]:
            def run() -> None:
                with torch.autocast("cpu", enabled=False):
                    apply(a, m, bias).backward(dy)

            return run

        return {"mkl": step(F.linear), "onednn": step(_OneDNNLinear.apply),
                "onednn+mm": step(lambda a, m, bias: _OneDNNLinear.apply(a, m, bias, True))}

    return autotune.choose("linear-train", shape, candidates)


def linear(x: Tensor, layer: nn.Linear, activation: str | None = None) -> Tensor:
    """activation(layer(x)), the activation fused into oneDNN's multiply when it applies.

    Shape: x (..., in) -> (..., out)
    """
    if not isinstance(layer, nn.Linear):  # a layer with its own kernel: int8.Int8Linear
        return layer(x, activation)
    if layer.weight.dtype == torch.bfloat16 and x.dtype == torch.float32:  # precision "bf16"
        return _bf16_linear(x, layer, activation)
    return linear_weights(x, layer.weight, layer.bias, activation)


def linear_weights(x: Tensor, w: Tensor, b: Tensor | None = None,
                   activation: str | None = None) -> Tensor:
    """activation(x W^T + b) from the tensors themselves: ``linear`` for any weight (int8's
    rotation is one). oneDNN's fused linear when it applies, else F.linear.

    Shape: x (..., in), w (out, in), b (out,) -> (..., out)
    """
    if why_not_onednn(x, w) is None and x.numel():
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, b)):
            # autograd: the fused epilogues have no backward; oneDNN's or MKL's, as measured here
            kernel = train_kernel(x, w)
            y = F.linear(x, w, b) if kernel == "mkl" else _OneDNNLinear.apply(x, w, b, kernel == "onednn+mm")
        elif infer_kernel(x, w, activation) == "onednn":
            _, attr, algorithm = ACTIVATIONS[activation] if activation else (None, "none", "")
            return _onednn_linear(x, packed_weight(w), b, attr, algorithm)
        else:
            y = F.linear(x, w, b)
    else:
        y = F.linear(x, w, b)
    return y if activation is None else ACTIVATIONS[activation][0](y)


def _bf16_linear(x: Tensor, layer: nn.Linear, activation: str | None) -> Tensor:
    """bf16 weights, fp32 activations: multiply bf16 values. The result stays bf16 where bf16
    units computed it (rounded to bf16 as they write it): the next bf16 layer (the FFN's down,
    attention) reads it as it is, and the residual add promotes it to fp32, so no pass over
    memory only casts; where the product ran in fp32, it is returned in fp32.

    Shape: x (..., in) float32 -> (..., out) bfloat16, or float32 without bf16 units
    """
    xb = x.to(torch.bfloat16)
    if _ONEDNN_BF16 or x.device.type != "cpu":
        return linear(xb, layer, activation)  # bf16 units multiply, accumulating in fp32
    # No bf16 instructions: the same bf16 values multiplied in fp32 beat emulated bf16 here.
    b = None if layer.bias is None else layer.bias.float()
    y = F.linear(xb.float(), layer.weight.float(), b)
    return y if activation is None else ACTIVATIONS[activation][0](y)


# int8 linear (tformer.int8) ----------------------------------------------------------------
def int8_prepack(weight_int8: Tensor) -> Tensor | None:
    """oneDNN's packed layout of int8 weights (M, K), or None where its int8 linear is absent."""
    return torch.ops.onednn.qlinear_prepack(weight_int8, None) if _ONEDNN_INT8 else None


def int8_linear(q: Tensor, zero: int, packed: Tensor, weight_scale: Tensor) -> Tensor:
    """(q - zero) q_W^T s_W with int32 sums, in float32: oneDNN's int8 kernel.

    Shape: q (N, K) uint8; weight_scale (M,) -> (N, M) float32
    """
    return torch.ops.onednn.qlinear_pointwise(
        q, 1.0, zero, packed, weight_scale, torch.zeros_like(weight_scale, dtype=torch.long),
        None, 1.0, 0, torch.float32, "none", [], "")


def why_not_onednn_int8(x: Tensor, packed: Tensor | None) -> str | None:
    """Why the int8 multiply must be summed in float32, or None for oneDNN's int8 kernel."""
    if packed is None:
        return "this torch build has no oneDNN int8 linear"
    reason = why_not_onednn(x, x)  # readable(), tracing, dispatch modes, device
    if reason is not None:
        return reason
    if not x.numel():
        return "no tokens: nothing to multiply"
    return None


# Attention ------------------------------------------------------------------------------------
def attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, dropout_p: float) -> Tensor:
    """softmax(q k^T / sqrt(Dh)) v without returning the weights: SDPA's fused kernel, or, for
    an unmasked inference call, two matmuls where they are measured faster here.

    Rows that may attend nothing are not fixed here (the caller zeroes them).

    Shape: q (B, H, T, Dh); k, v (B, H, S, Dh); allowed broadcastable to (B, H, T, S) -> (B, H, T, Dh)
    """
    dtype, cpu = q.dtype, q.device.type == "cpu"
    unmasked = allowed is None and dropout_p == 0.0
    compute = attention_dtype(q, k, v) if unmasked else attention_dtype(q)
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    # autocast would cast them back to bf16
    with torch.autocast("cpu", enabled=False) if cpu else contextlib.nullcontext():
        if unmasked:
            out = _unmasked_attention(q, k, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
    return out.to(dtype)


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
    the choice for its group of most tokens, not once per group of lengths (3 small copies per
    group cost ~5% of a bf16 sentence-encoding run); a group whose own choice differs converts
    its own."""
    if q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return q.dtype
    if k is None or v is None or why_not_measured_attention(q, k, v) is not None:
        return torch.float32  # masked or dropout (no k, v given), training, tracing: fp32
    return torch.float32 if autotune.choose("attention-bf16", _attention_shape(q, k), lambda: {
        "fp32": lambda: _unmasked_attention(q.float(), k.float(), v.float()),
        "bf16": lambda: _unmasked_attention(q, k, v)}) == "fp32" else torch.bfloat16


def _matmul_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The explicit formula, unmasked: scores, softmax, weighted sum; 1/sqrt(Dh) scales q (as
    SDPA's kernels do), not the scores: T x Dh values, not T x S. Fast while the scores fit
    in the caches."""
    return ((q * (1.0 / math.sqrt(q.size(-1)))) @ k.transpose(-2, -1)).softmax(dim=-1) @ v


def attention_kernel(q: Tensor, k: Tensor, v: Tensor) -> str:
    """"sdpa" or "matmul" for an unmasked attention call without dropout: the faster measured on
    this machine for the shape class (the score count's and the key length's powers of two).
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
        "matmul": lambda: _matmul_attention(q, k, v)})


def why_not_measured_attention(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """Why an unmasked attention call takes SDPA on fp32 values without a measured choice of
    kernel and dtype, or None to measure."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return "training: SDPA's backward"
    if tracing() or is_in_torch_dispatch_mode():
        return "compilers and exporters take SDPA"
    if q.device.type != "cpu":
        return "choices are measured on CPU only"
    return None


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
    if dropout_p > 0.0:
        # SDPA's CPU kernels have no dropout: it falls back to its own explicit softmax, and
        # draws with torch's per-element dropout (tformer.dropout says why that is slow).
        return "attention dropout: the explicit softmax draws it with tformer.dropout"
    if _readable:
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
    if _readable:
        return "kernels.readable() runs the padded batch"
    if not values_readable(mask.padding):
        return "packing reads the mask's values: not while tracing (compile, export) or on meta"
    if not mask.has_padding:
        return "no padded position: nothing to skip"
    if not mask.packing.groups:
        return "no real token anywhere: nothing to compute"
    return None
