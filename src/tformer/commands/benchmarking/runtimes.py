"""The peer workloads of issue 11: tformer against the runtimes people deploy encoders with.

- ``sentences``: a BERT-format model with all-MiniLM-L6-v2's shape (6 layers, d 384, 12 heads, ff
  1536) encodes 480 real texts of 3..230 tokens (stdlib docstrings, corpus.py): tokenized,
  longest first, batches of 32, mean pooling, L2 normalisation. Sentences/s, and the smallest
  cosine to tformer fp32's embeddings.
- ``mixed-base``: BERT-base (12 layers, d 768) on 8 x 128 token ids whose real lengths are spread
  over 16..128, through tformer's DEFAULT forward (no flag); last hidden state.

Each contender (peers.py) runs in its own process with the same thread count (worker.py); its
output is checked against tformer fp32's before timing; then all are timed in interleaved rounds.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from tformer.commands.benchmarking import breakdown, corpus, peers, worker
from tformer.commands.benchmarking.harness import Report, Row, Target, Timing, measure, paired_ratio
from tformer.commands.benchmarking.rows import TOLERANCE
from tformer.nn.kernels.machine import NO_BF16, has_bf16
from tformer.text.tokenizer import load_tokenizer

LOW_PRECISION_COSINE = 0.9  # bf16 / int8 rows: timed at any cosine above this (the cosine is reported)
PAUSE = 0.2  # untimed seconds after each call: idle OpenMP/ORT threads spin for a while after one


def sentences(s) -> Report:
    """Sentence encoding: what SentenceEncoder.encode does, for every contender."""
    n, max_tokens = (48, 60) if s.quick else (480, 230)
    with tempfile.TemporaryDirectory(prefix="tformer-bench-") as tmp:
        work = Path(tmp)
        if s.model_dir:
            model = Path(s.model_dir)
            weights = f"{model} (trained weights)"
        else:
            model = corpus.write_bert(work / "model", "tiny" if s.quick else "minilm", _vocab(work))
            corpus.write_sentence_layout(model)
            weights = (f"BERT-format model with all-MiniLM-L6-v2's shape "
                       f"{corpus.SHAPES['tiny' if s.quick else 'minilm']}, random weights "
                       "(--model-dir takes a trained one)")
        tokenizer = load_tokenizer(model)
        texts = corpus.sentences(n, 3, max_tokens, lambda t: tokenizer.lengths([t])[0])
        inputs = work / "texts.json"
        inputs.write_text(json.dumps(texts))
        lengths = tokenizer.lengths(texts)
        tokens = sum(lengths)
        report, timings = _compare(s, "sentences-minilm", "sentences", model, inputs, tokens, None)
        for row in report.rows:
            if row.median_ms:
                row.note = f"{n / row.median_ms * 1e3:,.0f} sentences/s; " + row.note
        report.notes.append(
            f"sentences-minilm: {n} texts of 3..{max_tokens} tokens (stdlib docstrings, {tokens} tokens), "
            f"batch {peers.BATCH_SIZE}, longest first, mean pooling + L2 normalisation, tokenization "
            f"included (the same `tokenizers` library for all); {weights}.")
        goals = _targets(report, timings, "sentences-minilm", [
            ("tformer fp32", "fp32 peers", 1.25), ("tformer bf16", "OpenVINO default precision", 1.3),
            ("tformer int8", "ONNX Runtime int8 (per-channel)", 1.0)])
        if timings and not s.quick:  # a roofline of microsecond GEMMs would mean nothing
            batches = -(-n // peers.BATCH_SIZE)
            _gemm_floors(report, timings, "sentences-minilm", model, lengths, tokens // batches,
                         goals, s.threads)
    return report


def mixed_base(s) -> Report:
    """BERT-base, real lengths spread over 16..128, the default forward against the peers."""
    batch, seq = (4, 32) if s.quick else (8, 128)
    with tempfile.TemporaryDirectory(prefix="tformer-bench-") as tmp:
        work = Path(tmp)
        model = corpus.write_bert(work / "model", "tiny" if s.quick else "base", _vocab(work))
        rng = np.random.default_rng(0)
        lengths = rng.permutation(np.linspace(seq // 8, seq, batch).round().astype(int))
        mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)  # (B, S)
        ids = rng.integers(len(corpus.SPECIALS), corpus.VOCAB_SIZE, (batch, seq)) * mask
        inputs = work / "batch.npz"
        np.savez(inputs, ids=ids, mask=mask, types=np.zeros_like(ids))
        report, timings = _compare(s, "mixed-base", "batch", model, inputs, int(mask.sum()),
                                   mask.astype(bool))
        report.notes.append(
            f"mixed-base: BERT-base {corpus.SHAPES['tiny' if s.quick else 'base']}, {batch} x {seq} "
            f"token ids, real lengths {sorted(lengths.tolist())}; tformer fp32 = the DEFAULT forward "
            "(no flag); outputs compared at real tokens.")
        goals = _targets(report, timings, "mixed-base", [("tformer fp32", "CTranslate2 fp32", 1.25),
                                                         ("tformer fp32", "HF BertModel sdpa", 1.5)])
        if timings and not s.quick:
            _gemm_floors(report, timings, "mixed-base", model, lengths.tolist(), int(mask.sum()),
                         goals, s.threads)
    return report


def _vocab(work: Path) -> Path:
    corpus.write_vocab(work / "vocab", corpus.paragraphs())
    return work / "vocab"


def _compare(s, name: str, task: str, model: Path, inputs: Path, tokens: int,
             mask: np.ndarray | None) -> tuple[Report, dict[str, Timing]]:
    """Start every contender, check its output against tformer fp32's, time the ones that pass."""
    report = Report()
    work = inputs.parent
    pause = 0.0 if s.quick else PAUSE
    paths = peers.Paths(model, work / "model.onnx", work)
    names = [c.name for c in peers.CONTENDERS if task in c.tasks]
    if s.contenders:  # the first (tformer fp32) is the reference: always kept
        names = names[:1] + [n for n in names[1:] if n.startswith(tuple(s.contenders))]
    order = list(names)
    skipped = {}
    if not has_bf16():
        skipped = {c.name: "skipped: " + NO_BF16
                   for c in peers.CONTENDERS if c.name in names and c.precision == "bf16"}
    names = [n for n in names if n not in skipped]
    if any(peers.BY_NAME[n].package in ("onnxruntime", "openvino") for n in names):
        peers.onnx_export(model, paths.onnx)  # shared by ONNX Runtime and OpenVINO
    workers, missing = worker.start(names, task, inputs, paths, s.threads)
    skipped.update(missing)
    try:
        results = {}
        for n, w in workers.items():
            try:
                results[n] = w.ready()
            except RuntimeError as e:
                results[n] = {"skip": f"not timed: {e}"}
        if "output" not in results.get(names[0], {}):
            report.notes.append(f"{name}: tformer fp32 did not run: {results.get(names[0])}")
            return report, {}
        timed, failed = _check(results, [n for n in names if n not in skipped], mask)
        skipped.update(failed)
        try:
            timings = measure({n: workers[n] for n in timed}, s.n_rounds(5), pause=pause)
        except RuntimeError as e:  # a worker died mid-run: say which, keep the other workloads
            report.notes.append(f"{name}: timing stopped: {e}")
            return report, {}
        for n in [n for n in timed if n.startswith("tformer")]:  # after timing, never in it
            try:
                timed[n] += f"; time: {breakdown.describe(workers[n].parts())}"
            except RuntimeError as e:  # it died profiling: its timings stand
                timed[n] += f"; time: not profiled ({e})"
    finally:
        for w in workers.values():
            w.close()
    first = timings[names[0]]
    for n in order:
        if n in timings:
            t = timings[n]
            report.rows.append(Row(name, n, t.median * 1e3, t.spread, tokens / t.median,
                                   paired_ratio(t, first), t.cores, note=timed[n]))
        else:
            report.rows.append(Row(name, n, note=skipped[n]))
    report.notes.append(
        f"sentences-minilm, mixed-base: each contender in its own process, {s.threads} threads each "
        f"(torch.set_num_threads, ORT intra_op_num_threads, CTranslate2 intra_threads, OpenVINO "
        f"INFERENCE_NUM_THREADS; OMP_NUM_THREADS too), {pause} s untimed pause after each call; "
        f"tformer fp32 is the reference; fp32 rows timed when "
        f"max abs diff to tformer fp32 <= {TOLERANCE:.0e}, bf16/int8 rows when min cosine >= "
        f"{LOW_PRECISION_COSINE} (reported). CTranslate2 runs with "
        + ", ".join(f"{k}={os.environ.get(k, v)}" for k, v in peers.CT2_ENV.items())
        + " (the benchmark's defaults unless the environment sets them: without CT2_USE_MKL=1 it "
        "uses MKL on Intel CPUs only). A tformer row's \"time:\" is one more call, untimed, under "
        "torch.profiler: its operators' time by part (benchmarking/breakdown.py), as shares of "
        "the call's wall time.")
    return report, timings


