"""What every workload shares: the run's settings, the check of outputs before timing, and one
table row per timed contender."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tformer.commands.benchmarking import models as M
from tformer.commands.benchmarking.harness import Report, Row, Timing, paired_ratio

TOLERANCE = 1e-4  # fp32 max abs diff at real tokens between contenders (the tests hold 1e-5 at tiny sizes)


@dataclass
class Settings:
    quick: bool = False
    rounds: int | None = None  # None: each workload's default
    threads: int = 2
    contenders: list[str] | None = None  # peer workloads: only contenders whose name starts so
    model_dir: str | None = None  # sentences-minilm: this BERT-format / sentence-transformers model
    tf32: bool = False  # the GPU workloads: also fp32 in TF32 (where the GPU has it)

    def n_rounds(self, full: int) -> int:
        return self.rounds if self.rounds is not None else (2 if self.quick else full)


def timed_rows(workload: str, timings: dict[str, Timing], tokens: int,
               flops: float | None = None, roofline: float | None = None) -> list[Row]:
    """One row per contender; the first contender is the one the paired ratios refer to."""
    first = timings[next(iter(timings))]
    rows = []
    for name, t in timings.items():
        rows.append(Row(
            workload, name, t.median * 1e3, t.spread, tokens / t.median,
            paired_ratio(t, first), t.cores,
            flops / t.median / roofline if flops and roofline else None,
        ))
    return rows


def checked(report: Report, workload: str, runs: dict[str, Callable], outputs: dict[str, object],
            expected: dict[str, object], mask, tolerance: float = TOLERANCE) -> dict[str, Callable]:
    """Keep the contenders whose output matches its expected output; report the others untimed."""
    kept = {}
    for name, run in runs.items():
        diff = M.max_abs_diff(outputs[name], expected[name], mask)
        if diff <= tolerance:
            kept[name] = run
        else:
            report.rows.append(Row(workload, name, note=f"not timed: output differs by {diff:.1e} "
                                                        f"> {tolerance:.0e}"))
    return kept
