"""Timing and reporting: interleaved rounds, medians, paired ratios, cores, one markdown table.

Every contender of a workload runs once per round, in an order that alternates between rounds
(forward, then reversed), so slow drifts of a shared machine hit all of them alike. A paired
ratio compares two contenders within each round, then takes the median over rounds.
"""

from __future__ import annotations

import gc
import json
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tformer.nn.kernels.machine import ISA_FLAGS, cpu_info


@dataclass
class Timing:
    wall: list[float] = field(default_factory=list)  # seconds per round
    cpu: list[float] = field(default_factory=list)  # process CPU seconds per round

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0.05 = the middle half within 5%)."""
        if len(self.wall) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.wall, n=4, method="inclusive")
        return (q3 - q1) / self.median

    @property
    def cores(self) -> float:
        """Process CPU time over wall time: ~N when N threads ran undisturbed."""
        return sum(self.cpu) / sum(self.wall)


@dataclass(frozen=True)
class Measured:
    """A call timed elsewhere (a contender in its own process times itself): seconds."""

    wall: float
    cpu: float


def measure(contenders: dict[str, Callable[[], object]], rounds: int, warmup: int = 1,
            pause: float = 0.0) -> dict[str, Timing]:
    """Warm each contender up, then time one call of each per round, order alternating.

    A contender that returns a ``Measured`` is timed by its own numbers (its process's CPU time).

    ``pause`` seconds of sleep follow every call, untimed: OpenBLAS's worker threads (NumPy) spin
    for ~0.1 s after a call and would otherwise steal a core from whichever contender comes next.
    """
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    timings = {name: Timing() for name in contenders}
    names = list(contenders)
    gc.collect()
    gc.disable()  # no collector pauses inside timed calls
    try:
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                c0, t0 = time.process_time(), time.perf_counter()
                result = contenders[name]()
                t1, c1 = time.perf_counter(), time.process_time()
                if isinstance(result, Measured):
                    t0, t1, c0, c1 = 0.0, result.wall, 0.0, result.cpu
                timings[name].wall.append(t1 - t0)
                timings[name].cpu.append(c1 - c0)
                time.sleep(pause)
    finally:
        gc.enable()
    return timings


def paired_ratio(slow: Timing, fast: Timing) -> float:
    """Median over rounds of t_slow / t_fast: how many times faster `fast` ran, round by round."""
    return statistics.median(s / f for s, f in zip(slow.wall, fast.wall, strict=True))


# Results -----------------------------------------------------------------------------------------
@dataclass
class Row:
    workload: str
    contender: str
    median_ms: float | None = None
    spread: float | None = None
    tokens_per_s: float | None = None
    vs_tformer: float | None = None  # paired t_contender / t_tformer (> 1: tformer faster)
    cores: float | None = None
    roofline: float | None = None  # achieved fraction of the measured GEMM throughput
    peak_mib: float | None = None  # peak RSS growth
    note: str = ""


@dataclass
class Target:
    workload: str
    goal: str  # e.g. "tformer >= 1.15x faster than torch.nn fast path"
    measured: float | None
    threshold: float
    higher_is_better: bool = True
    unit: str = "x"
    not_judged: str = ""  # why the target is not judged (e.g. --quick sizes)

    @property
    def met(self) -> bool | None:
        if self.measured is None or self.not_judged:
            return None
        return self.measured >= self.threshold if self.higher_is_better else self.measured <= self.threshold


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    interrupted: str | None = None  # the workload that was running when the bench was stopped
    stopped_by: KeyboardInterrupt | None = field(default=None, repr=False, compare=False)  # Ctrl-C or SIGTERM

    def extend(self, other: Report) -> None:
        self.rows += other.rows
        self.targets += other.targets
        self.notes += [n for n in other.notes if n not in self.notes]

    def to_json(self) -> str:
        data = {
            "machine": self.machine,
            "rows": [asdict(r) for r in self.rows],
            "targets": [dict(asdict(t), met=t.met) for t in self.targets],
            "notes": self.notes,
            "interrupted": self.interrupted,
        }
        return json.dumps(data, indent=2)

    def to_markdown(self) -> str:
        out = [_machine_line(self.machine), ""]
        header = ["workload", "contender", "median ms", "spread", "tokens/s",
                  "x tformer time (paired)", "cores", "GEMM roofline", "peak RSS MiB", "note"]
        out += [_md_row(header), _md_row(["---"] * len(header))]
        for r in self.rows:
            out.append(_md_row([
                r.workload, r.contender, _num(r.median_ms, "{:.1f}"), _num(r.spread, "±{:.0%}"),
                _num(r.tokens_per_s, "{:,.0f}"), _num(r.vs_tformer, "{:.2f}x"),
                _num(r.cores, "{:.2f}"), _num(r.roofline, "{:.0%}"), _num(r.peak_mib, "{:.0f}"),
                r.note,
            ]))
        if self.targets:
            out += ["", _md_row(["workload", "target", "measured", "met"]), _md_row(["---"] * 4)]
            for t in self.targets:
                met = {True: "yes", False: "**no**", None: t.not_judged or "n/a"}[t.met]
                measured = "-" if t.measured is None else f"{t.measured:.2f}{t.unit}"
                out.append(_md_row([t.workload, t.goal, measured, met]))
        if self.notes:
            out += ["", *(f"- {n}" for n in self.notes)]
        return "\n".join(out)


def machine_info(threads: int) -> dict:
    # imported here: a peer's worker process imports this module and must not load torch
    import numpy as np
    import torch

    from tformer.commands.benchmarking.models import onednn_linear
    from tformer.nn.kernels.allocator import keep_freed_memory

    cpu, isa = cpu_info()
    return {
        "cpu": cpu, "isa": isa, "torch": torch.__version__, "numpy": np.__version__, "threads": threads,
        "onednn_linear": onednn_linear(), "python": platform.python_version(),
        "malloc": keep_freed_memory(),
    }


def _machine_line(m: dict) -> str:
    if not m:
        return ""
    isa = ", ".join(m.get("isa", [])) or "none of " + ", ".join(ISA_FLAGS)
    line = (f"CPU {m['cpu']} ({isa}); torch {m['torch']}, numpy {m['numpy']}; {m['threads']} threads; "
            f"oneDNN linear {'on' if m['onednn_linear'] else 'off'}")
    if "malloc" in m:
        line += f"; malloc: {m['malloc']}"
    if "mode" in m:
        line += f"; {m['mode']} run, {m['seconds']} s"
    return line


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else fmt.format(value)


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def run_workloads(work: Iterable[tuple[str, Callable[[], Report]]],
                  progress: Callable[[str], None] | None = None) -> Report:
    """Each workload's report, in order. Stopped (Ctrl-C, or SIGTERM, which `tformer` turns into
    the same: tformer.errors.Terminated), the report of those that finished, naming the one that was
    running and keeping what stopped it: a long run cut short keeps what it measured."""
    report = Report()
    for name, fn in work:
        if progress:
            progress(name)
        try:
            part = fn()
        except KeyboardInterrupt as e:
            report.interrupted, report.stopped_by = name, e
            report.notes.append(f"interrupted during {name}: the tables hold the workloads that finished "
                                "before it")
            break
        report.extend(part)
    return report


def is_bench_json(path: Path) -> bool:
    """A results file `tformer bench --json` wrote (its keys), which a new run may replace."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and {"machine", "rows", "targets", "notes"} <= set(data)