def _check(results: dict[str, dict], names: list[str], mask: np.ndarray | None
           ) -> tuple[dict[str, str], dict[str, str]]:
    """Each output against the first's (tformer fp32): (timed: name -> note, untimed: name -> why)."""
    reference = results[names[0]]["output"]
    timed, untimed = {}, {}
    for n in names:
        result = results[n]
        if "skip" in result:
            untimed[n] = result["skip"]
            continue
        diff, cos = _compare_outputs(result["output"], reference, mask)
        low = peers.BY_NAME[n].precision != "fp32"
        check = f"max abs diff {diff:.1e}, min cos {cos:.5f}"
        check += f"; {result['note']}" if result["note"] else ""
        if (cos >= LOW_PRECISION_COSINE) if low else (diff <= TOLERANCE):
            timed[n] = check
        else:
            bound = f"min cos < {LOW_PRECISION_COSINE}" if low else f"> {TOLERANCE:.0e}"
            untimed[n] = f"not timed: output differs ({check}; {bound})"
    return timed, untimed


def _compare_outputs(out: np.ndarray, ref: np.ndarray, mask: np.ndarray | None) -> tuple[float, float]:
    """(max abs diff, smallest cosine) over embeddings (N, D), or hidden states at real tokens."""
    a, b = out.astype(np.float64), ref.astype(np.float64)
    if mask is not None:
        a, b = a[mask], b[mask]  # (N, D) real tokens
    diff = float(np.abs(a - b).max())
    cos = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)
    return diff, float(cos.min())


