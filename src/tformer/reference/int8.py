"""NumPy mirror of tformer.nn.int8: dynamic int8 inference, written to be read.

A linear layer y = x W^T + b becomes, for an orthogonal R (so x W^T = (x R)(W R)^T):
  1. rotate:   x' = x R and W' = W R, R a Hadamard block with random signs on each block of b
     input features: an outlier channel is spread over its block (module docstring of
     tformer.nn.int8 for the measurements behind each step);
  2. quantize: W' to int8 with one scale per output feature (s_W, offline), x' to integers
     with one scale per token (s_x, at run time): q = round(x' / s_x), |q| <= 2^(bits-1) - 1;
  3. multiply the integers (exact: int64 here, int32 in oneDNN) and scale back:
     y = (q_x q_W^T) s_x s_W + b.
The torch version stores q_x as uint8 with a zero point, which oneDNN's kernel wants; here the
integers keep their sign. The same weights give the same integers, and results equal to float
rounding (tests/reference/test_int8.py).

Shape legend: N tokens, K input features, M output features, b rotation block.
"""

from __future__ import annotations

import math

import numpy as np

from tformer.reference.attention import MultiHeadAttention
from tformer.reference.feedforward import FeedForward
from tformer.reference.module import Linear, Module

ROTATION_BLOCK_MAX = 128
ROTATION_COST = 8  # b <= M / 8: the rotation stays a small part of the multiply


def hadamard(b: int) -> np.ndarray:
    """The (b, b) Sylvester-Hadamard matrix scaled to be orthogonal; b a power of two."""
    h = np.ones((1, 1))
    while h.shape[0] < b:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(b)


def rotation(in_features: int, out_features: int, cost: int = ROTATION_COST, seed: int = 0,
             dtype=np.float32) -> np.ndarray:
    """R^T for R = diag(random signs) H of size (b, b), as tformer.nn.int8.rotation."""
    b = in_features & -in_features  # the largest power of two dividing in_features
    while b > 1 and (b > ROTATION_BLOCK_MAX or b * cost > out_features):
        b //= 2
    signs = np.random.default_rng(seed).integers(0, 2, b) * 2.0 - 1
    return (signs[:, None] * hadamard(b)).T.astype(dtype)


def rotate(x: np.ndarray, rotation_t: np.ndarray | None) -> np.ndarray:
    """x blockdiag(R, ..., R); None: x unchanged.  Shape: x (..., K) -> (..., K)"""
    if rotation_t is None:
        return x
    b = rotation_t.shape[0]
    return (x.reshape(-1, b) @ rotation_t.T).reshape(x.shape)  # (N * K / b, b) @ (b, b)


def quantize_per_token(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-token integers and scales.  Shape: x (N, K) -> q (N, K) int, scale (N, 1)"""
    qmax = 2 ** (bits - 1) - 1
    scale = np.maximum(np.abs(x).max(axis=1, keepdims=True), np.finfo(x.dtype).tiny) / qmax
    return np.round(x / scale).astype(np.int64), scale  # round half to even, as torch.round


class Int8Linear(Module):
    """Mirror of tformer.nn.int8.Int8Linear, built from a reference Linear."""

    def __init__(self, linear: Linear, bits: int = 8, rotated: bool = True):
        w = linear.weight.astype(np.float32)  # (M, K)
        m, k = w.shape
        self.bits = bits
        self.rotation = rotation(k, m) if rotated else None
        wr = w if self.rotation is None else rotate(  # float64, rounded once, as tformer.nn.int8
            w.astype(np.float64), self.rotation.astype(np.float64)).astype(np.float32)  # (M, K)
        self.weight_scale = (np.maximum(np.abs(wr).max(axis=1), np.finfo(np.float32).tiny)
                             / 127).astype(np.float32)  # (M,)
        self.weight_int8 = np.round(wr / self.weight_scale[:, None]).astype(np.int8)
        if hasattr(linear, "bias"):
            self.bias = linear.bias.astype(np.float32).copy()

    def forward(self, x: np.ndarray) -> np.ndarray:
        k = self.weight_int8.shape[1]
        xr = rotate(x.reshape(-1, k).astype(np.float32), self.rotation)  # (N, K)
        q, s = quantize_per_token(xr, self.bits)
        sums = q @ self.weight_int8.T.astype(np.int64)  # (N, M), exact integers
        y = sums * self.weight_scale.astype(np.float64) * s
        if hasattr(self, "bias"):
            y = y + self.bias
        return y.astype(np.float32).reshape(*x.shape[:-1], -1)  # (..., M)


KEEP_FLOAT = ("down",)  # the feed-forward network's down projection, as tformer.nn.int8
KEEP_FLOAT_7_BITS = ("qkv_proj", "q_proj", "kv_proj")  # with 7-bit activations instead


def keep_float(bits: int) -> tuple[str, ...]:
    """The linears left in float at this many activation bits, as tformer.nn.int8.keep_float."""
    return KEEP_FLOAT if bits >= 8 else KEEP_FLOAT_7_BITS


def quantize(model: Module, bits: int = 8) -> Module:
    """Replace the Linears of every attention and feed-forward block but keep_float(bits)'s, as
    tformer.nn.int8.quantize."""
    keep = keep_float(bits)

    def visit(module: Module) -> None:
        for name, child in list(vars(module).items()):
            if isinstance(module, MultiHeadAttention | FeedForward) and isinstance(child, Linear):
                if name in keep:
                    continue
                setattr(module, name, Int8Linear(child, bits, rotated=name != "out_proj"))
            elif isinstance(child, Module):
                visit(child)
            elif isinstance(child, list):
                for item in child:
                    if isinstance(item, Module):
                        visit(item)

    visit(model)
    return model
