"""Kernel choices made by measuring on this machine, remembered per machine.

    kernel = choose("linear-train", "768x3072/2048", {"onednn": run_a, "mkl": run_b})

Which kernel is faster depends on the CPU (oneDNN's linear backward beat MKL's 1.2x on one
AVX-512 machine and lost 1.34x on another), so a choice that depends on the machine is never
made from CPU flags: the candidates are timed on the shapes at hand, once (a few milliseconds
to a second), and the decision is kept

- per process, in memory, and
- per machine, in ``$XDG_CACHE_HOME/tformer/kernels.json`` (``~/.cache`` by default; the
  TFORMER_CACHE_DIR environment variable moves it), keyed by the device (the CPU model and
  thread count; a GPU's model and compute capability), torch version and the shape class: a
  choice measured on one device is never applied on another. The file is safe to delete
  (choices are measured again), a corrupt file is ignored and rewritten, and concurrent
  processes update it under a file lock, each writing the whole file atomically
  (tformer.storage.files).

``recall`` keeps other decisions measured on this machine the same way: the bf16 product
check of ``--dtype/--precision auto`` and a training run's bf16-or-fp32 step timing; a rate (a
number used as the machine's speed) only where it was measured with the cores free (``quiet``).

Timing: each candidate runs once to warm up (on a GPU, each call is timed to its end:
``tformer.nn.devices.synchronize``), then ``ROUNDS`` times interleaved with the others; the fastest
round of each decides (other work on the machine only adds time: medians taken while other work
ran put 10x between kernels that run alike), and rounds whose median is SPREAD above their
fastest are measured again once. A candidate must beat the first listed (the default) by more than NOISE
to be chosen, so noise never flips a choice away from the default.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tformer.nn.devices import gpu_name, synchronize
from tformer.nn.kernels.machine import cpu_info, others_running, usable_cores
from tformer.storage.files import uncounted, write_json_atomic

ROUNDS = 5
NOISE = 0.05  # a candidate must be this much faster than the default to replace it
SPREAD = 1.5  # a median this much above the fastest round: measured again once

# This process's decisions by "name | shape class" (CPU) or "device | name | shape class" (the
# machine is this one; threads are set once per process in practice, and a change of thread
# count is a new process's cache key).
_memory: dict[str, dict[str, Any]] = {}
_CPU = torch.device("cpu")
_allowance = {"left": math.inf}  # seconds new choices may still spend measuring (``measuring``)
_defaults: dict[str, str] = {}  # choices taken unmeasured, by key, when the allowance was spent
_spent = {"seconds": 0.0}  # seconds this process has spent measuring new choices (``seconds_measuring``)
# Choices being measured now: a candidate may make a choice of its own (attention-bf16's fp32
# candidate picks its attention kernel), whose time is already within the outer measurement's.
_depth = {"n": 0}


def cache_path() -> Path:
    root = os.environ.get("TFORMER_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tformer"
    return Path(root) / "kernels.json"


# Raised when the way a choice is measured changes: decisions measured the old way are ignored
# (5: the fastest round, not the median).
VERSION = 5


def _machine(device: torch.device = _CPU) -> str:
    """The device a choice was measured on: the CPU model and thread count (the key every CPU
    decision has had), or a GPU's model and compute capability."""
    if device.type == "cuda":
        return f"{gpu_name(device)} | torch {torch.__version__} | {device.type}"
    if device.type != "cpu":
        return f"{device.type} | torch {torch.__version__}"
    return f"{cpu_info()[0]} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def machine_key(device: torch.device = _CPU) -> str:
    return f"{_machine(device)} | v{VERSION}"


Candidates = dict[str, Callable[[], Any]]


def choose(name: str, shape_class: str, candidates: Candidates | Callable[[], Candidates],
           measure: Callable[[Callable[[], Any]], float] | None = None,
           device: torch.device = _CPU) -> str:
    """The fastest of `candidates` (name -> a call that runs it once on `device`; or a function
    that makes them, called only if a measurement is needed) for this device and shape class:
    from memory, else from the cache file, else measured now and remembered. Cheap when known:
    it runs on every call of a hot kernel."""
    key = _memory_key(name, shape_class, device)
    if key in _defaults:
        return _defaults[key]
    decided = _measured(name, shape_class, candidates, measure, device)
    if decided is not None:
        return decided["choice"]
    # Nothing left to measure with: the default, for this process only (a run with time to
    # spare measures it later).
    _defaults[key] = next(iter(candidates() if callable(candidates) else candidates))
    return _defaults[key]


