"""Dynamic int8 inference: int8 weights per output channel, activations quantized per token
at run time, after a randomized Hadamard rotation that spreads outlier channels.

Each choice, measured on all-MiniLM-L6-v2: the smallest cosine between int8 and fp32 sentence
embeddings over 259 sentences of the GPL and Apache licences / 480 texts of 1..200 words from
the standard library's docstrings (`benchmarks/precision_accuracy.py`). ONNX Runtime's
per-channel int8 reaches 0.96 on such texts.
- One activation scale per tensor: 0.944 (licences). One per token: 0.994. A few channels of
  the LayerNorm and GELU outputs run 10-25x the typical magnitude, and a token's 8 bits go to them.
- Rotating first: for an orthogonal R, x W^T = (x R)(W R)^T, so the multiply can read the
  rotated activations and weights. A Hadamard block with random signs spreads each outlier over
  the block, and a token's values become alike in size (Ashkboos et al. 2024, "QuaRot"; Tseng
  et al. 2024, "QuIP#"): 0.9993 / 0.9984 with 8-bit activations (0.9994 / 0.9988 with another
  draw of the signs: the smallest cosine moves by a few 1e-4 with it). What is left is the rounding of
  both the activations and the weights, about equal shares; one-word texts come out worst (no
  other tokens to average the error out in the pooled mean).
- The attention's output projection is not rotated: its input, a weighted average of values,
  has no outlier channels (rotating it changed nothing measurable and cost 10% of the speed).
- The feed-forward network's down projection stays in float (KEEP_FLOAT; bf16 where the CPU
  has bf16 units): quantized alone it takes the min cosine to 0.99945, and with it every
  linear quantized reaches 0.99851 on 480 docstrings; without it, 0.99913 (fp32 down) /
  0.99893-0.99896 (bf16 down); on 600 English UI messages 0.99904, 300 man pages 0.99962,
  600 Debian package summaries 0.99952 (real all-MiniLM-L6-v2, AMD EPYC Zen 4). Tried and not kept, for
  gaining under 2e-4: a full-width random rotation (0.99845), asymmetric per-token
  activations, bias correction from the LayerNorm's shift, weight clipping (worse: 0.993).
  What remains is rounding noise of weights (about 3/5) and activations (2/5) that a text of
  one or two words cannot average out over its tokens.
- The multiply is oneDNN's, u8 activations x s8 weights summed in int32. CPUs without VNNI
  instructions (AVX2 only) add each pair of u8 x s8 products in int16, with saturation
  (vpmaddubsw); there the activations get 7 bits (|q| <= 63), which keeps every sum exact, and
  the query/key/value projection stays fp32 instead of the down projection (``keep_float``):
  at 7 bits no layout reaches 0.999 on all-MiniLM-L6-v2 (all quantized 0.99610, q/k/v in float
  0.99739, down 0.99775, both 0.99854; 480 docstrings), so these CPUs keep the layout their speed
  table was measured with. ``exact_bits()`` probes the kernel once and says which applies.

Shape legend: N tokens, K input features, M output features, b rotation block.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer.nn import kernels
from tformer.nn.attention import MultiHeadAttention
from tformer.nn.feedforward import FeedForward

ROTATION_BLOCK_MAX = 128  # Hadamard block: a larger block spreads an outlier further ...
ROTATION_COST = 8  # ... and costs b/M of the multiply's flops, in fp32: keep b <= M / 8
# (b <= M / 4 gained 0.0001 in cosine and lost 5% of the speed on MiniLM)


def hadamard(b: int) -> Tensor:
    """The (b, b) Sylvester-Hadamard matrix scaled to be orthogonal; b a power of two."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.size(0) < b:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(b)


def rotation(in_features: int, out_features: int, cost: int = ROTATION_COST, seed: int = 0,
             dtype: torch.dtype = torch.float32) -> Tensor:
    """R^T for a (b, b) orthogonal R = diag(random signs) H, applied to each block of b input
    features (in F.linear's layout: x R = F.linear(x, R^T)). b is the largest power of two
    dividing in_features, at most ROTATION_BLOCK_MAX and out_features / cost (so the rotation
    stays a small part of the multiply)."""
    b = in_features & -in_features  # the largest power of two dividing in_features
    while b > 1 and (b > ROTATION_BLOCK_MAX or b * cost > out_features):
        b //= 2
    # NumPy's generator: the NumPy mirror (tformer.reference.int8) draws the same signs
    signs = torch.from_numpy(np.random.default_rng(seed).integers(0, 2, b) * 2.0 - 1)
    return (signs[:, None] * hadamard(b)).t().contiguous().to(dtype)


def rotate(x: Tensor, rotation_t: Tensor | None) -> Tensor:
    """x with each block of b features multiplied by R: x blockdiag(R, ..., R); None: x.

    Shape: x (..., K), rotation_t (b, b) -> (..., K)
    """
    if rotation_t is None:
        return x
    xb = x.reshape(-1, rotation_t.size(0))  # (N * K / b, b)
    return kernels.linear_weights(xb, rotation_t).view(x.shape)


@functools.cache
def exact_bits() -> int:
    """Activation bits whose int8 sums are exact in oneDNN's kernel on this CPU: 8 with VNNI,
    7 where pairs of products are added in int16 with saturation (probed, not guessed)."""
    n, k = 64, 256  # a matrix product, not a vector one: the kernel the layers will run
    packed = kernels.int8_prepack(torch.full((n, k), 127, dtype=torch.int8))
    if packed is None:
        return 8  # the plain kernel sums the integers in float: no saturation
    y = kernels.int8_linear(torch.full((n, k), 255, dtype=torch.uint8), 0, packed, torch.ones(n))
    return 8 if bool((y == k * 255 * 127).all()) else 7


