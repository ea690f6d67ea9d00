"""Where a tformer call's time goes: one call under torch.profiler, its operators' time summed
into the parts the benchmark's notes name, as shares of the call's wall time.

An operator's time is its span on the calling thread, which waits while the intra-op threads
run it; its children (a matmul's bmm) count in their own part, not twice. What no part names
(Python, tokenizing, allocation, the small operators) is "the rest". A missed target then says
in the table, on any CPU, what bounds it (issue 55): the linears' matrix products at their GEMM
rate, attention's kernel, or the passes between them.

    parts = time_parts(lambda: encoder.encode(texts))   # {"linears": 0.41, ..., "the rest": 0.12}
    describe(parts)                                       # "linears 41%, attention 29%, ..."
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Parts, in the order the note lists them: operator names (aten's, oneDNN's) -> part.
PARTS: dict[str, tuple[str, ...]] = {
    "linears": ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "aten::linear",
                "onednn::qlinear_pointwise", "aten::_addmm_activation"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                  "aten::_scaled_dot_product_attention_math", "aten::bmm", "aten::baddbmm",
                  "aten::_softmax", "aten::_safe_softmax"),
    "norms/adds/activations": ("aten::native_layer_norm", "aten::add", "aten::add_", "aten::gelu",
                               "aten::gelu_", "aten::relu", "aten::relu_", "aten::mul", "aten::div"),
    "log-softmax/top-k/max": ("aten::_log_softmax", "aten::topk", "aten::amax", "aten::max",
                              "aten::sort"),
    "copies/casts": ("aten::copy_", "aten::_to_copy", "aten::index_select", "aten::index",
                     "aten::cat", "aten::_index_put_impl_", "aten::fill_", "aten::zero_"),
}
_PART_OF = {op: part for part, ops in PARTS.items() for op in ops}
REST = "the rest"


def time_parts(call: Callable[[], object]) -> dict[str, float]:
    """Seconds of one ``call`` per part (PARTS, then REST: the wall time no part took). The
    rest is taken from a call timed without the profiler: recording each operator costs a few
    microseconds, which would count as the rest's (a tenth of a bf16 sentence-encoding run)."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    call()
    wall = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    seconds = dict.fromkeys(PARTS, 0.0)
    for event in prof.key_averages():
        part = _PART_OF.get(event.key)
        if part is not None:
            seconds[part] += event.self_cpu_time_total / 1e6  # microseconds, this thread's span
    seconds[REST] = max(wall - sum(seconds.values()), 0.0)
    return seconds


def describe(seconds: dict[str, float]) -> str:
    """"linears 41%, attention 29%, ..., the rest 12%": each part's share of the total (a part
    under 0.5% left out: an encoder computes no log-softmax)."""
    total = sum(seconds.values())
    if total <= 0:
        return ""
    return ", ".join(f"{part} {100 * s / total:.0f}%" for part, s in seconds.items()
                     if part == REST or s >= 0.005 * total)
