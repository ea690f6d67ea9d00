"""Which ONNX opsets an export can be written at and checked in, from what is installed.

    check_opset(opset)      refused in one line, before anything is traced, naming the range
    supported_opsets()      e.g. (18, 19, 20, 21, 22, 25) with torch 2.13, onnxscript 0.7,
                            onnxruntime 1.32

torch.onnx's exporter writes its own opset (18) and converts to others with onnxscript's
version converter, which reaches a range of them (older ones: it writes 18 anyway); onnx and
onnxruntime each know opsets up to their newest. Within that, onnxruntime may refuse an
operator as the exporter writes it: from opset 23 attention is ONNX's Attention operator, whose
padding mask (B, 1, 1, S) onnxruntime 1.32 refuses at 23 and 24. That is probed (a one-node
graph in onnxruntime, milliseconds), not written down, so another onnxruntime gets its own answer.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from tformer.errors import require

EXTRA = "onnx"
DEFAULT_OPSET = 18  # what torch.onnx's exporter writes natively


def check_opset(opset: int, name: str = "opset") -> None:
    """Refuse, before anything is traced, an opset the installed exporter cannot write or
    onnxruntime cannot run (``supported_opsets``): 23 went through torch.onnx and then failed
    inside onnxruntime, 1..17 were traced and then found written at 18."""
    supported = supported_opsets()
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in supported:
        ort = require("onnxruntime", EXTRA, "checking an ONNX export")
        raise ValueError(f"{name}: expected an ONNX opset in {_ranges(supported)} (what the installed "
                         f"torch.onnx writes and onnxruntime {ort.__version__} runs; default "
                         f"{DEFAULT_OPSET}), got {opset!r}")


@functools.cache
def supported_opsets() -> tuple[int, ...]:
    """The opsets an export is written at and checked in, from what is installed: from torch.onnx's
    own (older ones its converter cannot reach: it writes its own instead) up to the newest that
    onnxscript's converter, onnx and onnxruntime all know; less those where onnxruntime cannot run
    ONNX's Attention as torch.onnx writes it for attention (``_runs_attention``)."""
    onnx = require("onnx", EXTRA, "ONNX export")
    ort = require("onnxruntime", EXTRA, "checking an ONNX export")
    low, high = DEFAULT_OPSET, onnx.defs.onnx_opset_version()
    try:  # private modules: without them, the ends above
        from onnxscript.version_converter import _version_converter as converter
        from torch.onnx._internal.exporter import _constants

        low = max(_constants.TORCHLIB_OPSET, converter.SUPPORTED_MIN_ONNX_OPSET)
        high = min(high, converter.SUPPORTED_MAX_ONNX_OPSET)
    except (ImportError, AttributeError):
        pass
    kernels = ort.capi._pybind_state.get_all_opkernel_def()  # a newer opset than any kernel: not run
    high = min(high, max(k.version_range[0] for k in kernels if k.domain in ("", "ai.onnx")))
    return tuple(o for o in range(low, high + 1) if _runs_attention(o))


def _runs_attention(opset: int) -> bool:
    """Whether onnxruntime runs ONNX's Attention at ``opset`` (none before 23: True) with a
    padding mask (B, 1, 1, S) broadcast over the queries, as torch.onnx writes a masked attention.
    onnxruntime 1.32 refuses it at 23 and 24 ("inconsistent q_sequence_length"), not at 25."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    try:
        onnx.defs.get_schema("Attention", opset, "")
    except onnx.defs.SchemaError:
        return True
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 2, 4]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, 1, 2]))
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 4])
    graph = helper.make_graph([helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"])], "probe",
                              inputs, [output])
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    options = ort.SessionOptions()
    options.log_severity_level = 4  # its refusal is this function's answer, not a line on stderr
    x = np.ones((1, 1, 2, 4), np.float32)
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session.run(None, {"q": x, "k": x, "v": x, "mask": np.ones((1, 1, 1, 2), bool)})
    except Exception:  # onnxruntime's own errors (Fail, NotImplemented, InvalidGraph...)
        return False
    return True


def _ranges(values: Sequence[int]) -> str:
    """(18, 19, 20, 25) -> "18..20 or 25"."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    parts = [f"{r[0]}..{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
    return ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else (parts[0] if parts else "none")
