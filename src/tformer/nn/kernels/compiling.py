"""Compiled kernels: torch.compile as one more kernel choice, measured on the machine at hand.

    add_norm = Compiled("add-norm", plain_add_norm)       # called as plain_add_norm is
    y = add_norm(x, r, weight, bias)                       # eager or compiled, as measured here

A ``Compiled`` runs the readable function it wraps, or that same function compiled by inductor
(torch.compile, dynamic shapes: one compilation serves every batch and length), whichever was
measured faster here for the call's shape class (``tformer.nn.kernels.autotune``, remembered per
machine). The compiled code is the readable function's: there is no second formula to keep in
step, and tests prove each compiled kernel equal to eager (values, and gradients where it
trains). Before a compiled kernel is first timed its output is compared with eager's on the very
call that measures it (``TOLERANCE`` per dtype); one that differs is never chosen.

Compilation costs seconds to a minute of CPU time on first use in a process (inductor keeps the
generated code in its own cache, so later processes on the machine pay less: "cold" and "warm"),
so a compiled kernel is considered only where the caller expects the work to repay it:
``expecting(expected_seconds)`` around a job says how long it would take eagerly, and a kernel is
compiled there only when the seconds it would save repay its remembered compilation time: once
its saving per call was measured here and its share of the job's eager time so far is known
(its eager calls inside ``expecting`` blocks are timed), that saving times that share times the
expected seconds; before, the expected seconds must be PAYBACK times the compilation (COLD_GUESS
before any was measured). (The bf16 add-and-norm is ~10% of an encode and measured 8-20% faster
compiled at 2,048-8,192 rows on an Intel Xeon, 2 threads: an encode saves 1-2%, not the 20%
PAYBACK alone assumes.) Outside such a block everything runs
eagerly: a library call on a few inputs never waits for a compiler. ``TFORMER_COMPILE=0`` turns
compiled kernels off, ``TFORMER_COMPILE=1`` measures compiled kernels wherever they may run,
regardless of the expected work (what the benchmark and the tests ask for; ``forced("on")`` for
a block).

Eager is kept where there is no compiler (inductor builds C++ at run time on a CPU and needs
triton on a GPU), where compiling fails (remembered for the process; the call runs eagerly), under
``kernels.readable()``, and inside another trace.

Also here: ``compile_model``, the public ``tformer.compile_model`` (torch.compile of a whole model,
with a clear error up front where it cannot work).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from tformer.errors import BadType
from tformer.nn.kernels import autotune
from tformer.nn.kernels.switch import is_readable
from tformer.nn.kernels.tracing import tracing

BACKEND = "inductor"  # torch.compile's backend (tests of the plumbing swap in a cheaper one)
PAYBACK = 5.0  # compile only where the eager work expected is this many times the compile time
COLD_GUESS = 60.0  # seconds a first compilation is assumed to take before one was measured here
# compiled vs eager on the measuring call: max abs difference over max abs value (inductor fuses
# and reorders sums, so fp32 differs in the last bits; bf16 rounds its intermediates differently)
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 2e-2, torch.float16: 2e-3}

_expected = {"seconds": 0.0}  # eager seconds the current job expects (``expecting``)
_later = {"items": 0}  # items of work after the current job's (``more_to_come``)
_job = {"depth": 0, "seconds": 0.0}  # ``expecting`` blocks open now, and the seconds spent in them
_failed: dict[str, str] = {}  # kernel name -> why compiling it failed in this process
_forced: dict[str, str | None] = {"mode": None}  # ``forced``'s mode, over TFORMER_COMPILE


def mode() -> str:
    """TFORMER_COMPILE: "auto" (the default: where the work repays it), "off" or "on" (or what
    ``forced`` sets for a block)."""
    if _forced["mode"] is not None:
        return _forced["mode"]
    value = os.environ.get("TFORMER_COMPILE", "auto").strip().lower()
    return {"0": "off", "false": "off", "no": "off", "off": "off",
            "1": "on", "true": "on", "yes": "on", "on": "on"}.get(value, "auto")


@contextlib.contextmanager
def expecting(expected_seconds: float) -> Iterator[None]:
    """Within the block, compiled kernels may be chosen where they repay their compilation over
    ``expected_seconds`` of eager work (module docstring); math.inf: whenever faster. Nested,
    the larger of the two holds: a part of a job is still within the job."""
    before = _expected["seconds"]
    _expected["seconds"] = max(before, expected_seconds)
    _job["depth"] += 1
    start = time.perf_counter()
    try:
        yield
    finally:
        _expected["seconds"] = before
        _job["depth"] -= 1
        if _job["depth"] == 0:  # the outermost block: a job's time, once
            _job["seconds"] += time.perf_counter() - start


@contextlib.contextmanager
def more_to_come(items: int) -> Iterator[None]:
    """Within the block, a job that counts its work in items (a prediction's examples) counts
    ``items`` more after the ones it is given: a command reads a file a window at a time, and a
    compilation is repaid over the whole file's eager work, not a window's (``expecting``: a
    window of 512 inputs never repaid a decoding step's 30 s compilation; 50,000 can)."""
    before = _later["items"]
    _later["items"] = max(0, int(items))
    try:
        yield
    finally:
        _later["items"] = before


def items_to_come() -> int:
    """The items ``more_to_come`` announced for after the current job (0 outside it)."""
    return _later["items"]


@contextlib.contextmanager
def forced(value: str) -> Iterator[None]:
    """Within the block, compiled kernels are "on" (measured wherever they may run, whatever the
    expected work) or "off", as TFORMER_COMPILE=1 / 0 would say for the process: the benchmark
    times both in one process."""
    if value not in ("on", "off"):
        raise ValueError(f"value: expected 'on' or 'off', got {value!r}")
    before = _forced["mode"]
    _forced["mode"] = value
    try:
        yield
    finally:
        _forced["mode"] = before


def why_not_compiled(device: torch.device) -> str | None:
    """Why kernels on `device` run eagerly, without measuring a compiled version; None to measure."""
    if is_readable():
        return "kernels.readable() asks for the readable functions as they are"
    if mode() == "off":
        return "TFORMER_COMPILE=0 turns compiled kernels off"
    if tracing():
        return "already inside a compiler or exporter: it compiles the readable code itself"
    if BACKEND == "inductor" and device.type == "cpu" and _cxx() is None:
        return "inductor builds C++ at run time on a CPU and found no C++ compiler (g++, clang++)"
    if BACKEND == "inductor" and device.type == "cuda" and not _has_triton():
        return "inductor needs triton on a GPU, and it is not installed"
    if device.type not in ("cpu", "cuda"):
        return f"inductor has no backend for {device.type} here"
    return None


@functools.cache
def _cxx() -> str | None:
    from torch._inductor import config as inductor  # ~1 s to import: only when asked

    cxx = inductor.cpp.cxx[-1] if isinstance(inductor.cpp.cxx, tuple) else inductor.cpp.cxx
    return next((c for c in (cxx, "g++", "clang++") if c and shutil.which(c)), None)


@functools.cache
def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class Compiled:
    """``fn``, run eagerly or compiled as measured faster here (module docstring).

    ``shape_class(*args)`` names the calls that share a choice (default: each tensor argument's
    rank and dtype and its rows rounded up to a power of two); ``device_of(*args)`` the device.
    """

    def __init__(self, name: str, fn: Callable[..., Any],
                 shape_class: Callable[..., str] | None = None) -> None:
        self.name, self.fn = name, fn
        self.shape_class = shape_class or default_shape_class
        self._compiled: Callable[..., Any] | None = None
        self.compile_seconds: float | None = None  # this process's first compiled call
        self.eager_seconds = 0.0  # its eager calls' time inside ``expecting`` blocks (its share)

    def __call__(self, *args: Any) -> Any:
        if self.choice(*args) == "compiled":
            try:
                return self.run_compiled(*args)
            except Exception:  # remembered and warned about (run_compiled): eager from now on
                pass
        if not _job["depth"]:
            return self.fn(*args)
        start = time.perf_counter()  # within a job: this kernel's share of its time
        out = self.fn(*args)
        self.eager_seconds += time.perf_counter() - start
        return out

    def choice(self, *args: Any) -> str:
        """"eager" or "compiled" for these arguments (measured once per shape class and machine).
        Cheap when nothing may compile (the default: no ``expecting`` block): it runs on every
        call of a hot kernel (each decoding step, each layer's add and norm)."""
        if _forced["mode"] == "off" or (self._compiled is None and _expected["seconds"] <= 0
                                        and mode() == "auto"):
            return "eager"
        device = _device_of(args)
        if self.why_not(device) is not None:
            return "eager"
        shape = self.shape_class(*args)
        remembered = autotune.known(f"compiled:{self.name}", shape, {"eager", "compiled"}, device)
        if mode() != "on" and not self._repays(remembered):
            return "eager"
        decision = autotune.recall(f"compiled:{self.name}", shape, lambda: self._decide(args),
                                   {"eager", "compiled"}, device)
        return decision["choice"] if self.name not in _failed else "eager"

    def why_not(self, device: torch.device) -> str | None:
        """``why_not_compiled``, or why this kernel's compilation failed in this process."""
        if self.name in _failed:
            return f"compiling {self.name} failed here: {_failed[self.name]}"
        return why_not_compiled(device)

    def _repays(self, remembered: dict | None) -> bool:
        """Whether the job's expected eager seconds repay a compilation (the remembered one's
        seconds, else COLD_GUESS): by the seconds it would save (``_saving``) where they are known,
        else by PAYBACK; a kernel already compiled in this process costs nothing more."""
        if remembered is not None and remembered["choice"] != "compiled":
            return True  # eager, as measured: nothing to compile
        if self._compiled is not None and self.compile_seconds is not None:
            return True
        cost = COLD_GUESS if remembered is None else float(remembered.get("compile_s", COLD_GUESS))
        saving = self._saving(remembered)
        if saving is None:
            return _expected["seconds"] >= PAYBACK * cost
        return saving > 0 and saving * _expected["seconds"] >= cost

    def _saving(self, remembered: dict | None) -> float | None:
        """The share of a job's eager time compiling this kernel would save: its measured saving
        per call (1 - compiled / eager) times its share of the job's time so far; None before
        both are known (nothing measured on this machine, or no eager call timed in a job)."""
        seconds = {} if remembered is None else remembered.get("seconds", {})
        eager, compiled = seconds.get("eager"), seconds.get("compiled")
        if not eager or compiled is None or not self.eager_seconds or not _job["seconds"]:
            return None
        return max(0.0, 1.0 - compiled / eager) * min(1.0, self.eager_seconds / _job["seconds"])

    @property
    def compiled(self) -> Callable[..., Any]:
        if self._compiled is None:
            compiled = torch.compile(self.fn, dynamic=True, backend=BACKEND)

            def run(*args: Any) -> Any:
                with _independent_sizes():
                    return compiled(*args)
            self._compiled = run
        return self._compiled

    def run_compiled(self, *args: Any) -> Any:
        """The compiled function on ``args``, its first call timed (the compilation); a failure
        is remembered for the process (the kernel then runs eagerly) and raised."""
        first = self.compile_seconds is None
        t = time.perf_counter()
        try:
            out = self.compiled(*args)
        except Exception as e:  # inductor's errors have no common type: any failure means eager
            record_failure(self.name, e)
            raise
        if first:
            self.compile_seconds = time.perf_counter() - t
        return out

    def _decide(self, args: tuple) -> dict[str, Any]:
        """Compile (timed), check against eager on ``args``, then time both (autotune.decide)."""
        expected = self.fn(*args)
        try:
            got = self.run_compiled(*args)
        except Exception:
            return {**autotune.decision("eager", {"eager": 1.0}), "failed": _failed[self.name]}
        compile_s = self.compile_seconds or 0.0
        differs = max_relative_difference(got, expected)
        if differs is not None:
            return {**autotune.decision("eager", {"eager": 1.0}), "compile_s": round(compile_s, 3),
                    "differs": differs}
        candidates = {"eager": lambda: self.fn(*args), "compiled": lambda: self.compiled(*args)}
        decision = autotune.decide(candidates, lambda call: autotune._time_once(call, _device_of(args)))
        return {**decision, "compile_s": round(compile_s, 3)}


def _independent_sizes() -> contextlib.AbstractContextManager:
    """A block in which torch.compile gives every dynamic size its own symbol. By default sizes
    that happen to be equal when traced share one ("duck shapes"), so a size fixed by the model
    fixes the other too: a decoding step traced at 64 rows of a d_model-64 model, or at 256
    beams of a d_model-256 one, was compiled for that row count only, and compiled again for
    every other (a beam search's rows shrink as sources finish) until torch's recompile limit
    left it eager."""
    config = getattr(getattr(torch, "fx", None), "experimental", None)
    config = getattr(config, "_config", None)
    if config is None or not hasattr(config, "use_duck_shape"):
        return contextlib.nullcontext()
    return _without_duck_shapes(config)


@contextlib.contextmanager
def _without_duck_shapes(config) -> Iterator[None]:
    """config.use_duck_shape False within the block: set and put back by hand, 5 us a call
    where config.patch took 30 (a compiled decoding step is called every step)."""
    before = config.use_duck_shape
    config.use_duck_shape = False
    try:
        yield
    finally:
        config.use_duck_shape = before


def max_relative_difference(got: Any, expected: Any) -> str | None:
    """None when every tensor of ``got`` is within TOLERANCE of ``expected``'s (max abs difference
    over max abs value), else what differs."""
    pairs = list(_tensors(got, expected))
    for g, e in pairs:
        if g.shape != e.shape or g.dtype != e.dtype:
            return f"shape/dtype {tuple(g.shape)} {g.dtype} vs {tuple(e.shape)} {e.dtype}"
        if not e.is_floating_point():
            if not torch.equal(g, e):
                return "integer outputs differ"
            continue
        scale = max(float(e.abs().max()), 1e-30) if e.numel() else 1.0
        diff = float((g.float() - e.float()).abs().max()) / scale if e.numel() else 0.0
        if not diff <= TOLERANCE.get(e.dtype, 1e-5):  # NaN fails too
            return f"max relative difference {diff:.1e} > {TOLERANCE.get(e.dtype, 1e-5):.0e} ({e.dtype})"
    return None


def _tensors(got: Any, expected: Any) -> Iterator[tuple[Tensor, Tensor]]:
    if isinstance(expected, Tensor):
        yield got, expected
    elif isinstance(expected, tuple | list):
        for g, e in zip(got, expected, strict=True):
            yield from _tensors(g, e)


def default_shape_class(*args: Any) -> str:
    """Each tensor argument's dtype and rank, its first dimension rounded up to a power of two."""
    parts = []
    for a in args:
        if isinstance(a, Tensor):
            rows = 1 << max(a.size(0) - 1, 0).bit_length() if a.dim() else 0
            parts.append(f"{str(a.dtype).removeprefix('torch.')}{a.dim()}d{rows}")
    return "/".join(parts)


def _device_of(args: tuple) -> torch.device:
    return next((a.device for a in args if isinstance(a, Tensor)), torch.device("cpu"))


def record_failure(name: str, error: Exception) -> None:
    """Remember for the process that compiling `name` failed (it runs eagerly from now on), and
    say so once."""
    _failed[name] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
    warnings.warn(f"tformer: compiling {name} failed, it runs eagerly: {_failed[name]}", RuntimeWarning,
                  stacklevel=3)


def summary() -> dict[str, str]:
    """This process's compiled kernels that failed, by name (for ``tformer info`` / bench)."""
    return dict(_failed)


def forget_failures() -> None:
    _failed.clear()


def compile_model(module: nn.Module, **kwargs) -> nn.Module:
    """``torch.compile(module, **kwargs)``, with a clear error up front when the machine has no
    C++ compiler: inductor, torch.compile's CPU backend, builds C++ at run time."""
    if not isinstance(module, nn.Module):  # torch.compile's own word was a bare AssertionError
        raise BadType("module", f"expected a torch.nn.Module (e.g. an Encoder), got {type(module).__name__}")
    from torch._inductor import config as inductor

    cxx = inductor.cpp.cxx[-1] if isinstance(inductor.cpp.cxx, tuple) else inductor.cpp.cxx
    found = [c for c in (cxx, "g++", "clang++") if c and shutil.which(c)]
    if kwargs.get("backend", "inductor") == "inductor" and not found:
        raise RuntimeError(
            "torch.compile: inductor needs a C++ compiler at run time and found none "
            f"({cxx or 'g++'} not on PATH); install one (apt-get install g++) or pass "
            "backend='eager'"
        )
    return torch.compile(module, **kwargs)

