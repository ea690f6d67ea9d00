"""The GEMM roofline: what this machine's matrix multiplies reach at a layer's shapes, the bound
the inference and training rows are measured against (their "GEMM roofline" column)."""

from __future__ import annotations

import torch

from tformer.commands.benchmarking import models as M
from tformer.commands.benchmarking.harness import measure

_ROOFLINE: dict[tuple, dict[str, float]] = {}


def gemm_throughput(d: int, f: int, tokens: int, threads: int,
                    dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """GFLOP/s over one encoder layer's four matrix multiplies (qkv, out, up, down) at `tokens` rows,
    through torch.mm (MKL for float32) and through oneDNN's linear; "best" takes the faster per
    shape. A roofline is what the hardware can do, so each shape counts its fastest round."""
    key = (d, f, tokens, threads, dtype)
    if key in _ROOFLINE:
        return _ROOFLINE[key]
    shapes = [(d, 3 * d), (d, d), (d, f), (f, d)]  # (in, out)
    total = {"torch.mm": 0.0, "oneDNN linear": 0.0, "best": 0.0}
    flops = 0.0
    with torch.inference_mode():
        for d_in, d_out in shapes:
            x = torch.randn(tokens, d_in, dtype=dtype)
            w = (torch.randn(d_out, d_in) * d_in**-0.5).to(dtype)
            fns = {"torch.mm": lambda x=x, w=w: torch.mm(x, w.t())}
            if M.onednn_linear(dtype):
                fns["oneDNN linear"] = lambda x=x, w=w: M.onednn_matmul(x, w)
            timings = measure(fns, rounds=7, warmup=2)
            fastest = {name: min(t.wall) for name, t in timings.items()}
            for name, secs in fastest.items():
                total[name] += secs
            total["best"] += min(fastest.values())
            flops += 2.0 * tokens * d_in * d_out
    result = {name: flops / secs / 1e9 for name, secs in total.items() if secs}
    _ROOFLINE[key] = result
    return result
