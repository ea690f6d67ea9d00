"""The device workloads: tformer against its peers on one device (a GPU), same weights, each call
timed to its end there (tformer.nn.devices.synchronize).

- ``device-train``: a training step of a BERT-base encoder (12 layers, d 768; batch 32 x 128,
  dropout 0.1): forward, backward, fused AdamW, against HF BertModel with sdpa attention; fp32
  and 16-bit autocast (bf16, or fp16 with a GradScaler on a GPU without bf16), each checked first
  (same loss and gradient norm in eval mode); with ``--tf32`` fp32 in TF32 too (both libraries,
  where the GPU has it). On a GPU also tformer's 16-bit step compiled (torch.compile) at that
  batch and at 4x it, its compilation timed apart. Each row's MFU (benchmarking.mfu) is in the
  GEMM roofline column; the target: >= 40% of the chip's bf16 peak.
- ``device-sentences``: sentence embeddings of 2,048 real texts of 3..230 tokens with a model of
  all-MiniLM-L6-v2's shape (random weights, or --model-dir), tokenization included, batches of
  32 (both libraries' default), against sentence-transformers on the same directory; fp32, and
  each library's 16-bit mode (tformer --dtype bf16; sentence-transformers' model in bf16); and
  ONNX Runtime's CUDA provider (fp32) where onnxruntime-gpu is installed.

    tformer bench --device cuda     # these two (the CPU workloads run with --device cpu)

Both also run on the CPU when named (``--only device-train``): what CI checks of their plumbing.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from tformer.commands.benchmarking import corpus
from tformer.commands.benchmarking import models as M
from tformer.commands.benchmarking.harness import Report, Row, Target, measure, paired_ratio, run_workloads
from tformer.commands.benchmarking.mfu import mfu, peak_bf16
from tformer.commands.benchmarking.rows import Settings, timed_rows
from tformer.config.sizes import flops_per_token
from tformer.nn.devices import half_dtype, half_name, synchronize
from tformer.nn.kernels.compiling import mode as compile_mode
from tformer.nn.kernels.compiling import why_not_compiled
from tformer.nn.kernels.tf32 import tf32, why_not_tf32
from tformer.nn.model import Encoder
from tformer.nn.precision import why_not_bf16

NAMES = ("device-train", "device-sentences")
SENTENCE_BATCH = 32  # SentenceEncoder.encode's and sentence-transformers' default
MIN_COSINE = 0.999  # tformer's 16-bit rows against tformer fp32
# sentence-transformers' 16-bit mode casts the whole model, LayerNorm and softmax included, where
# tformer's keeps them in fp32: on random weights its min cosine is about 0.998 (measured on an
# H200). The check proves the same model (another model's cosine is near 0); each 16-bit row's
# note gives its min cosine, so the two modes' accuracy shows beside their speed.
PEER_MIN_COSINE = 0.99


def run(s: Settings, device: torch.device, only: list[str] | None,
        progress: Callable[[str], None] | None = None) -> Report:
    work = (("device-train", train_step), ("device-sentences", sentences))
    report = run_workloads(((name, partial(fn, s, device)) for name, fn in work if not only or name in only),
                           progress)
    if s.quick:
        for target in report.targets:
            target.not_judged = "n/a (--quick sizes)"
    return report


def _synchronized(device: torch.device, call: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        out = call()
        synchronize(device)  # a GPU call returns when queued; its time ends when it has run
        return out

    return run


# Training ----------------------------------------------------------------------------------------
COMPILED_BATCHES = (1, 4, 8)  # the compiled bf16 step at the plan's batch, 4x and 8x it (MFU)


def train_step(s: Settings, device: torch.device) -> Report:
    report, name = Report(), "device-train"
    batch, seq = (2, 16) if s.quick else (32, 128)
    config = M.bert_config("base", s.quick, n_layers=12, dropout=0.1)
    torch.manual_seed(0)
    encoder = Encoder(config)
    hf = M.hf_bert_model(encoder)
    if hf is None:
        report.notes.append("transformers is not installed: HF BertModel skipped (pip install tformer[hf])")
    models = {"tformer": (encoder, M.tformer(encoder))}
    if hf is not None:
        models["HF BertModel sdpa"] = (hf, M.hf_bert(hf))
    ids = M.inputs(config, batch, seq, padded=False)[0].to(device)
    # 16-bit rows where the device computes them natively (fp16 on a GPU without bf16)
    native = device.type == "cuda" or why_not_bf16(device) is None
    half = half_dtype(device) if native else None
    tf32_rows = s.tf32 and why_not_tf32(device) is None
    if s.tf32 and not tf32_rows:
        report.notes.append(f"{name}: --tf32: no TF32 rows: {why_not_tf32(device)}")

    def loss_of(run, autocast: bool, x=ids) -> torch.Tensor:
        with torch.autocast(device.type, dtype=half, enabled=autocast):
            return run(x, None).float().square().mean()

    norms, losses = {}, {}
    for n, (model, run) in models.items():  # checked in eval mode: no dropout draws to differ
        model.to(device).eval().zero_grad()
        loss = loss_of(run, False)
        loss.backward()
        losses[n] = float(loss.detach())
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norms[n] = float(torch.sqrt(sum(g.square().sum() for g in grads)))
        model.zero_grad(set_to_none=True)
        model.train()
    steps, tokens_of, notes = {}, {}, {}
    for n, (model, run) in models.items():
        rel = abs(norms[n] / norms["tformer"] - 1) + abs(losses[n] / losses["tformer"] - 1)
        if rel > 1e-4:
            report.rows.append(Row(name, n, note=f"not timed: loss/gradient norm differ (rel {rel:.1e})"))
            continue
        variants = [("fp32", False, False)] + ([("fp32 + TF32", False, True)] if tf32_rows else [])
        variants += [(f"{half_name(device)} autocast", True, False)] if half is not None else []
        for precision, autocast, allow_tf32 in variants:
            label = f"{n}, {precision}"
            steps[label] = _synchronized(device, _step(model, partial(loss_of, run, autocast), device,
                                                       half if autocast else None, allow_tf32))
            tokens_of[label] = batch * seq
    gpu = device.type == "cuda"
    # tformer's bf16 step compiled (torch.compile, inductor), at the plan's batch and larger:
    # a GPU step of this size is bound by its launches (docs/gpu.md), which compiling fuses away.
    why_not = why_not_compiled(device) or (None if gpu or compile_mode() == "on" else
                                           "on a CPU only with TFORMER_COMPILE=1 (minutes to compile)")
    compiled = half is not None and "tformer" in models and why_not is None
    if half is not None and not compiled:
        report.notes.append(f"{name}: no compiled rows: {why_not}")
    for times in COMPILED_BATCHES if compiled else ():
        label = f"tformer, {half_name(device)} autocast, compiled"
        label += f", batch {batch * times}" if times > 1 else ""
        big = ids.repeat(times, 1)
        fast = torch.compile(encoder)
        step = _step(encoder, partial(loss_of, M.tformer(fast), True, x=big), device, half, False)
        t = time.perf_counter()
        step()  # the compilation: timed apart from the steps
        synchronize(device)
        notes[label] = f"first call (compiling) {time.perf_counter() - t:.1f} s, not in the median"
        steps[label] = _synchronized(device, step)
        tokens_of[label] = batch * seq * times
    # a GPU step is ~20 ms and its launches jitter: more rounds, and warm-ups to raise the clocks
    timings = measure(steps, s.n_rounds(30 if gpu else 10), warmup=5 if gpu else 2)
    report.rows += timed_rows(name, timings, batch * seq)
    flops_per_step = 3.0 * flops_per_token(config, seq)  # per token: forward and both gradients
    peak, source = peak_bf16(device) if gpu and half is not None else (None, "")
    for row in report.rows:
        if row.workload != name or row.median_ms is None:
            continue
        row.tokens_per_s = tokens_of[row.contender] / row.median_ms * 1e3
        parts = [notes[row.contender]] if row.contender in notes else []
        if peak:
            row.roofline = mfu(flops_per_step * tokens_of[row.contender], row.median_ms / 1e3, peak)
            parts.insert(0, f"MFU {row.roofline:.0%}")
        row.note = "; ".join(parts)
    for precision in ("fp32", "fp32 + TF32", f"{half_name(device)} autocast")[: 3 if half is not None else 2]:
        ours, theirs = f"tformer, {precision}", f"HF BertModel sdpa, {precision}"
        if ours in timings:
            report.targets.append(Target(name, f"{ours} >= 1.1x the tokens/s of {theirs}",
                                         paired_ratio(timings[theirs], timings[ours])
                                         if theirs in timings else None, 1.1))
    best = max((r for r in report.rows if r.workload == name and r.roofline is not None
                and r.contender.startswith("tformer") and "autocast" in r.contender),
               key=lambda r: r.roofline, default=None)
    if peak:
        report.targets.append(Target(name, f"tformer {half_name(device)} training >= 40% of the chip's peak "
                                           f"(MFU; best row: {best.contender if best else '-'})",
                                     best.roofline if best else None, 0.4, unit=""))
        report.notes.append(f"{name}: MFU (the GEMM roofline column) = {flops_per_step / 1e9:.2f} GFLOP of "
                            f"matrix products per token x tokens / time / peak; peak: {source}.")
    report.notes.append(
        f"{name}: BERT-base {config.n_layers} layers x d {config.d_model}, {batch} x {seq} tokens, dropout "
        "0.1; forward + backward + fused AdamW (both), loss = mean(h^2); on " + _device_note(device))
    return report


def _step(model: torch.nn.Module, loss: Callable[[], torch.Tensor], device: torch.device,
          half: torch.dtype | None, allow_tf32: bool) -> Callable[[], None]:
    """One update of `model`: loss(), backward, fused AdamW (a GradScaler for fp16)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler(device.type) if half == torch.float16 else None

    def step() -> None:
        with tf32(device, allow_tf32):
            value = loss()
            (scaler.scale(value) if scaler else value).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    return step


