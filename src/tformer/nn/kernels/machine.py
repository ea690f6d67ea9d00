"""What this machine is: its CPU model and the instruction sets that decide which kernels run.

Used to print with every benchmark, and to narrow a choice before measuring it: a kernel or a
precision is chosen by timing the candidates here (never by flags alone), but a candidate the
CPU cannot run natively (bf16 without avx512_bf16 or AMX) is not worth timing.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import statistics
import time

# AVX-512 fp32 GEMMs, bf16 dot products (avx512_bf16) or tiles (AMX), int8 dot products (VNNI).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16",
             "amx_int8")
NO_BF16 = "this CPU has no bf16 instructions (avx512_bf16 or amx_bf16)"


@functools.cache
def cpu_info() -> tuple[str, list[str]]:
    """(CPU model name, the ISA_FLAGS it has), from /proc/cpuinfo (Linux; else the platform)."""
    cpu, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu is None:
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return cpu or platform.processor() or platform.machine(), [f for f in ISA_FLAGS if f in flags]


def has_bf16() -> bool:
    """bf16 instructions (avx512_bf16 or AMX): without them oneDNN's bf16 kernels fail or crawl."""
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_info()[1]))


def others_running(samples: int = 9, interval: float = 0.02, spin: bool = False) -> float:
    """How many threads of other processes are running or ready to run now: the median over
    `samples` reads of /proc/stat's procs_running (every runnable thread of the machine) less
    this process's own (its spinning OpenMP workers included). 0 where /proc is missing.
    `spin`: wait between reads running, not asleep, so that another process reading at the
    same moment counts this one (two runs started together each found the cores free while
    the other slept between its reads, and each took both cores)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/stat") as f:
                total = next(int(line.split()[1]) for line in f if line.startswith("procs_running"))
            own = 0
            for tid in os.listdir("/proc/self/task"):
                with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/stat") as f:
                    own += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, StopIteration, ValueError, IndexError):
            return 0.0
        counts.append(max(total - own, 0))
        if i + 1 < samples:
            if not spin:
                time.sleep(interval)
                continue
            until = time.perf_counter() + interval
            while time.perf_counter() < until:
                pass
    return float(statistics.median(counts))


def usable_cores() -> int:
    """The cores this process may run on (its affinity; the machine's where that is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def max_threads() -> int:
    """The most threads an option may ask for: 4 per core this process may run on. More only
    wait on each other, and tens of thousands crash OpenMP's pool (a segfault, not an error)."""
    return 4 * usable_cores()


def check_threads(value: int | None, name: str = "--threads") -> None:
    """Refuse a thread count outside 1..max_threads() in one line."""
    if value is not None and not 1 <= value <= max_threads():
        raise ValueError(f"{name}: expected 1..{max_threads()} (4 per core here), got {value}")


def free_threads(cores: int, others: float) -> int:
    """One thread per core that ``others`` threads of other processes (``others_running``) leave
    free, at least one. Threads that share their cores with busy processes wait for the slowest
    at every product: with two busy processes on 2 cores, two threads made a training step 2-3x
    slower than one, and decoding 1.2-2x (Intel Xeon, benchmarks/README.md)."""
    return max(1, cores - math.ceil(others - 0.25))
