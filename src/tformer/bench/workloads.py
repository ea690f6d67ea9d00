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
from dataclasses import dataclass

import torch

from tformer.bench import models as M
from tformer.bench import runtimes
from tformer.bench.decode_peers import decoding as decoding_vs_peers
from tformer.bench.harness import NO_BF16, Report, Row, Target, Timing, has_bf16, measure, paired_ratio
from tformer.model import Encoder, Seq2SeqTransformer
from tformer.stats import flops_per_token

TOLERANCE = 1e-4  # fp32 max abs diff at real tokens between contenders (the tests hold 1e-5 at tiny sizes)
BF16_COSINE = 0.999  # bf16 vs fp32: smallest per-token cosine similarity


@dataclass
class Settings:
    quick: bool = False
    rounds: int | None = None  # None: each workload's default
    threads: int = 2
    contenders: list[str] | None = None  # peer workloads: only contenders whose name starts so

    def n_rounds(self, full: int) -> int:
        return self.rounds if self.rounds is not None else (2 if self.quick else full)


# Shared pieces -------------------------------------------------------------------------------------
def _timed_rows(workload: str, timings: dict[str, Timing], tokens: int,
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


def _checked(report: Report, workload: str, runs: dict[str, Callable], outputs: dict[str, object],
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


# GEMM roofline ---------------------------------------------------------------------------------------
_ROOFLINE: dict[tuple, dict[str, float]] = {}


def gemm_throughput(d: int, f: int, tokens: int, threads: int,
                    dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """GFLOP/s over one encoder layer's four matrix multiplies (qkv, out, up, down) at `tokens` rows,
    through torch.mm (MKL for float32) and through oneDNN's linear; "best" takes the faster per
    shape. A roofline is what the hardware can do, so each shape counts its fastest round."""
    key = (d, f, tokens, threads, dtype)
    if key in _ROOFLINE:
        return _ROOFLINE[key]
    shapes = [(d, 3 * d), (d, d), (d, f), (f, d)]  # (in, out)
    total = {"torch.mm": 0.0, "oneDNN linear": 0.0, "best": 0.0}
    flops = 0.0
    with torch.inference_mode():
        for d_in, d_out in shapes:
            x = torch.randn(tokens, d_in, dtype=dtype)
            w = (torch.randn(d_out, d_in) * d_in**-0.5).to(dtype)
            fns = {"torch.mm": lambda x=x, w=w: torch.mm(x, w.t())}
            if M.onednn_linear(dtype):
                fns["oneDNN linear"] = lambda x=x, w=w: M.onednn_matmul(x, w)
            timings = measure(fns, rounds=7, warmup=2)
            fastest = {name: min(t.wall) for name, t in timings.items()}
            for name, secs in fastest.items():
                total[name] += secs
            total["best"] += min(fastest.values())
            flops += 2.0 * tokens * d_in * d_out
    result = {name: flops / secs / 1e9 for name, secs in total.items() if secs}
    _ROOFLINE[key] = result
    return result


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
        "contender's fraction = its matmul FLOPs (tformer.stats.flops_per_token, attention products "
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
        runs = _checked(report, name, runs, outputs, expected, mask)
        timings = measure({n: (lambda run=run: run(ids, mask)) for n, run in runs.items()},
                          s.n_rounds(rounds), pause=0.15 if numpy and not s.quick else 0.0)
    flops = roofline = None
    if not padded and not s.quick:  # a roofline of microsecond GEMMs would mean nothing
        flops = flops_per_token(config, seq) * batch * seq
        roofline = gemm_throughput(config.d_model, config.d_ff, batch * seq, s.threads)["best"] * 1e9
    report.rows += _timed_rows(name, timings, tokens, flops, roofline)
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
    report.rows += _timed_rows(name, timings, batch * seq)
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
    report.rows += _timed_rows(name, timings, batch * seq)
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


# Decoding ----------------------------------------------------------------------------------------
def _greedy(model: Seq2SeqTransformer, src: torch.Tensor, steps: int, use_cache: bool) -> torch.Tensor:
    """Greedy decoding of `steps` tokens (no early stop), with the KV cache or recomputing the prefix."""
    memory = model.encode(src).last_hidden_state  # (B, S, D)
    ys = torch.ones(src.size(0), 1, dtype=torch.long)  # BOS = 1
    past = None
    for _ in range(steps):
        if use_cache:
            out = model.decode(ys[:, -1:], memory if past is None else None, past_key_values=past,
                               use_cache=True)
            past = out.past_key_values
        else:
            out = model.decode(ys, memory)
        ys = torch.cat([ys, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ys


def decode(s: Settings) -> Report:
    name, report = "decode-small", Report()
    d, h, f = (M.QUICK_WIDTHS if s.quick else M.WIDTHS)["small"]
    config = M.bert_config("small", s.quick).replace(
        positional="sinusoidal", type_vocab_size=0, embedding_norm=False, scale_embeddings=True,
        activation="relu", layer_norm_eps=1e-5)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(config).eval()
    batch, src_len, steps = (2, 8, 16) if s.quick else (4, 32, 128)
    src, _ = M.inputs(config, batch, src_len, padded=False)
    with torch.inference_mode():
        cached, full = _greedy(model, src, steps, True), _greedy(model, src, steps, False)
        same = bool((cached == full).all())
        runs = {"tformer KV cache": lambda: _greedy(model, src, steps, True),
                "tformer recompute prefix": lambda: _greedy(model, src, steps, False)}
        timings = measure(runs, s.n_rounds(3), warmup=0)
    report.rows += _timed_rows(name, timings, batch * steps)
    report.rows[-1].note = report.rows[-2].note = (
        f"{steps} tokens x batch {batch}, source {src_len}; identical tokens: {same}")
    report.targets.append(Target(name, f"KV cache >= 3x the speed of recomputing the prefix "
                                       f"({steps} tokens)",
                                 paired_ratio(timings["tformer recompute prefix"],
                                              timings["tformer KV cache"]), 3.0))
    return report


# Memory at long sequences ------------------------------------------------------------------------
def memory(s: Settings) -> Report:
    report = Report()
    lengths = [256, 512] if s.quick else [1024, 4096, 8192, 16384]
    cmd = [sys.executable, "-m", "tformer.bench.memory", "--threads", str(s.threads),
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
    report = Report()
    for key, fn in work.items():
        if only and key not in only:
            continue
        if progress:
            progress(key)
        report.extend(fn())
    if s.quick:
        for target in report.targets:
            target.not_judged = "n/a (--quick sizes)"
    return report

