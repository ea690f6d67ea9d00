"""The training workload: forward + backward + AdamW step, tformer against HF BertModel and
torch.nn with the same weights, checked first (same loss and gradient norm in eval mode)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from tformer.commands.benchmarking import models as M
from tformer.commands.benchmarking.harness import Report, Row, Target, measure, paired_ratio
from tformer.commands.benchmarking.roofline import gemm_throughput
from tformer.commands.benchmarking.rows import Settings, timed_rows
from tformer.config import TransformerConfig
from tformer.config.sizes import flops_per_token
from tformer.nn.kernels.machine import NO_BF16, has_bf16
from tformer.nn.model import Encoder


def _adamw(params, fused: bool) -> torch.optim.Optimizer:
    if fused:
        try:
            return torch.optim.AdamW(params, lr=1e-4, fused=True)
        except (RuntimeError, TypeError):  # a torch without fused CPU AdamW: the foreach kernels
            return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    return torch.optim.AdamW(params, lr=1e-4)


def training(s: Settings, name: str, width: str, batch: int, seq: int) -> Report:
    report = Report()
    config = M.bert_config(width, s.quick, dropout=0.1)
    torch.manual_seed(0)
    enc = Encoder(config)
    ids, _ = M.inputs(config, batch, seq, padded=False)
    models: dict[str, tuple[torch.nn.Module, Callable, bool]] = {}
    models["tformer (fused AdamW)"] = (enc, M.tformer(enc), True)
    enc2 = Encoder(config)
    enc2.load_state_dict(enc.state_dict())
    models["tformer (default AdamW)"] = (enc2, M.tformer(enc2), False)
    hf = M.hf_bert_model(enc)
    if hf is not None:
        models["HF BertModel sdpa (default AdamW)"] = (hf, M.hf_bert(hf), False)
        hf2 = M.hf_bert_model(enc)
        models["HF BertModel sdpa (fused AdamW)"] = (hf2, M.hf_bert(hf2), True)  # the same optimizer
    else:
        report.notes.append("transformers is not installed: HF BertModel skipped (pip install tformer[hf])")
    enc3 = Encoder(config)
    enc3.load_state_dict(enc.state_dict())
    stack = M.torch_nn_stack(enc3)
    nn_model = torch.nn.ModuleDict({"embed": enc3, "stack": stack})  # enc3's layers stay unused
    models["torch.nn (default AdamW)"] = (nn_model, M.torch_nn(enc3, stack), False)

    def loss_of(run, autocast=False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return run(ids, None).float().square().mean()

    # Check: in eval mode (no dropout) every contender has the same loss and gradient norm.
    norms, losses = {}, {}
    for n, (model, run, _) in models.items():
        model.eval()
        model.zero_grad()
        loss = loss_of(run)
        loss.backward()
        losses[n] = float(loss.detach())
        norms[n] = float(torch.sqrt(sum(p.grad.square().sum() for p in model.parameters()
                                        if p.grad is not None)))
        model.zero_grad(set_to_none=True)
        model.train()
    first = next(iter(models))
    steps = {}
    for n, (model, run, fused) in models.items():
        rel = abs(norms[n] / norms[first] - 1) + abs(losses[n] / losses[first] - 1)
        if rel > 1e-4:
            report.rows.append(Row(name, n, note=f"not timed: loss/gradient norm differ (rel {rel:.1e})"))
            continue
        # bf16 autocast (fp32 master weights), like for like: tformer and HF, both fused AdamW
        for autocast in (False, True) if fused and has_bf16() else (False,):
            opt = _adamw([p for p in model.parameters() if p.requires_grad], fused)

            def step(run=run, opt=opt, autocast=autocast):
                loss_of(run, autocast).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            steps[n + (", bf16 autocast" if autocast else "")] = step
    if not has_bf16():
        report.notes.append(NO_BF16 + ": no bf16 autocast training rows")
    timings = measure(steps, s.n_rounds(5))
    report.rows += timed_rows(name, timings, batch * seq)
    if not s.quick:  # a roofline of microsecond GEMMs would mean nothing
        _gemm_floor(report, name, config, batch, seq, s.threads)
    for suffix in ("", ", bf16 autocast"):
        ours, hf_name = first + suffix, "HF BertModel sdpa (fused AdamW)" + suffix
        if suffix and ours not in timings:
            continue
        report.targets.append(Target(name, f"{ours} >= 1.25x the tokens/s of {hf_name}",
                                     paired_ratio(timings[hf_name], timings[ours])
                                     if hf_name in timings and ours in timings else None, 1.25))
    report.notes.append("training: forward + backward + AdamW step, dropout 0.1 (hidden and attention), "
                        "loss = mean(h^2); checked first in eval mode: same loss and gradient norm "
                        "(rel 1e-4). torch.nn gets tformer's embeddings.")
    return report


def _gemm_floor(report: Report, name: str, config: TransformerConfig, batch: int, seq: int,
                threads: int) -> None:
    """Each row's share of the GEMM roofline, and the floor it sets: a step's matrix products
    (forward, input gradient, weight gradient: 3x the forward's FLOPs, attention's included) at
    the fastest measured GEMM throughput for the layer's shapes, fp32 or bf16 as the row computes.
    No implementation's step is faster than its floor, so HF's time / the floor bounds the ratio
    any could reach over HF here."""
    flops = 3.0 * flops_per_token(config, seq) * batch * seq
    floors = {}
    for row in report.rows:
        if row.workload != name or row.median_ms is None:
            continue
        dtype = torch.bfloat16 if "bf16" in row.contender else torch.float32
        if dtype not in floors:
            best = gemm_throughput(config.d_model, config.d_ff, batch * seq, threads, dtype)["best"]
            floors[dtype] = flops / (best * 1e9) * 1e3  # ms
        row.roofline = floors[dtype] / row.median_ms
    for dtype, floor in floors.items():
        label = "bf16" if dtype == torch.bfloat16 else "fp32"
        hf = next((r for r in report.rows if r.workload == name and r.median_ms
                   and r.contender.startswith("HF BertModel sdpa (fused AdamW)")
                   and (("bf16" in r.contender) == (dtype == torch.bfloat16))), None)
        bound = f"; HF (fused AdamW) / floor = {hf.median_ms / floor:.2f}x, the most any " \
                "implementation could gain over it here" if hf else ""
        report.notes.append(f"{name}: GEMM floor {label} {floor:.0f} ms a step ({flops / 1e9:.0f} "
                            f"GFLOP of matrix products at the measured {label} roofline){bound}.")