def timings(name: str, shape_class: str, candidates: Candidates | Callable[[], Candidates],
            measure: Callable[[Callable[[], Any]], float] | None = None,
            device: torch.device = _CPU) -> dict[str, float] | None:
    """Each candidate's seconds, as ``choose`` measures and remembers them (for a cost model
    that needs the times themselves, not only the fastest), or None where nothing is known and
    nothing is left to measure with (``measuring``)."""
    if _memory_key(name, shape_class, device) in _defaults:
        return None
    decided = _measured(name, shape_class, candidates, measure, device)
    if decided is None:
        _defaults[_memory_key(name, shape_class, device)] = ""
        return None
    return dict(decided["seconds"])


def _measured(name: str, shape_class: str, candidates: Candidates | Callable[[], Candidates],
              measure: Callable[[Callable[[], Any]], float] | None,
              device: torch.device) -> dict[str, Any] | None:
    """``choose``'s decision: remembered, or measured now within the allowance (counted in
    ``seconds_measuring``), or None where the allowance ran out first."""
    def decide_now() -> dict[str, Any]:
        t = time.perf_counter()
        _depth["n"] += 1
        try:
            return decide(candidates() if callable(candidates) else candidates,
                          measure or (lambda call: _time_once(call, device)),
                          deadline=t + _allowance["left"])
        finally:
            _depth["n"] -= 1
            if _depth["n"] == 0:  # counted once: a nested choice's seconds are the outer one's
                spent = time.perf_counter() - t
                _allowance["left"] -= spent
                _spent["seconds"] += spent

    choices = None if callable(candidates) else set(candidates)
    if _allowance["left"] > 0 or known(name, shape_class, choices, device) is not None:
        try:
            return recall(name, shape_class, decide_now, choices, device)
        except OutOfTime:
            pass  # the measurement was abandoned half-way: nothing is remembered of it
    return None


@contextlib.contextmanager
def measuring(seconds: float | None) -> Iterator[None]:
    """Within the block, new kernel choices (``choose``) are measured until `seconds` are spent
    (None: no limit); after that a shape class not yet known runs its default, the first
    candidate listed, and nothing is remembered. A timed training run bounds what its kernel
    choices cost so: at most its probes' share of the budget."""
    before = _allowance["left"]
    _allowance["left"] = math.inf if seconds is None else seconds
    try:
        yield
    finally:
        _allowance["left"] = before


def seconds_measuring() -> float:
    """Seconds this process has spent measuring new kernel choices, so far: a caller timing
    work to predict its later pace takes out what it spent on choices made once (a run's
    first validation measured 0.14 s of new shapes within its 0.37 s)."""
    return _spent["seconds"]


def recall(name: str, shape_class: str, decide_now: Callable[[], dict[str, Any]],
           choices: set[str] | None = None, device: torch.device = _CPU,
           rate: bool = False) -> dict[str, Any]:
    """The decision for this device and shape class (``decision()``'s dict): from memory, else
    from the cache file (when well formed, its choice one of `choices` if given), else made now
    by `decide_now()` (measuring on `device`) and remembered, as ``choose``'s are.

    A `rate` (a decision whose seconds are used as this machine's speed, not only compared with
    each other) measured while other processes' threads ran on the cores this process's threads
    need (``quiet``) is this process's only: the next one measures again. Remembered, a busy
    moment's rate was the machine's for good: a 512^3 product measured at 22.7 ms in fp32 and
    28.9 ms in bf16 on 2 threads (alone: 0.87 and 0.32) planned every later 2-thread run on that
    machine in fp32, with steps estimated 26x slower than fp32's real ones."""
    key = f"{name} | {shape_class}"
    remembered = known(name, shape_class, choices, device)
    if remembered is not None:
        return remembered
    decision = decide_now()
    _memory[_memory_key(name, shape_class, device)] = decision
    if not rate or device.type != "cpu" or quiet():
        _remember(f"{machine_key(device)} | {key}", decision, device)
    return decision


def quiet() -> bool:
    """Did other processes leave this process's threads their cores just now: their runnable
    threads (tformer.nn.kernels.machine.others_running, three quick reads) fit on the cores this
    process's threads do not use."""
    others = others_running(samples=3, interval=0.002)
    return others + torch.get_num_threads() <= usable_cores()


def remember(name: str, shape_class: str, decision: dict[str, Any], device: torch.device = _CPU,
             rate: bool = False) -> None:
    """Keep `decision` (``decision()``'s dict) for this device and shape class, replacing what
    was remembered: for a number that each run measures afresh (a training step's rate, which
    tformer.training.planning estimates the next run's steps with). A `rate` measured on a busy
    machine is this process's only, as ``recall``'s."""
    _memory[_memory_key(name, shape_class, device)] = decision
    if not rate or device.type != "cpu" or quiet():
        _remember(f"{machine_key(device)} | {name} | {shape_class}", decision, device)


