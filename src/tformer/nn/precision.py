"""Inference precisions: fp32, bf16 matrix multiplies, or int8 ones (tformer.nn.int8, CPU only).

"auto" is decided on the device the model runs on: a bf16 matrix product is timed there
(once per device, remembered by tformer.nn.kernels.autotune) on a CPU with bf16 instructions or a
GPU with bf16 units.
"""

from __future__ import annotations

import functools
import time

import torch
from torch import nn

from tformer.nn import int8
from tformer.nn.attention import MultiHeadAttention
from tformer.nn.devices import gpu_name, model_device, synchronize
from tformer.nn.feedforward import FeedForward
from tformer.nn.kernels import autotune
from tformer.nn.kernels.machine import NO_BF16, has_bf16

PRECISIONS = ("fp32", "bf16", "int8")
CHOICES = ("auto", *PRECISIONS)  # what --dtype accepts; auto is resolved by resolve_precision
MIN_SPEEDUP = 1.2  # auto picks bf16 only if a bf16 matrix product is at least this much faster
_CPU = torch.device("cpu")


def resolve_precision(precision: str, device: torch.device = _CPU) -> tuple[str, str]:
    """(the precision to run on `device`, why): "auto" is the fastest whose accuracy bound holds
    there: bf16 (min cosine >= 0.9999 to fp32) where the device computes bf16 natively and a
    bf16 matrix product is measured at least MIN_SPEEDUP faster on it, else fp32. int8 is never
    automatic: its accuracy (min cosine 0.998-0.999 on real sentence encoders) misses the 0.999
    bound; and it is oneDNN's CPU kernel, so on another device it is refused."""
    if precision not in CHOICES:
        raise ValueError(f"dtype: expected one of {', '.join(CHOICES)}, got {precision!r}")
    if precision == "int8" and device.type != "cpu":
        raise ValueError(f"dtype: int8 runs oneDNN's CPU kernels; on {device} expected auto, fp32 or "
                         "bf16, got 'int8'")
    if precision != "auto":
        return precision, "asked for"
    why_not = why_not_bf16(device)
    if why_not is not None:
        return "fp32", why_not
    speedup = bf16_speedup(device=device)
    if speedup < MIN_SPEEDUP:
        return "fp32", f"bf16 matrix products measured only {speedup:.2f}x fp32's here"
    return "bf16", f"native bf16, matrix products measured {speedup:.2f}x fp32's here"


def why_not_bf16(device: torch.device) -> str | None:
    """Why bf16 is not worth timing on `device` (no native bf16), or None to time it."""
    if device.type == "cpu":
        return None if has_bf16() else NO_BF16
    if device.type == "cuda":
        return None if torch.cuda.is_bf16_supported() else f"this GPU ({gpu_name(device)}) has no bf16 units"
    return f"bf16 on {device.type} is not measured here"


@functools.cache
def bf16_speedup(n: int = 512, repeats: int = 5, device: torch.device = _CPU) -> float:
    """fp32 time / bf16-autocast time of an n x n x n matrix product on `device` (best of),
    measured once per device and remembered with the kernel choices (tformer.nn.kernels.autotune),
    so that every process on this machine resolves "auto" alike."""
    def decide_now() -> dict:
        g = torch.Generator().manual_seed(0)  # never the global generator
        a, b = torch.randn(n, n, generator=g).to(device), torch.randn(n, n, generator=g).to(device)

        def best(autocast: bool) -> float:
            times = []
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                for _ in range(repeats + 1):  # the first call builds the kernel
                    synchronize(device)
                    t = time.perf_counter()
                    a @ b
                    synchronize(device)
                    times.append(time.perf_counter() - t)
            return min(times[1:])

        fp32, bf16 = best(False), best(True)
        return autotune.decision("bf16" if fp32 >= MIN_SPEEDUP * bf16 else "fp32",
                                 {"fp32": fp32, "bf16": bf16})

    seconds = autotune.recall("bf16-product", f"{n}^3", decide_now, {"fp32", "bf16"}, device,
                              rate=True)["seconds"]
    return seconds["fp32"] / max(seconds["bf16"], 1e-9)


def to_precision(model: nn.Module, precision: str) -> nn.Module:
    """Set a model's inference precision, in place ("auto": see ``resolve_precision``).

    ``fp32``: every parameter float32. ``bf16``: the matrix multiplies of attention and the
    feed-forward network take bf16 weights and inputs; their results, the residual stream,
    the norms, the softmax and pooling stay float32 (min cosine to fp32 sentence embeddings
    0.99996 on all-MiniLM-L6-v2, where casting the whole model to bf16 gives 0.9964). It is
    faster only on CPUs with bf16 instructions (avx512_bf16, AMX); elsewhere slower.
    ``int8``: those multiplies but the feed-forward network's down projection take int8
    weights and per-token int8 activations, after a rotation that spreads outliers
    (``tformer.nn.int8``); the down projection runs in bf16 where the CPU has bf16 units, else
    fp32 (min cosine 0.9990-0.9996 on all-MiniLM-L6-v2 over four text sets). It is one-way:
    the int8 layers keep no float weights.
    """
    precision, _ = resolve_precision(precision, model_device(model))
    if any(isinstance(m, int8.Int8Linear) for m in model.modules()):
        raise ValueError(f"dtype: this model is already int8 and keeps no float weights; "
                         f"load it again for {precision!r}")
    model.float()
    if precision == "int8":
        int8.quantize(model)
        if not has_bf16():
            return model
        # the linears int8 leaves in float (int8.keep_float): bf16, where the CPU has bf16 units
    if precision in ("bf16", "int8"):
        for block in model.modules():
            if isinstance(block, MultiHeadAttention | FeedForward):
                for linear in block.children():
                    if isinstance(linear, nn.Linear):
                        linear.to(torch.bfloat16)  # run by kernels.linear
    return model