# Sentences ---------------------------------------------------------------------------------------
def sentences(s: Settings, device: torch.device) -> Report:
    from tformer.embeddings.sentence import SentenceEncoder
    from tformer.text.tokenizer import load_tokenizer

    report, name = Report(), "device-sentences"
    n, max_tokens = (48, 60) if s.quick else (2048, 230)
    with tempfile.TemporaryDirectory(prefix="tformer-bench-") as tmp:
        work = Path(tmp)
        if s.model_dir:
            model_dir, weights = Path(s.model_dir), f"{s.model_dir} (trained weights)"
        else:
            corpus.write_vocab(work / "vocab", corpus.paragraphs())
            model_dir = corpus.write_bert(work / "model", "tiny" if s.quick else "minilm", work / "vocab")
            corpus.write_sentence_layout(model_dir)
            shape = corpus.SHAPES["tiny" if s.quick else "minilm"]
            weights = f"all-MiniLM-L6-v2's shape {shape}, random weights"
        tokenizer = load_tokenizer(model_dir)
        texts = corpus.sentences(n, 3, max_tokens, lambda t: tokenizer.lengths([t])[0])
        tokens = sum(tokenizer.lengths(texts))
        # tformer's 16-bit inference mode, where the device computes bf16 natively
        half = "bf16" if why_not_bf16(device) is None else None
        encoders: dict[str, Callable[[], np.ndarray]] = {}
        for precision in ("fp32",) + ((half,) if half else ()):
            st = SentenceEncoder.from_pretrained(model_dir, dtype=precision, device=device)
            encoders[f"tformer {precision}"] = (
                lambda st=st: st.encode(texts, batch_size=SENTENCE_BATCH, show_progress=False))
        peer = _sentence_transformers(model_dir, device, texts, half)
        if peer is None:
            report.notes.append("sentence-transformers is not installed: its rows are skipped "
                                "(pip install tformer[bench])")
        encoders.update(peer or {})
        ort_gpu, why = _ort_cuda(model_dir, device, tokenizer, texts, work)
        encoders.update(ort_gpu)
        if why:
            report.notes.append(f"{name}: ONNX Runtime's CUDA provider skipped: {why}")
        reference = encoders["tformer fp32"]()
        kept, cosines = {}, {}
        for label, encode in encoders.items():
            cosines[label] = float((encode() * reference).sum(axis=1).min())  # both L2-normalised
            floor = 0.9999 if label.endswith("fp32") else (
                MIN_COSINE if label.startswith("tformer") else PEER_MIN_COSINE)
            if cosines[label] < floor:
                note = f"not timed: min cosine {cosines[label]:.5f} to tformer fp32 (needs {floor})"
                report.rows.append(Row(name, label, note=note))
            else:
                kept[label] = encode
        timings = measure(kept, s.n_rounds(7))
    report.rows += timed_rows(name, timings, tokens)
    for row in report.rows:
        if row.median_ms:
            row.note = f"{n / row.median_ms * 1e3:,.0f} sentences/s" + (
                "" if row.contender.endswith("fp32") else f", min cosine {cosines[row.contender]:.5f}")
    for precision in ("fp32",) + ((half,) if half else ()):
        ours = f"tformer {precision}"
        for theirs in (f"sentence-transformers {precision}",) + (
                (ORT_CUDA,) if precision == "fp32" and ORT_CUDA in timings else ()):
            report.targets.append(Target(name, f"{ours} >= 1.0x the sentences/s of {theirs}",
                                         paired_ratio(timings[theirs], timings[ours])
                                         if ours in timings and theirs in timings else None, 1.0))
    report.notes.append(
        f"{name}: {n} texts of 3..{max_tokens} tokens (stdlib docstrings, {tokens} tokens), batch "
        f"{SENTENCE_BATCH}, tokenization included, mean pooling + L2 normalisation; {weights}; "
        f"outputs checked first (min cosine to tformer fp32: 0.9999 fp32, {MIN_COSINE} tformer 16-bit, "
        f"{PEER_MIN_COSINE} sentence-transformers' whole-model 16-bit); on "
        + _device_note(device))
    return report


