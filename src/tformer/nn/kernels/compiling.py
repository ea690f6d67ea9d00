"""``tformer.compile_model``: torch.compile with a clear error when it cannot work here.

Its own module because torch._inductor takes about a second to import, and only compiling
needs it.
"""

from __future__ import annotations

import shutil

import torch
from torch import nn
from torch._inductor import config as inductor

from tformer.errors import BadType


def compile_model(module: nn.Module, **kwargs) -> nn.Module:
    """``torch.compile(module, **kwargs)``, with a clear error up front when the machine has no
    C++ compiler: inductor, torch.compile's CPU backend, builds C++ at run time."""
    if not isinstance(module, nn.Module):  # torch.compile's own word was a bare AssertionError
        raise BadType("module", f"expected a torch.nn.Module (e.g. an Encoder), got {type(module).__name__}")
    cxx = inductor.cpp.cxx[-1] if isinstance(inductor.cpp.cxx, tuple) else inductor.cpp.cxx
    found = [c for c in (cxx, "g++", "clang++") if c and shutil.which(c)]
    if kwargs.get("backend", "inductor") == "inductor" and not found:
        raise RuntimeError(
            "torch.compile: inductor needs a C++ compiler at run time and found none "
            f"({cxx or 'g++'} not on PATH); install one (apt-get install g++) or pass "
            "backend='eager'"
        )
    return torch.compile(module, **kwargs)