def known(name: str, shape_class: str, choices: set[str] | None = None,
          device: torch.device = _CPU) -> dict[str, Any] | None:
    """The remembered decision for this device and shape class, or None: nothing is measured
    (a plan asks before it decides whether a measurement fits its budget)."""
    mine = _memory_key(name, shape_class, device)
    if mine in _memory:
        return _memory[mine]
    saved = _read().get(f"{machine_key(device)} | {name} | {shape_class}")
    if _well_formed(saved) and (choices is None or saved["choice"] in choices):
        _memory[mine] = saved
        return saved
    return None


def _memory_key(name: str, shape_class: str, device: torch.device) -> str:
    """This process's key of a decision: "name | shape class" on the CPU, the device first else."""
    key = f"{name} | {shape_class}"
    return key if device.type == "cpu" else f"{device} | {key}"


class OutOfTime(Exception):
    """A measurement reached its deadline before its end (``decide``)."""


def decide(candidates: dict[str, Callable[[], Any]], measure: Callable[[Callable[[], Any]], float],
           deadline: float = math.inf) -> dict[str, Any]:
    """Time every candidate (interleaved rounds, the fastest of each: other work on the machine
    only ever adds time); rounds whose spread says the machine was busy are measured again
    once. The default (first) wins ties. Past `deadline` (a time.perf_counter() reading) it
    gives up, raising OutOfTime: on a busy machine one decision took 4.6 s of a timed run
    whose measurements were allowed 3 s in all (``measuring``)."""
    def timed(call: Callable[[], Any]) -> float:
        if time.perf_counter() > deadline:
            raise OutOfTime
        return measure(call)

    names = list(candidates)
    for n in names:
        timed(candidates[n])  # warm-up: kernel creation, first-touch allocation
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(2):
        for _ in range(ROUNDS):
            for n in names:
                times[n].append(timed(candidates[n]))
        if not noisy(times):
            break
    fastest = {n: min(t) for n, t in times.items()}
    default = names[0]
    best = min(names, key=fastest.__getitem__)
    if fastest[best] > fastest[default] * (1 - NOISE):
        best = default
    return decision(best, fastest)


def noisy(times: dict[Any, list[float]]) -> bool:
    """Whether any candidate's rounds spread by more than SPREAD (its fastest to its median): an
    outlier, measured while something else ran, to measure again."""
    return any(statistics.median(t) > SPREAD * min(t) for t in times.values() if t)


def decision(choice: str, seconds: dict[str, float]) -> dict[str, Any]:
    """What is remembered of a choice: the choice, each candidate's seconds, and when."""
    return {"choice": choice, "seconds": {n: round(t, 6) for n, t in seconds.items()},
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _well_formed(saved: Any) -> bool:
    """A cache entry as ``decision`` writes it (an edited or damaged one is measured again)."""
    return (isinstance(saved, dict) and isinstance(saved.get("choice"), str)
            and isinstance(saved.get("seconds"), dict) and bool(saved["seconds"])
            and all(isinstance(t, int | float) and not isinstance(t, bool) and t >= 0
                    for t in saved["seconds"].values()))


def decisions() -> dict[str, dict[str, Any]]:
    """Every decision this machine has made (the cache file and this process's CPU ones), for
    reports."""
    return {**_read(), **{f"{machine_key()} | {k}": v for k, v in _memory.items()
                          if not k.startswith(("cuda", "mps"))}}


def summary(limit: int = 12, device: torch.device = _CPU) -> list[str]:
    """One line per decision of this device (and thread count): name, shape, choice, times."""
    lines = []
    prefix = machine_key(device) + " | "
    for key, d in sorted(decisions().items()):
        if key.startswith(prefix):
            times = ", ".join(f"{n} {s * 1000:.2f} ms" for n, s in d.get("seconds", {}).items())
            lines.append(f"{key[len(prefix):]}: {d.get('choice')} ({times})")
    return lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])


def forget() -> None:
    """Measure again: drop this process's decisions and the cache file."""
    _memory.clear()
    _defaults.clear()
    with contextlib.suppress(OSError):
        cache_path().unlink()


def _time_once(call: Callable[[], Any], device: torch.device = _CPU) -> float:
    synchronize(device)  # a GPU's earlier work is not this call's
    t = time.perf_counter()
    call()
    synchronize(device)
    return time.perf_counter() - t


def _read() -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}  # none yet, unreadable or corrupt: measure again
    return data if isinstance(data, dict) else {}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _remember(key: str, decision: dict[str, Any], device: torch.device = _CPU) -> None:
    """Add one decision to the cache file (read, update and replace it under the lock);
    a cache that cannot be written only costs a measurement next time."""
    path = cache_path()
    with contextlib.suppress(OSError), _locked(path), uncounted():
        data = _read()
        data[key] = decision
        # This machine's decisions of an older VERSION are never read again: dropped.
        mine, current = f"{_machine(device)} | ", f"{machine_key(device)} | "
        data = {k: v for k, v in data.items() if not k.startswith(mine) or k.startswith(current)}
        write_json_atomic(path, data)