def _targets(report: Report, timings: dict[str, Timing], name: str,
             goals: list[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    """Paired speed ratios: subject >= threshold x the peer ("fp32 peers": the fastest of them).
    Returns the goals with each peer named."""
    named = []
    for subject, peer, threshold in goals:
        if peer == "fp32 peers":
            fp32 = [n for n in timings
                    if not n.startswith("tformer") and peers.BY_NAME[n].precision == "fp32"]
            peer = min(fp32, key=lambda n: timings[n].median, default="the fastest fp32 peer")
        measured = None
        if subject in timings and peer in timings:
            measured = paired_ratio(timings[peer], timings[subject])
        report.targets.append(Target(name, f"{subject} >= {threshold}x the speed of {peer}", measured,
                                     threshold))
        named.append((subject, peer, threshold))
    return named


def _gemm_floors(report: Report, timings: dict[str, Timing], name: str, model: Path,
                 lengths: list[int], rows: int, goals: list[tuple[str, str, float]],
                 threads: int) -> None:
    """Each fp32 and bf16 row's share of the GEMM roofline, and what a target asks of the rest.

    The floor is the workload's matrix products (projections, feed-forward and attention's two
    products, each text at its own length: ``stats.flops_per_token``) at the fastest throughput
    measured here for the layer's shapes at ``rows`` rows (one batch's tokens), fp32 or bf16 as
    the row computes. No implementation in that precision runs faster than its floor, so a
    target whose time bound (the peer's time / the ratio) sits near or below the floor cannot be
    met on this CPU by any implementation; the note says so with the numbers."""
    import torch  # the main process already holds it; the contenders ran in their own

    from tformer.commands.benchmarking.roofline import gemm_throughput
    from tformer.config.sizes import flops_per_token
    from tformer.formats.pretrained import pretrained_config

    config = pretrained_config(model)
    flops = float(sum(flops_per_token(config, n) * n for n in lengths))
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16} if has_bf16() else {"fp32": torch.float32}
    floors = {label: flops / (gemm_throughput(config.d_model, config.d_ff, rows, threads,
                                              dtype)["best"] * 1e9) * 1e3
              for label, dtype in dtypes.items()}  # ms
    for row in report.rows:
        precision = peers.BY_NAME[row.contender].precision if row.contender in peers.BY_NAME else ""
        if row.workload == name and row.median_ms and precision in floors:
            row.roofline = floors[precision] / row.median_ms
    ours = next((r for r in report.rows if r.workload == name and r.contender == "tformer fp32"), None)
    if ours is not None and ours.roofline is not None:  # issue 55: the alternative where the floor forbids
        report.targets.append(Target(name, "tformer fp32 >= 90% of the fp32 GEMM roofline (where the "
                                           "floor forbids 1.25x the fastest peer)", ours.roofline, 0.9,
                                     unit=""))
    for subject, peer, threshold in goals:
        label = peers.BY_NAME[subject].precision
        if label not in floors or peer not in timings:
            continue
        bound = timings[peer].median * 1e3 / threshold
        report.notes.append(
            f"{name}: {subject} >= {threshold}x {peer} asks for at most {bound:.0f} ms; the "
            f"{label} GEMM floor is {floors[label]:.0f} ms ({flops / 1e9:.0f} GFLOP of matrix "
            f"products at the {label} roofline measured at {rows} rows), so the rest of the "
            f"forward would have to fit in {bound - floors[label]:.0f} ms ({peer} / floor = "
            f"{timings[peer].median * 1e3 / floors[label]:.2f}x, the most any {label} "
            "implementation could gain over it here).")
