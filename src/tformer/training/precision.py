"""The training precision: fp32, or bf16 autocast with fp32 master weights.

--precision auto (the default) trains in bf16 where the device computes it natively and it is
measured faster there (on a CPU a generic product first; then, on any device, the run's own
first updates, alternating: tformer.training.first_steps), else fp32; the run prints what it
chose and why. bf16
autocast runs the matrix products in bfloat16 and keeps the weights, the optimizer, the norms
and the loss in fp32 (1.9-2.5x faster steps on an AVX-512 bf16 / AMX CPU; on an AVX2-only CPU
oneDNN has no bf16 kernels worth running). A CUDA GPU without bf16 units (before Ampere) takes
fp16 autocast with a GradScaler instead (``tformer.nn.devices.half_dtype``), chosen the same way;
the run records "fp16".
"""

from __future__ import annotations

import functools

import torch

from tformer.config import TransformerConfig
from tformer.config.sizes import layers_text
from tformer.errors import FieldError
from tformer.nn.devices import gpu_name, half_name
from tformer.nn.kernels.machine import NO_BF16, has_bf16
from tformer.nn.model import Encoder
from tformer.nn.precision import MIN_SPEEDUP, bf16_speedup

# bf16 autocast must make a training step of the run's own model at least this much faster to be
# kept: a small model's products gain less than its casts cost (the built-in reverse task's
# model trained 1.2x slower under bf16 on an AMD EPYC Zen 4 whose 512^3 product ran 1.95x faster).
MIN_STEP_SPEEDUP = 1.1
_CPU = torch.device("cpu")


def choose_precision(requested: str, device: torch.device = _CPU) -> tuple[str, str]:
    """("fp32", "bf16" or "fp16", why) for a run on `device` asking for `requested`."""
    if requested == "fp32":
        return "fp32", "asked for"
    if device.type == "cuda":
        half = half_name(device)
        if requested == "bf16" and half != "bf16":
            raise FieldError("precision", f"this GPU ({gpu_name(device)}) has no bf16 units; expected "
                             "auto (fp16 autocast with a GradScaler) or fp32, got bf16")
        why = "asked for" if requested == "bf16" else (
            f"{half} autocast on {gpu_name(device)} (a step of this model is timed before it is kept)")
        return half, why
    if device.type != "cpu":
        if requested == "bf16":
            raise FieldError("precision", f"bf16 autocast is not supported on {device.type} here; "
                             "expected auto or fp32, got bf16")
        return "fp32", f"mixed precision on {device.type} is not measured here"
    if requested == "bf16":
        if not bf16_supported():
            raise FieldError("precision", "this CPU cannot run bfloat16 matrix products under autocast "
                             "(oneDNN found no kernel); expected --precision fp32 or auto, got bf16")
        return "bf16", "asked for"
    if not has_bf16():
        return "fp32", NO_BF16
    speedup = bf16_speedup(device=device)
    if speedup < MIN_SPEEDUP or not bf16_supported():
        return "fp32", f"bf16 matrix products run only {speedup:.2f}x faster than fp32's here"
    return "bf16", f"native bf16: matrix products run {speedup:.1f}x faster than fp32's here"


@functools.cache
def bf16_supported() -> bool:
    """Whether a tiny encoder trains under bfloat16 CPU autocast here (oneDNN has no bfloat16
    kernels for some CPUs, e.g. AVX2-only ones)."""
    try:
        encoder = Encoder(TransformerConfig(d_model=8, n_heads=2, d_ff=16, n_layers=1, vocab_size=10))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = encoder(torch.ones(2, 3, dtype=torch.long)).last_hidden_state
        h.float().sum().backward()
    except RuntimeError:
        return False
    return True


def precision_why(decision: dict, half: str = "bf16") -> str:
    """What a remembered precision decision says: which is faster, and by how much."""
    seconds = decision["seconds"]
    ratio = seconds.get(half, 1.0) / max(seconds.get("fp32", 1.0), 1e-9)  # 16-bit's time / fp32's
    if decision["choice"] == half:
        return (f"native {half}: a training step of this model takes {ratio:.2f}x fp32's time here "
                f"({1 / ratio:.1f}x faster)")
    if ratio >= 1:
        return (f"{half} autocast makes a training step of this model {ratio:.1f}x slower here "
                "(its matrix products are too small to gain what the casts cost)")
    return (f"{half} autocast makes a training step of this model only {1 / ratio:.2f}x faster here "
            f"(less than the {MIN_STEP_SPEEDUP}x worth training in {half})")


def step_class(kind: str, model: TransformerConfig, batch: str) -> str:
    """What a training step's precision choice is remembered by: the model's shape and the batch."""
    return (f"{kind} d{model.d_model} h{model.n_heads} ff{model.d_ff} L{layers_text(model, kind)} "
            f"vocab {model.vocab_size} batch {batch}")
