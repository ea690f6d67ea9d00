"""Model FLOPs utilisation on a GPU: a training step's matrix-product FLOPs (forward, input and
weight gradients: 3x the forward's, attention's products included; tformer.config.sizes) over its time,
as a share of the chip's dense bf16 tensor-core peak (Chowdhery et al. 2022, PaLM, appendix B
define MFU so).

The peak is the vendor's datasheet figure for the chips named below (dense, without sparsity);
another chip gets the throughput of a large bf16 matrix product measured on it, which is below
its datasheet figure (an MFU against it reads high), and the row says so.
"""

from __future__ import annotations

import time

import torch

# Dense bf16 tensor-core TFLOP/s from NVIDIA's datasheets, matched against torch's device name
# (the first key contained in it; more specific names first).
PEAK_BF16_TFLOPS = {
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.4,  # SXM
    "H200": 989.4,
    "GH200": 989.4,
    "B200": 2250.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.1,
    "L4": 121.0,
    "A10": 125.0,
}


def peak_bf16(device: torch.device) -> tuple[float, str]:
    """(the chip's dense bf16 peak in FLOP/s, where the figure comes from)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in name:
            return tflops * 1e12, f"{name}'s datasheet peak, {tflops:,.0f} TFLOP/s dense bf16"
    measured = measured_bf16(device)
    return measured, (f"{name} is not in tformer's table: against a measured 8192^3 bf16 product, "
                      f"{measured / 1e12:,.0f} TFLOP/s (below the datasheet's: MFU reads high)")


def measured_bf16(device: torch.device, n: int = 8192, repeats: int = 5) -> float:
    """The FLOP/s of an n x n x n bf16 matrix product on `device` (the fastest of `repeats`)."""
    from tformer.nn.devices import synchronize

    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device, torch.bfloat16)
    b = torch.randn(n, n, generator=g).to(device, torch.bfloat16)
    a @ b  # the kernel's first call chooses and loads it
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        t = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best


def mfu(step_flops: float, seconds: float, peak: float) -> float:
    """The share of `peak` FLOP/s a step of `step_flops` FLOPs in `seconds` achieved."""
    return step_flops / seconds / peak
