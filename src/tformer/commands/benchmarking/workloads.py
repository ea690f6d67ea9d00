"""The workloads of issue 5: each builds its contenders with the same weights, checks their outputs
against tformer's, times them interleaved, and returns table rows and targets.

Sizes (fp32, 4-layer stacks): small = d 256, 4 heads, ff 1024; base = BERT-base width, d 768,
12 heads, ff 3072. ``--quick`` shrinks every size (a CI smoke test: it checks the plumbing, and
its timings mean nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import torch

from tformer.commands.benchmarking import models as M
from tformer.commands.benchmarking import runtimes
from tformer.commands.benchmarking.decode_peers import decoding as decoding_vs_peers
from tformer.commands.benchmarking.decoding import decode
from tformer.commands.benchmarking.harness import Report, Row, Target, measure, paired_ratio, run_workloads
from tformer.commands.benchmarking.roofline import gemm_throughput
from tformer.commands.benchmarking.rows import Settings, checked, timed_rows
from tformer.commands.benchmarking.training import training
from tformer.config.sizes import flops_per_token
from tformer.nn.kernels.machine import NO_BF16, has_bf16
from tformer.nn.model import Encoder

BF16_COSINE = 0.999  # bf16 vs fp32: smallest per-token cosine similarity


# GEMM roofline (tformer.commands.benchmarking.roofline) ----------------------------------------------
def gemm(s: Settings) -> Report:
    report = Report()
    for width, tokens in dict.fromkeys(_dense_shapes(s)):
        d, _, f = (M.QUICK_WIDTHS if s.quick else M.WIDTHS)[width]
        for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))[: 2 if has_bf16() else 1]:
            for name, gflops in gemm_throughput(d, f, tokens, s.threads, dtype).items():
                if name != "best":
                    report.rows.append(Row(f"gemm-{width}-{tokens}tok", f"{name} {label}",
                                           note=f"{gflops:.0f} GFLOP/s"))
    report.notes.append(
        "GEMM rows: GFLOP/s over one layer's four projections (qkv, out, up, down) at that many rows, "
        "fastest of 7 rounds. Roofline = the faster of torch.mm (MKL) and oneDNN per shape, fp32; a "
        "contender's fraction = its matmul FLOPs (tformer.config.sizes.flops_per_token, attention products "
        "included) / time / roofline.")
    if not has_bf16():
        report.notes.append(NO_BF16 + ": no bf16 GEMM rows")
    return report


def _dense_shapes(s: Settings) -> list[tuple[str, int]]:
    return [("small", 4 * 16 if s.quick else 32 * 64), ("base", 2 * 32 if s.quick else 8 * 128),
            ("base", 64 if s.quick else 512)]


# Inference -----------------------------------------------------------------------------------------
def inference(s: Settings, name: str, width: str, batch: int, seq: int, padded: bool = False,
              norm_first: bool = False, numpy: bool = False, rounds: int = 7, targets=()) -> Report:
    report = Report()
    config = M.bert_config(width, s.quick, norm_first)
    torch.manual_seed(0)
    enc = Encoder(config).eval()
    ids, mask = M.inputs(config, batch, seq, padded)
    tokens = int(mask.sum()) if mask is not None else batch * seq
    runs: dict[str, Callable] = {
        "tformer": M.tformer(enc)}
    if not numpy:  # the NumPy workload compares with HF and the floor only
        nn_name = "torch.nn fast path" + (" (nested)" if padded and not norm_first else "")
        runs[nn_name] = M.torch_nn(enc, M.torch_nn_stack(enc))
    # HF BERT is post-norm only: a pre-norm workload times it on a post-norm twin (same FLOPs).
    twin = enc
    if norm_first:
        twin = Encoder(config.replace(norm_first=False, final_norm=False)).eval()
        twin.load_state_dict({k: v for k, v in enc.state_dict().items() if "final_norm" not in k})
    hf = M.hf_bert_model(twin)
    hf_name = "HF BertModel sdpa" + (" (post-norm twin)" if norm_first else "")
    if hf is None:
        report.notes.append("transformers is not installed: HF BertModel skipped (pip install tformer[hf])")
    else:
        runs[hf_name] = M.hf_bert(hf)
    if numpy:
        runs["tformer NumPy reference (fp32)"] = M.numpy_reference(enc)
        runs["NumPy tutorial floor (fp64)"] = M.numpy_floor(enc)
    with torch.inference_mode():
        outputs = {n: run(ids, mask) for n, run in runs.items()}
        expected = {n: outputs[next(iter(runs))] for n in runs}
        if norm_first and hf is not None:  # the post-norm twin is checked against tformer's twin
            expected[hf_name] = twin(ids, mask).last_hidden_state
        runs = checked(report, name, runs, outputs, expected, mask)
        timings = measure({n: (lambda run=run: run(ids, mask)) for n, run in runs.items()},
                          s.n_rounds(rounds), pause=0.15 if numpy and not s.quick else 0.0)
    flops = roofline = None
    if not padded and not s.quick:  # a roofline of microsecond GEMMs would mean nothing
        flops = flops_per_token(config, seq) * batch * seq
        roofline = gemm_throughput(config.d_model, config.d_ff, batch * seq, s.threads)["best"] * 1e9
    report.rows += timed_rows(name, timings, tokens, flops, roofline)
    first = next(iter(timings))
    for peer, threshold in targets:
        if peer == "roofline":
            row = next(r for r in report.rows if r.workload == name and r.contender == first)
            report.targets.append(Target(name, f"tformer >= {threshold:.0%} of the GEMM roofline",
                                         row.roofline, threshold, unit=""))
            continue
        subject, peer = peer if isinstance(peer, tuple) else (first, peer)
        peer_name = next((n for n in timings if n.startswith(peer)), None)
        subject_name = next((n for n in timings if n.startswith(subject)), None)
        ratio = (paired_ratio(timings[peer_name], timings[subject_name])
                 if peer_name and subject_name else None)
        report.targets.append(Target(name, f"{subject_name or subject} >= {threshold}x the speed of "
                                           f"{peer_name or peer}", ratio, threshold))
    if padded:
        report.notes.append(
            "padded workloads: half the sequences hold S/4 real tokens; tokens/s counts real tokens; "
            "outputs compared at real tokens only. torch.nn skips padding (nested tensors) for "
            "post-norm only.")
    return report


# bf16 --------------------------------------------------------------------------------------------
def bf16(s: Settings) -> Report:
    name, report = "bf16-base", Report()
    if not has_bf16():  # oneDNN's bf16 linear fails (or emulates slowly) without them
        report.rows.append(Row(name, "tformer bf16", note="skipped: " + NO_BF16))
        return report
    batch, seq = (2, 32) if s.quick else (8, 128)
    config = M.bert_config("base", s.quick)
    torch.manual_seed(0)
    enc = Encoder(config).eval()
    enc16 = Encoder(config).eval()
    enc16.load_state_dict(enc.state_dict())
    enc16.to(torch.bfloat16)
    ids, _ = M.inputs(config, batch, seq, padded=False)
    runs = {"tformer bf16": M.tformer(enc16), "tformer fp32": M.tformer(enc)}
    nn16 = M.torch_nn_stack(enc16)
    runs["torch.nn fast path bf16"] = M.torch_nn(enc16, nn16)
    hf = M.hf_bert_model(enc16)
    if hf is not None:
        runs["HF BertModel sdpa bf16"] = M.hf_bert(hf)
    runs["torch.nn fast path fp32"] = M.torch_nn(enc, M.torch_nn_stack(enc))  # what users run today
    with torch.inference_mode():
        outputs = {n: run(ids, None) for n, run in runs.items()}
        reference = outputs["tformer fp32"]
        cosines = {n: M.min_cosine(out.float(), reference, None) for n, out in outputs.items()}
        timings = measure({n: (lambda run=run: run(ids, None)) for n, run in runs.items()},
                          s.n_rounds(7))
    report.rows += timed_rows(name, timings, batch * seq)
    for row in report.rows:
        row.note = f"min cosine vs fp32 {cosines[row.contender]:.5f}"
    report.targets.append(Target(name, "tformer bf16 >= 2.5x the speed of tformer fp32",
                                 paired_ratio(timings["tformer fp32"], timings["tformer bf16"]), 2.5))
    report.notes.append("bf16: tformer bf16 is timed against tformer fp32 (the target) and against the "
                        "peers in bf16 and torch.nn in fp32; the gemm rows give the bf16/fp32 GEMM ratio.")
    report.targets.append(Target(name, f"tformer bf16 last-hidden-state cosine vs fp32 >= {BF16_COSINE}",
                                 cosines["tformer bf16"], BF16_COSINE, unit=""))
    return report


# Training ----------------------------------------------------------------------------------------
# Memory at long sequences ------------------------------------------------------------------------
def memory(s: Settings) -> Report:
    report = Report()
    lengths = [256, 512] if s.quick else [1024, 4096, 8192, 16384]
    cmd = [sys.executable, "-m", "tformer.commands.benchmarking.memory", "--threads", str(s.threads),
           "--lengths", *map(str, lengths)] + (["--quick"] if s.quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        report.notes.append(f"memory: the measuring process failed: {proc.stderr.strip()[-300:]}")
        return report
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for r in results:
        report.rows.append(Row(f"memory-{r['seq']}", r["contender"], r.get("seconds", 0) * 1e3
                               if "seconds" in r else None, None,
                               r["seq"] / r["seconds"] if r.get("seconds") else None,
                               peak_mib=r.get("peak_mib"), note=r.get("note", "")))
    longest = max(lengths)
    mine = next((r for r in results if r["seq"] == longest and r["contender"].startswith("tformer")),
                None)
    report.targets.append(Target(f"memory-{longest}", "tformer one layer: peak RSS growth <= 300 MiB",
                                 mine.get("peak_mib") if mine else None, 300.0, higher_is_better=False,
                                 unit=" MiB"))
    report.notes.append("memory: one small-width layer (d 256), batch 1, inference, one call each in a "
                        "fresh process; peak RSS growth = VmHWM after - VmRSS before (peak reset "
                        "through /proc/self/clear_refs).")
    return report


# The suite ---------------------------------------------------------------------------------------
def suite(s: Settings) -> dict[str, Callable[[], Report]]:
    """Workload name -> a function producing its report, in running order."""
    q = s.quick
    small, base, base1 = ((4, 16), (2, 32), (1, 64)) if q else ((32, 64), (8, 128), (1, 512))
    work: dict[str, Callable[[], Report]] = {"gemm": lambda: gemm(s)}
    work["dense-small"] = lambda: inference(s, "dense-small", "small", *small,
                                            targets=[("torch.nn", 1.15), ("HF", 1.0)])
    work["dense-base"] = lambda: inference(s, "dense-base", "base", *base,
                                           targets=[("torch.nn", 1.0), ("HF", 1.0)])
    # Its own workload, with fewer rounds: the float64 floor takes seconds per call.
    work["numpy-base"] = lambda: inference(
        s, "numpy-base", "base", *base, numpy=True, rounds=3,
        targets=[(("tformer NumPy", "NumPy tutorial"), 3.0), (("tformer NumPy", "HF"), 0.75)])
    work["dense-base-512"] = lambda: inference(s, "dense-base-512", "base", *base1,
                                               targets=[("torch.nn", 1.0), ("HF", 1.0), ("roofline", 0.8)])
    for width, shape in (("small", small), ("base", base)):
        for norm in ("post", "pre"):
            key = f"padded-{width}-{norm}"
            work[key] = (lambda key=key, width=width, shape=shape, norm=norm: inference(
                s, key, width, *shape, padded=True, norm_first=norm == "pre",
                targets=[("HF", 1.4), ("torch.nn", 1.15)]))
    work["bf16"] = lambda: bf16(s)
    work["sentences-minilm"] = lambda: runtimes.sentences(s)  # against the deployment runtimes
    work["mixed-base"] = lambda: runtimes.mixed_base(s)
    work["train-small"] = lambda: training(s, "train-small", "small", *small)
    work["train-base"] = lambda: training(s, "train-base", "base", *base)
    work["decode"] = lambda: decode(s)
    for shape in ("marian", "default"):  # greedy and beam against HF generate, same weights
        work[f"decode-{shape}"] = lambda shape=shape: decoding_vs_peers(s, shape)
    work["memory"] = lambda: memory(s)
    return work


def names() -> list[str]:
    return list(suite(Settings()))


def run(s: Settings, only: list[str] | None = None, progress: Callable[[str], None] | None = None) -> Report:
    work = suite(s)
    unknown = sorted(set(only or []) - set(work))
    if unknown:
        raise ValueError(f"--only: unknown workload(s) {', '.join(unknown)}; known: {', '.join(work)}")
    report = run_workloads(((key, fn) for key, fn in work.items() if not only or key in only), progress)
    if s.quick:
        for target in report.targets:
            target.not_judged = "n/a (--quick sizes)"
    return report

