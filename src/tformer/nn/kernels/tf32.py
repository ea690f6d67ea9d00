"""TF32 for fp32 matrix products, where the user allows it (``tformer train --tf32``, as Hugging
Face's ``TrainingArguments(tf32=True)``) and the device has it: NVIDIA GPUs of compute capability
8.0 and later (Ampere, Hopper, Blackwell), whose tensor cores multiply fp32 inputs rounded to 10
mantissa bits, summing in fp32: about 3x fp32's speed on an A100 or H100 (Kalamkar et al. 2019
analyse the narrower formats; NVIDIA's A100 whitepaper gives the rates).

Never on behind the user's back: torch's default is IEEE fp32, and so is tformer's. Elsewhere
(a CPU, an older GPU, Apple's) the flag changes nothing, and ``why_not_tf32`` says why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from tformer.nn.devices import gpu_name


def why_not_tf32(device: torch.device) -> str | None:
    """Why fp32 products on `device` cannot run in TF32, or None when they can."""
    if device.type != "cuda":
        return (f"TF32 is an NVIDIA GPU format (compute capability 8.0 or later); on {device.type} "
                "fp32 products stay fp32")
    if torch.cuda.get_device_capability(device)[0] < 8:
        return f"this GPU ({gpu_name(device)}) has no TF32 units (compute capability 8.0 or later)"
    return None


def _flags() -> tuple:
    """The current TF32 settings of matrix products and cuDNN's convolutions."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch 2.9+: the legacy flags may not be mixed with it
        return ("new", matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    return ("legacy", matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


def _set(flags: tuple) -> None:
    kind, matmul, conv = flags
    if kind == "new":
        torch.backends.cuda.matmul.fp32_precision = matmul
        torch.backends.cudnn.conv.fp32_precision = conv
    else:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = conv


@contextlib.contextmanager
def tf32(device: torch.device, allowed: bool) -> Iterator[bool]:
    """Within the block, fp32 matrix products on `device` run in TF32 if ``allowed`` and the
    device has TF32 units; the caller's settings are restored after. Yields whether TF32 is on."""
    if not allowed or why_not_tf32(device) is not None:
        yield False
        return
    before = _flags()
    _set(("new", "tf32", "tf32") if before[0] == "new" else ("legacy", True, True))
    try:
        yield True
    finally:
        _set(before)
