"""Where a model runs: ``--device auto|cpu|cuda|cuda:N|mps``, resolved once, checked in one line.

    device = resolve_device("auto")     # a CUDA GPU when this torch sees one, else the CPU
    model.to(device); batch.to(device)  # tformer.text.batches: to_device, pinned, to CUDA
    with autocast(device, half_dtype(device)): ...   # bf16, or fp16 on a GPU without bf16

``auto`` takes CUDA when ``torch.cuda.is_available()``, as Hugging Face's Trainer and
sentence-transformers do; under torchrun, each process the GPU of its local rank (LOCAL_RANK).
MPS is used when asked for by name. A device this machine lacks is refused in one line that
says what it has, before anything is loaded.

What differs by device is chosen elsewhere, each choice with its reason: the kernels
(tformer.nn.kernels: oneDNN and mkldnn int8 on CPU only; SDPA's fused kernels with dropout on
GPUs), dropout's draws (tformer.nn.dropout), the allocator tuning (tformer.nn.kernels.allocator),
the precision (tformer.nn.precision, tformer.training.precision) and the process group's backend
(tformer.training.distributed: NCCL on GPUs, gloo on CPU). Measured choices are remembered per
device (tformer.nn.kernels.autotune).

torch is imported on first use: TrainConfig (torch-free, for the NumPy engine) checks a
device's spelling with ``check_spec``.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HELP = ("auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda, cuda:N or mps "
        "(default: auto)")
TRAIN_HELP = ("where the run trains: " + HELP.removesuffix(" (default: auto)")
              + "; recorded in the run, whose checkpoints load on any device")
_SPEC = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_spec(spec: object, name: str = "device") -> str:
    """`spec` when it is spelled as a device (its availability is checked by resolve_device)."""
    if not isinstance(spec, str) or not _SPEC.fullmatch(spec):
        raise ValueError(f"{name}: expected auto, cpu, cuda, cuda:N or mps, got {spec!r}")
    return spec


def resolve_device(spec: str | torch.device | None = "auto", name: str = "device") -> torch.device:
    """The torch.device `spec` names, on this machine (module docstring); None is auto.
    A device this machine lacks is a ValueError naming what it has."""
    import torch

    if isinstance(spec, torch.device):
        spec = str(spec)
    spec = check_spec("auto" if spec is None else spec, name)
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"{name}: expected a device this machine has ({_available()}), got 'mps': "
                             "torch sees no Apple GPU here")
        return torch.device("mps")
    if not torch.cuda.is_available():
        if spec == "auto":
            return torch.device("cpu")
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise ValueError(f"{name}: expected a device this machine has ({_available()}), got {spec!r}: "
                         f"torch {torch.__version__} ({build}) sees no CUDA GPU")
    count = torch.cuda.device_count()
    if spec in ("auto", "cuda"):
        index = int(os.environ.get("LOCAL_RANK", 0)) if int(os.environ.get("WORLD_SIZE", 1)) > 1 else 0
    else:
        index = int(spec.removeprefix("cuda:"))
    if index >= count:
        raise ValueError(f"{name}: expected cuda:0..cuda:{count - 1} ({count} GPU(s) here), got "
                         f"{spec!r}" + (f" (LOCAL_RANK {index})" if spec in ("auto", "cuda") else ""))
    return torch.device("cuda", index)


def _available() -> str:
    import torch

    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:0..{torch.cuda.device_count() - 1}"]
    if torch.backends.mps.is_available():
        found.append("mps")
    return ", ".join(found)


def describe(device: torch.device) -> str:
    """The device and what it is: "cuda:0 (NVIDIA H100 80GB HBM3)", "cpu (AMD EPYC ...)"."""
    if device.type == "cuda":
        return f"{device} ({gpu_name(device)})"
    if device.type == "cpu":
        from tformer.nn.kernels.machine import cpu_info

        return f"cpu ({cpu_info()[0]})"
    return str(device)


def gpu_name(device: torch.device) -> str:
    """A CUDA device's model and compute capability: "NVIDIA H100 80GB HBM3, sm_90"."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)}, sm_{major}{minor}"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (GPU calls return before they finish: time after this)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def half_dtype(device: torch.device) -> torch.dtype:
    """The 16-bit type autocast computes in on `device`: bfloat16 (fp32's range, so no loss
    scaling), or float16 on a CUDA GPU without bf16 units (before Ampere: V100, T4), which
    needs a GradScaler in training (``needs_grad_scaler``)."""
    import torch

    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def half_name(device: torch.device) -> str:
    """``half_dtype``'s name, as a run records its precision: "bf16" or "fp16"."""
    import torch

    return "bf16" if half_dtype(device) == torch.bfloat16 else "fp16"


def needs_grad_scaler(device: torch.device, half: bool) -> bool:
    """fp16 gradients underflow without loss scaling (Micikevicius et al. 2018, §3.2); bf16's don't."""
    import torch

    return half and half_dtype(device) == torch.float16


def model_device(model) -> torch.device:
    """The device of a model's first parameter (or buffer); the CPU for a model without either."""
    import torch

    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")