def quantize_per_token(x: Tensor, bits: int) -> tuple[Tensor, Tensor, int]:
    """Symmetric per-token quantization, stored as uint8 with a zero point.

    Shape: x (N, K) float32 -> q (N, K) uint8, scale (N, 1) float32, zero;
    x ~= (q - zero) * scale
    """
    qmax = 2 ** (bits - 1) - 1
    amax = torch.maximum(x.amax(dim=1, keepdim=True), -x.amin(dim=1, keepdim=True))  # (N, 1)
    scale = amax.clamp_(min=torch.finfo(x.dtype).tiny) / qmax
    # Converting float to int8 is many times faster than to uint8 here, so q is made signed
    # and then given its zero point in 8-bit integer arithmetic.
    q = (x / scale).round_().to(torch.int8)  # (N, K) in [-qmax, qmax]
    if bits == 8:
        return q.view(torch.uint8).bitwise_xor_(128), scale, 128  # q + 128, in 0..255
    return q.add_(qmax + 1).view(torch.uint8), scale, qmax + 1  # in 1..2^bits - 1


class Int8Linear(nn.Module):
    """A linear layer with rotated int8 weights (one scale per output feature), for inference.

    y = (q_x - zero) s_x (q_W s_W)^T + bias, where q_x, s_x quantize x R per token and q_W, s_W
    quantize W R per output feature (R: ``rotation``).

    Shape: x (..., K) float32 -> (..., M) float32
    """

    def __init__(self, linear: nn.Linear, bits: int | None = None, rotated: bool = True):
        super().__init__()
        w = linear.weight.detach().float()  # (M, K)
        self.in_features, self.out_features = w.size(1), w.size(0)
        self.bits = bits or exact_bits()
        r = rotation(self.in_features, self.out_features) if rotated else None
        self.register_buffer("rotation", r)
        # In float64, then rounded once: the same float32 weights whichever GEMM this machine
        # picks (tformer.nn.kernels.autotune), and the NumPy mirror's, bit for bit.
        wr = w if r is None else rotate(w.double(), r.double()).float()  # (M, K)
        scale = wr.abs().amax(dim=1).clamp(min=torch.finfo(w.dtype).tiny) / 127  # (M,)
        self.register_buffer("weight_int8", torch.round(wr / scale[:, None]).to(torch.int8))
        self.register_buffer("weight_scale", scale)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)
        # oneDNN's packed layout of the weights: derived once here, never learned or saved
        self._packed = kernels.int8_prepack(self.weight_int8)

    def forward(self, x: Tensor, activation: str | None = None) -> Tensor:
        x2 = rotate(x.reshape(-1, self.in_features).float(), self.rotation)  # (N, K)
        q, s, zero = quantize_per_token(x2, self.bits)  # (N, K) uint8, (N, 1)
        if kernels.why_not_onednn_int8(x2, self._packed) is None:
            y = kernels.int8_linear(q, zero, self._packed, self.weight_scale)  # (N, M), int32 sums
        else:  # the same integers, summed in float32
            y = F.linear(q.float() - zero, self.weight_int8.float()) * self.weight_scale
        # In place, on the multiply's own output: no second (N, M) buffer (one past 32 MiB is
        # faulted in afresh, page by page: tformer.nn.kernels.allocator; all-MiniLM-L6-v2 int8, 480 texts in
        # batches of 128: 129-165 -> 182-194 sentences/s; of 32: 196-216 -> 211-218; AMD EPYC Zen 4)
        y = y.mul_(s) if self.bias is None else y.mul_(s).add_(self.bias)  # (N, M)
        if activation is not None:
            y = kernels.ACTIVATIONS_IN_PLACE[activation](y)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"activation_bits={self.bits}, "
                f"rotation_block={1 if self.rotation is None else self.rotation.size(0)}")


# Left in float: the feed-forward network's down projection. Its input, the activation's
# output, costs the most accuracy: quantized, it alone takes the min cosine of all-MiniLM-L6-v2
# to 0.99945, and every linear quantized to 0.99851; all but it, 0.99913 (630 texts, module
# docstring). ``tformer.nn.precision`` runs it in bf16 where the CPU has bf16 units.
KEEP_FLOAT = ("down",)
KEEP_FLOAT_7_BITS = ("qkv_proj", "q_proj", "kv_proj")  # the attention's input projections


def keep_float(bits: int) -> tuple[str, ...]:
    """The linears left in float at this many activation bits: KEEP_FLOAT with 8 bits; with 7
    (CPUs without VNNI), where no layout reaches 0.999, the query/key/value projections, which
    leave the most multiplies in int8 of the layouts that cost little accuracy (module docstring)."""
    return KEEP_FLOAT if bits >= 8 else KEEP_FLOAT_7_BITS


def quantize(model: nn.Module, bits: int | None = None) -> nn.Module:
    """Replace the linears of every attention and feed-forward block by Int8Linear, in place,
    but those ``keep_float(bits)`` names. The attention's output projection is not rotated
    (module docstring).
    """
    bits = bits or exact_bits()
    keep = keep_float(bits)
    for block in [m for m in model.modules() if isinstance(m, MultiHeadAttention | FeedForward)]:
        for name, child in list(block.named_children()):
            if isinstance(child, nn.Linear) and name not in keep:
                setattr(block, name, Int8Linear(child, bits, rotated=name != "out_proj"))
    return model