def _sentence_transformers(model_dir: Path, device: torch.device, texts: list[str],
                           half: str | None) -> dict[str, Callable[[], np.ndarray]] | None:
    try:  # optional (tformer[bench])
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    corpus.quiet_transformers()
    out = {}
    for precision in ("fp32",) + ((half,) if half else ()):
        model = SentenceTransformer(str(model_dir), device=str(device))
        if precision == "bf16":
            model = model.to(torch.bfloat16)  # its own 16-bit mode: the whole model in bf16

        def encode(model=model) -> np.ndarray:
            emb = model.encode(texts, batch_size=SENTENCE_BATCH, show_progress_bar=False,
                               convert_to_tensor=True, normalize_embeddings=True)
            return emb.float().cpu().numpy()

        out[f"sentence-transformers {precision}"] = encode
    return out


ORT_CUDA = "ONNX Runtime CUDA fp32"


def _ort_cuda(model_dir: Path, device: torch.device, tokenizer, texts: list[str],
              work: Path) -> tuple[dict[str, Callable[[], np.ndarray]], str]:
    """ONNX Runtime's CUDA execution provider on the same directory (transformers' BertModel
    exported as the CPU peers export it, bench.peers), encoding as SentenceEncoder does:
    ({name: encode}, "") or ({}, why not)."""
    if device.type != "cuda":
        return {}, "not a CUDA device"
    try:  # onnxruntime-gpu: the CUDA build of onnxruntime, optional
        import onnxruntime as ort
    except ImportError:
        return {}, "onnxruntime is not installed (pip install onnxruntime-gpu)"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return {}, (f"this onnxruntime ({ort.__version__}) has no CUDA provider "
                    f"({', '.join(ort.get_available_providers())}; pip install onnxruntime-gpu)")
    from tformer.commands.benchmarking import peers

    path = peers.onnx_export(model_dir, work / "bert.onnx")
    provider = ("CUDAExecutionProvider", {"device_id": device.index or 0})
    session = ort.InferenceSession(str(path), providers=[provider])
    if session.get_providers()[0] != "CUDAExecutionProvider":
        return {}, f"the session fell back to {session.get_providers()[0]}"

    def forward(ids, mask, types):
        return session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]

    return {ORT_CUDA: lambda: peers.encode_with(forward, tokenizer, texts)}, ""


def _device_note(device: torch.device) -> str:
    from tformer.nn.devices import describe

    return f"{describe(device)}, torch {torch.__version__}" + (
        f", CUDA {torch.version.cuda}" if device.type == "cuda" else "")
