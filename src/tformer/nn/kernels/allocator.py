"""Freed memory kept for reuse: glibc's malloc asked not to hand large freed blocks back to the OS.

Why. Every training step (and every batch of an inference run) frees and then allocates again the
same large tensors: activations, their gradients, attention scores. CPU PyTorch has no caching
allocator, so each of them is a malloc. By default glibc serves blocks past an adaptive threshold
with fresh mappings and trims the top of its heap as soon as it is mostly free, so the next step
gets its memory from the kernel again, page by page, zero-filled. Measured (AMD EPYC Zen 4,
2 threads, d 256, 4 layers, 32 x 64 tokens, a training step): ~24,000 page faults (~92 MB) and
311 ms per step by default; 400 faults and 275 ms with the settings below. A step whose tensors
pass 32 MiB (BERT-base width, 32 x 128) still maps those afresh and ran the same either way.

The settings: blocks up to 32 MiB (glibc's largest allowed threshold) come from the heap, and the
heap is trimmed only when more than 1 GiB at its top is free. The cost: a process keeps up to its
peak heap (plus 1 GiB free) until it exits, as a caching allocator does.

Applied by the command line for every command, by ``tformer.train`` and by ``tformer.load_run``
(a run's predict, generate, embed from Python: a beam search on a CPU, 64 sources x 4 beams, took
0.85-0.95x the time with it, greedy 0.95-0.97x), when the model runs on the CPU: on a GPU the
tensors come from torch's own caching allocator, and the host's heap would only be kept large for
nothing. A model built or loaded otherwise (``Seq2SeqTransformer``, ``from_pretrained``) runs as
the process's malloc is set: ``keep_freed_memory()`` applies it. A user who has set glibc's own
knobs (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES``) keeps them, and
``TFORMER_KEEP_FREED_MEMORY=0`` turns this off.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

MMAP_THRESHOLD = 32 << 20  # glibc's maximum (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
_USERS_OWN = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def why_not_keep(device_type: str = "cpu") -> str | None:
    """Why freed memory is handed back as glibc decides, or None to keep it. `device_type`:
    where the model runs ("cpu", "cuda", "mps")."""
    if device_type != "cpu":
        return f"the model runs on {device_type}: its tensors come from torch's caching allocator"
    if os.environ.get("TFORMER_KEEP_FREED_MEMORY", "1") == "0":
        return "TFORMER_KEEP_FREED_MEMORY=0"
    own = [name for name in _USERS_OWN if name in os.environ]
    if own:
        return f"{own[0]} is set: the user's malloc settings stay"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "not glibc's malloc"
    return None


@functools.cache
def keep_freed_memory(device_type: str = "cpu") -> str:
    """Apply the settings above once per process; returns what was done, for ``tformer info``."""
    reason = why_not_keep(device_type)
    if reason is not None:
        return f"malloc as glibc decides ({reason})"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "malloc as glibc decides (no mallopt)"
    if not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "malloc as glibc decides (mallopt refused)"
    return f"freed blocks up to {MMAP_THRESHOLD >> 20} MiB kept for reuse (heap trimmed past " \
           f"{TRIM_THRESHOLD >> 30} GiB free)"
