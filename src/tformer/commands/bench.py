"""`tformer bench`: tformer against torch.nn and HuggingFace BERT on the same work (issue 5).

Every contender is built with the same weights and checked equal before timing; each workload
times its contenders interleaved in rounds and reports medians, spreads, paired ratios and the
cores used. See benchmarks/README.md for the workloads and how to read the table. On a GPU
(``--device cuda``) the device workloads run instead (tformer.commands.benchmarking.device).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HELP = ("benchmark tformer against torch.nn, HF BertModel and the deployment runtimes (ONNX Runtime, "
        "CTranslate2, OpenVINO, sentence-transformers): one markdown table")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes and 2 rounds: checks the plumbing in under a minute (CI)")
    p.add_argument("--only", nargs="+", metavar="WORKLOAD",
                   help="run only these workloads (see --list)")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--rounds", type=int, default=None,
                   help="timed rounds per workload (default: 7 inference, 5 training, 3 NumPy and decoding)")
    p.add_argument("--threads", type=int, default=2,
                   help="threads per contender (default 2, as in issue 5); peers run each in its own process")
    p.add_argument("--contenders", nargs="+", metavar="PREFIX",
                   help="peer workloads (sentences-minilm, mixed-base): run only the contenders whose "
                        "name starts with one of these, e.g. 'ONNX Runtime' CTranslate2 (tformer fp32 "
                        "always runs: it is the reference)")
    p.add_argument("--model-dir", metavar="DIR",
                   help="sentences-minilm: encode with this BERT-format or sentence-transformers "
                        "directory instead of a random-weight one of all-MiniLM-L6-v2's shape (the "
                        "int8 and bf16 cosines mean something only on trained weights)")
    p.add_argument("--tf32", action="store_true",
                   help="the GPU workloads: also time fp32 training with TF32 matrix products, both "
                        "libraries (NVIDIA GPUs of compute capability 8.0+; as `tformer train --tf32`)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON (a file an earlier "
                   "--json wrote is replaced; any other is refused)")
    from tformer.commands._inputs import add_device

    add_device(p)


def run(args: argparse.Namespace) -> int:
    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds: expected a positive int, got {args.rounds}")
    if args.threads < 1:
        raise ValueError(f"--threads: expected a positive int, got {args.threads}")
    import warnings

    import torch

    from tformer.commands._inputs import device_of
    from tformer.commands.benchmarking import device as device_workloads
    from tformer.commands.benchmarking import rows, workloads
    from tformer.commands.benchmarking.harness import machine_info

    if args.list:
        print("\n".join(workloads.names() + list(device_workloads.NAMES)))
        return 0
    device = device_of(args)
    # The device workloads on a GPU, or when named; the CPU suite otherwise.
    on_device = device.type != "cpu" or bool(args.only and set(args.only) <= set(device_workloads.NAMES))
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")
    warnings.filterwarnings("ignore", message=".*enable_nested_tensor is True.*")
    if args.model_dir is not None and not (Path(args.model_dir) / "config.json").is_file():
        raise FileNotFoundError(f"--model-dir {args.model_dir}: expected a model directory with a "
                                "config.json, found none")
    if args.json:  # refused now, not after minutes of measuring
        from tformer.commands.benchmarking.harness import is_bench_json
        from tformer.storage.files import refuse_foreign

        refuse_foreign(Path(args.json), "--json", is_bench_json,
                       "a results file `tformer bench --json` wrote")
    settings = workloads.Settings(quick=args.quick, rounds=args.rounds, threads=args.threads,
                                  contenders=args.contenders, model_dir=args.model_dir, tf32=args.tf32)
    start = time.perf_counter()

    def progress(name: str) -> None:
        print(f"[{time.perf_counter() - start:5.0f}s] {name}", file=sys.stderr, flush=True)

    if on_device:
        unknown = sorted(set(args.only or []) - set(device_workloads.NAMES))
        if unknown:
            raise ValueError(f"--only: on {device} expected workloads from "
                             f"{', '.join(device_workloads.NAMES)}, got {', '.join(unknown)}")
    # Stopped by Ctrl-C, or by SIGTERM (`timeout`, a job scheduler; tformer.commands.cli takes it as Ctrl-C),
    # the report holds the workloads that finished.
    if on_device:
        report = device_workloads.run(settings, device, args.only, progress)
    else:
        report = workloads.run(settings, args.only, progress)
    report.machine = machine_info(args.threads)
    report.machine["mode"] = "quick (tiny sizes: timings mean nothing)" if args.quick else "full"
    if on_device:
        from tformer.nn.devices import describe

        report.machine["mode"] += f" on {describe(device)}"
    report.machine["seconds"] = round(time.perf_counter() - start)
    report.notes.append(
        f"paired t / t_tformer: median over rounds of each contender's time over the workload's first "
        f"row's time in the same round (> 1: the first row is faster). Outputs checked before timing: "
        f"fp32 max abs diff <= {rows.TOLERANCE:.0e} at real tokens; bf16 min cosine >= "
        f"{workloads.BF16_COSINE}. cores = process CPU time / wall time (below the thread count: the "
        f"machine was busy, and the ratios are noisy).")
    print(report.to_markdown())
    from tformer.nn.kernels import autotune  # the decisions the workloads' training steps measured

    choices = autotune.summary(device=device)
    print(f"\nKernel choices measured on this device ({autotune.cache_path()}):")
    print("\n".join(f"- {line}" for line in choices) or "- none yet (no training step ran)")
    if args.json:
        from tformer.storage.files import write_atomic

        write_atomic(args.json, (report.to_json() + "\n").encode())
    if report.stopped_by is not None:  # the command's one line: Ctrl-C's (130) or SIGTERM's (143)
        raise report.stopped_by
    return 0
