"""Linear layers' multiplies: oneDNN's fused linear (bias and activation in the multiply) or
MKL's F.linear, chosen by measuring each shape class on this machine; frozen weights packed
once in oneDNN's layout; bf16 weights on fp32 activations; oneDNN's int8 multiply.

Shape legend: N rows (tokens), in/out the layer's widths.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import is_in_torch_dispatch_mode
from torch.utils.weak import WeakIdKeyDictionary

from tformer.nn.kernels import autotune
from tformer.nn.kernels.switch import is_readable
from tformer.nn.kernels.tracing import tracing

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
# oneDNN's int8 linear (u8 activations x s8 weights, int32 sums), for tformer.nn.int8.
_ONEDNN_INT8 = hasattr(torch.ops, "onednn") and hasattr(torch.ops.onednn, "qlinear_pointwise")

# Training through oneDNN's linear (forward and backward) or MKL's (F.linear): which is faster
# depends on the machine (oneDNN's ran 1.2x-2.2x MKL's GEMMs on one AVX-512 CPU, and made a
# BERT-base step 1.34x slower on another), so it is measured here per shape class
# (tformer.nn.kernels.autotune), never chosen from CPU flags.


# Linear ---------------------------------------------------------------------------------------
def why_not_onednn(x: Tensor, weight: Tensor) -> str | None:
    """Why a linear must run as F.linear, or None when oneDNN's fused linear applies."""
    if is_readable():
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
    elif b is not None and _compiling_inference_on_cpu(x, w, b):
        y = torch.matmul(x, w.t()) + b  # the bias fused into the next elementwise kernel
    else:
        y = F.linear(x, w, b)
    return y if activation is None else ACTIVATIONS[activation][0](y)


def _compiling_inference_on_cpu(x: Tensor, w: Tensor, b: Tensor) -> bool:
    """Whether torch.compile (not an exporter) traces a linear without autograd on a CPU. Then
    the multiply and the bias are written apart: from F.linear inductor calls addmm, which first
    copies the bias into every row of its output (a pass over it), where from x W^T + b it calls
    the GEMM alone and adds the bias inside the next elementwise kernel it generates (the
    activation, the residual add and norm, the heads' split). A compiled decoding step at
    Marian's size: 0.97x the time (Intel Xeon, 2 threads; benchmarks/README.md, a twentieth
    session). Exporters keep F.linear (one Gemm node), training keeps its measured kernels."""
    return (torch.compiler.is_compiling() and not torch.compiler.is_exporting()
            and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or b.requires_grad)))


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


# int8 linear (tformer.nn.int8) ----------------------------------------------------------------
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


