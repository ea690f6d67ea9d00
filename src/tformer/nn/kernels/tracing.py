"""Whether a compiler, exporter or trace is recording us, and so whether Python may read values.

A leaf: kernels.py (which kernel runs), masks.py (facts a mask derives from its values) and
model.py (input checks) all ask it, and it asks nothing of them.
"""

from __future__ import annotations

import torch
from torch import Tensor


def tracing() -> bool:
    """Whether torch.compile, torch.export, an ONNX exporter or an FX trace is recording us."""
    return (torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.jit.is_scripting()
            or torch.fx._symbolic_trace.is_fx_symbolic_tracing())


def values_readable(t: Tensor) -> bool:
    """Whether Python may read t's values: not while tracing (they are symbolic), not on meta."""
    return t.device.type != "meta" and not tracing()
