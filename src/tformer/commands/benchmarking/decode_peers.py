"""Decoding against the peers on the same weights: tformer greedy and beam search, HF ``generate``
(MarianMTModel) and CTranslate2 (through HF's export) when it is installed.

Marian's layout is tformer's post-norm seq2seq: sinusoidal positions, embeddings times sqrt(D), one
shared vocabulary, the output projection tied to it, no final norm, no embedding norm. So the
benchmark builds a tformer model of that layout (random weights: speed does not depend on them)
and copies it into HF's ``MarianMTModel`` through the key table below; HF's sinusoids are laid
out differently (all sines, then all cosines), so its position tables get tformer's. The copy is
checked (teacher-forced logits, greedy token ids) before anything is timed.

The sources are the stdlib's docstrings (benchmarking.corpus) at real lengths, a word an id. Random
weights never choose EOS, so EOS is the token whose first greedy appearance is spread most evenly
over the steps: rows stop at many steps, as a trained model's do; every contender uses that id.

Shape legend: B batch, S source length, L generated length, D model dim, V vocab.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from tformer.commands.benchmarking import breakdown, corpus, peers, worker
from tformer.commands.benchmarking.harness import Report, Row, Target, measure, paired_ratio
from tformer.config import TransformerConfig
from tformer.nn.generate import GenerationOutput, beam_search, greedy_search
from tformer.nn.kernels import compiling
from tformer.nn.model import Seq2SeqTransformer
from tformer.nn.positional import sinusoidal_table

PAD, BOS = 0, 1  # EOS is chosen per model (see the module docstring)
GREEDY_COMPILED, BEAM_COMPILED = "tformer greedy, compiled step", "tformer beam 4, compiled step"
BEAM_EARLY = "tformer beam 4, compiled step, early_stopping"
LOGITS_TOLERANCE = 1e-4  # fp32 max abs diff of teacher-forced logits, tformer vs the peers
# (d_model, heads, d_ff, layers per stack): Marian-sized (the HF model) and tformer's default
SHAPES = {"marian": (256, 4, 1024, 3), "default": (64, 4, 256, 2), "quick": (32, 4, 64, 1)}


def marian_layout_config(shape: str, vocab: int, max_len: int) -> TransformerConfig:
    d, h, f, n = SHAPES[shape]
    return TransformerConfig(d_model=d, n_heads=h, d_ff=f, n_layers=n, dropout=0.0, activation="relu",
                             norm_first=False, final_norm=False, positional="sinusoidal",
                             max_len=max_len, vocab_size=vocab, scale_embeddings=True,
                             tie_output=True, layer_norm_eps=1e-5)


# (HF MarianMTModel key, tformer key, transform): {i} is a layer, the transforms cut tformer's fused
# projections (rows q | k | v, and k | v for cross-attention) into HF's separate ones.
def _rows(part: int, parts: int):
    return lambda w: w.chunk(parts, dim=0)[part]


_SAME = None
_LAYER_TABLE = {
    "encoder": [
        *((f"self_attn.{p}_proj.{wb}", f"self_attn.qkv_proj.{wb}", _rows(j, 3))
          for j, p in enumerate("qkv") for wb in ("weight", "bias")),
        ("self_attn.out_proj.{wb}", "self_attn.out_proj.{wb}", _SAME),
        ("self_attn_layer_norm.{wb}", "attn_norm.{wb}", _SAME),
    ],
    "decoder": [
        *((f"self_attn.{p}_proj.{wb}", f"self_attn.qkv_proj.{wb}", _rows(j, 3))
          for j, p in enumerate("qkv") for wb in ("weight", "bias")),
        ("self_attn.out_proj.{wb}", "self_attn.out_proj.{wb}", _SAME),
        ("self_attn_layer_norm.{wb}", "self_attn_norm.{wb}", _SAME),
        ("encoder_attn.q_proj.{wb}", "cross_attn.q_proj.{wb}", _SAME),
        *((f"encoder_attn.{p}_proj.{wb}", f"cross_attn.kv_proj.{wb}", _rows(j, 2))
          for j, p in enumerate("kv") for wb in ("weight", "bias")),
        ("encoder_attn.out_proj.{wb}", "cross_attn.out_proj.{wb}", _SAME),
        ("encoder_attn_layer_norm.{wb}", "cross_attn_norm.{wb}", _SAME),
    ],
}
_FFN_TABLE = [("fc1.{wb}", "ffn.up.{wb}", _SAME), ("fc2.{wb}", "ffn.down.{wb}", _SAME),
              ("final_layer_norm.{wb}", "ffn_norm.{wb}", _SAME)]


def marian_key_table(config: TransformerConfig) -> list[tuple[str, str, Callable | None]]:
    table = [("model.shared.weight", "src_emb.weight", _SAME)]
    for stack, n in (("encoder", config.n_layers), ("decoder", config.decoder_layers)):
        for i in range(n):
            for theirs, ours, fn in _LAYER_TABLE[stack] + _FFN_TABLE:
                for wb in ("weight", "bias"):
                    table.append((f"model.{stack}.layers.{i}.{theirs.format(wb=wb)}",
                                  f"{stack}.layers.{i}.{ours.format(wb=wb)}", fn))
    return list(dict.fromkeys(table))  # the q/k/v rows above repeat weight/bias once more


def hf_marian(model: Seq2SeqTransformer):
    """A MarianMTModel holding ``model``'s weights (eval mode), or None without transformers."""
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        return None
    corpus.quiet_transformers()
    c = model.config
    hf_config = MarianConfig(
        vocab_size=c.vocab_size, d_model=c.d_model, encoder_layers=c.n_layers,
        decoder_layers=c.decoder_layers, encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff,
        activation_function="relu", max_position_embeddings=c.max_len, scale_embedding=True,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=PAD,
        decoder_start_token_id=BOS, forced_eos_token_id=None, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True)
    hf = MarianMTModel(hf_config).eval()
    ours = model.state_dict()
    theirs = hf.state_dict()
    table = marian_key_table(c)
    used = {o for _, o, _ in table}
    if used != set(ours):
        raise ValueError(f"key table: tformer keys not covered {sorted(set(ours) - used)}, "
                         f"unknown {sorted(used - set(ours))}")
    with torch.no_grad():
        for their_key, our_key, fn in table:
            value = ours[our_key] if fn is None else fn(ours[our_key])
            if theirs[their_key].shape != value.shape:
                raise ValueError(f"{their_key}: expected shape {tuple(theirs[their_key].shape)}, "
                                 f"got {tuple(value.shape)} from {our_key}")
            theirs[their_key].copy_(value)  # state_dict tensors share the parameters' storage
        table_pe = sinusoidal_table(c.max_len, c.d_model).float()  # tformer's interleaved layout
        for stack in (hf.model.encoder, hf.model.decoder):
            stack.embed_positions.weight.copy_(table_pe)
        hf.final_logits_bias.zero_()
    return hf


def hf_generate(hf, src: Tensor, mask: Tensor, max_len: int, eos: int, beams: int) -> list[list[int]]:
    """HF greedy (beams 1) or beam search; per row the ids after the start token, up to EOS."""
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=max_len, num_beams=beams, do_sample=False, length_penalty=1.0,
                           early_stopping=False, decoder_start_token_id=BOS, bos_token_id=BOS,
                           eos_token_id=eos, pad_token_id=PAD, forced_eos_token_id=None,
                           use_cache=True)
    out = hf.generate(input_ids=src, attention_mask=mask, generation_config=gen)
    return GenerationOutput(out[:, 1:], torch.zeros(len(out)), eos, PAD).tolist()


def ctranslate2_export(hf, directory: str) -> str:
    """Convert the HF export ``hf`` into a CTranslate2 model in ``directory``; "" or why not.

    CTranslate2's own Marian loader starts the decoder from a zero embedding and drops the last
    vocabulary entry (Marian quirks tformer does not have), so the export goes through its BART
    loader with Marian's settings (post-norm, no embedding norm): the same layers, as tformer's.
    The vocabulary is the ids spelled "t0", "t1", ...
    """
    try:
        from ctranslate2.converters.transformers import BartLoader
    except ImportError:
        return "ctranslate2 is not installed (pip install tformer[bench])"
    hf.config.normalize_before = False
    hf.config.normalize_embedding = False
    spec = BartLoader().get_model_spec(hf)
    tokens = [f"t{i}" for i in range(hf.config.vocab_size)]
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.bos_token = spec.config.decoder_start_token = tokens[BOS]
    spec.config.eos_token, spec.config.unk_token = tokens[-1], tokens[PAD]  # EOS is passed per call
    spec.config.layer_norm_epsilon = 1e-5
    spec.validate()
    spec.optimize(quantization=None)
    os.makedirs(directory, exist_ok=True)
    spec.save(directory)
    return ""


def ct2_workers(hf, src: Tensor, mask: Tensor, max_len: int, eos: int, threads: int,
                work: Path) -> tuple[dict, str]:
    """CTranslate2 greedy and beam 4, each in its own process: ({name: Worker}, "") or ({}, why).

    Its own process, as the encoder peers have (worker.py): CTranslate2 ships its own OpenMP
    runtime, and once it has run in a process, torch's decoding there ran 1.4-1.7x slower
    (AMD EPYC Zen 4, 2 threads), which would have charged the peer's cost to tformer.
    """
    why = ctranslate2_export(hf, str(work / "ct2"))
    if why:
        return {}, why
    import numpy as np

    np.savez(work / "decode-inputs.npz", src=src.numpy(), mask=mask.numpy())
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env.update({k: os.environ.get(k, v) for k, v in peers.CT2_ENV.items()})  # the caller's win
    workers = {}
    for index, beams in enumerate((1, 4)):
        spec = {"name": f"CTranslate2 {'greedy' if beams == 1 else 'beam 4'}", "task": "decode",
                "model": str(work / "ct2"), "inputs": str(work / "decode-inputs.npz"),
                "threads": threads, "beams": beams, "max_len": max_len, "eos": eos,
                "index": index, "work": str(work)}
        workers[spec["name"]] = worker.Worker(spec, env)
    return workers, ""


# Inputs --------------------------------------------------------------------------------------------
def real_sources(count: int, vocab: int, min_tokens: int = 6, max_tokens: int = 40,
                 seed: int = 0) -> tuple[Tensor, Tensor]:
    """Stdlib prose at real lengths (log-uniform), words hashed to ids >= 4, no EOS: (B, S) ids, mask."""
    texts = corpus.sentences(count, min_tokens, max_tokens, lambda t: len(t.split()), seed=seed)
    rows = [[4 + zlib.crc32(w.encode()) % (vocab - 4) for w in t.split()] for t in texts]
    s = max(map(len, rows))
    ids = torch.full((count, s), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    return ids, ids != PAD


def spread_eos(model: Seq2SeqTransformer, src: Tensor, mask: Tensor, max_len: int) -> int:
    """The token whose first greedy appearance spreads the rows' stopping steps most evenly."""
    free = greedy_search(model, src, mask, max_len=max_len, eos_id=-1, bos_id=BOS, pad_id=PAD)
    seqs = free.sequences  # (B, L), no row stopped
    best, best_key = 4, None
    for tok in torch.unique(seqs).tolist():
        if tok < 4:
            continue
        hit = seqs == tok
        first = torch.where(hit.any(1), hit.int().argmax(1), max_len).tolist()
        key = (len(set(first)), -abs(statistics.median(first) - max_len / 2))
        if best_key is None or key > best_key:
            best, best_key = tok, key
    return best


# Search quality ------------------------------------------------------------------------------------
def sequence_scores(model: Seq2SeqTransformer, src: Tensor, mask: Tensor, rows: list[list[int]],
                    length_penalty: float = 1.0) -> Tensor:
    """What beam search ranks: each row's output, teacher-forced through ``model``, scored as its
    summed token log-probabilities / its length ** length_penalty (EOS counted where produced).

    Shape: src, mask (B, S); rows B lists of ids -> (B,) float64
    """
    b, longest = len(rows), max(max(map(len, rows)), 1)
    tgt = torch.full((b, 1 + longest), PAD, dtype=torch.long)  # (B, 1 + L): BOS, the output, PAD
    tgt[:, 0] = BOS
    for i, row in enumerate(rows):
        tgt[i, 1 : 1 + len(row)] = torch.tensor(row, dtype=torch.long)
    with torch.inference_mode():
        logp = model(src, tgt[:, :-1], src_attention_mask=mask).logits.double().log_softmax(-1)
    picked = logp.gather(2, tgt[:, 1:, None])[:, :, 0]  # (B, L)
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.float64)
    real = torch.arange(longest)[None, :] < lengths[:, None]  # (B, L): the output's own tokens
    return (picked * real).sum(1) / lengths.clamp(min=1) ** length_penalty


def compared_search(model: Seq2SeqTransformer, src: Tensor, mask: Tensor, theirs: list[list[int]],
                    ours: list[list[int]]) -> str:
    """How a peer's beam outputs that differ from tformer's score against tformer's (length
    penalty 1, the one every contender decodes with): a faster search that stops sooner may
    return worse hypotheses, a slower one better."""
    differ = [i for i, (a, b) in enumerate(zip(theirs, ours, strict=True)) if a != b]
    if not differ:
        return ""

    def score(rows: list[list[int]]) -> Tensor:  # (M,) the differing rows only
        return sequence_scores(model, src[differ], mask[differ], [rows[i] for i in differ])

    gain = score(theirs) - score(ours)  # (M,) > 0: the peer found the better hypothesis
    higher, lower = int((gain > 0).sum()), int((gain < 0).sum())
    return (f"of the {len(differ)} others, {higher} score higher and {lower} lower than tformer's "
            f"(length-penalised log-prob, mean difference {float(gain.mean()):+.4f})")


# The workload --------------------------------------------------------------------------------------
def decoding(s, shape: str = "marian") -> Report:
    """tformer greedy and beam 4 against HF generate (and CTranslate2) on the same weights."""
    report = Report()
    name = f"decode-{shape}"
    shape = "quick" if s.quick else shape
    vocab = 500 if s.quick else 8000
    batch, max_len = (8, 12) if s.quick else (64, 32)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(marian_layout_config(shape, vocab, max_len=128)).eval()
    # At tformer's init (unit-variance inputs) a random tied model repeats its input token;
    # BERT's 0.02 lets the outputs vary, so that some rows stop early (see spread_eos).
    torch.nn.init.normal_(model.src_emb.weight, std=0.02)
    model.requires_grad_(False)  # as `tformer generate` loads a run: frozen
    src, mask = real_sources(batch, vocab)
    eos = spread_eos(model, src, mask, max_len)
    ids = dict(bos_id=BOS, eos_id=eos, pad_id=PAD)

    def greedy(compile_: str) -> Callable[[], list]:
        return lambda: _forced(compile_, greedy_search, model, src, mask, max_len=max_len, **ids)

    def beam(compile_: str, early_stopping: bool = False) -> Callable[[], list]:
        return lambda: _forced(compile_, beam_search, model, src, mask, beam_size=4, max_len=max_len,
                               early_stopping=early_stopping, **ids)

    # The default search (eager), and its decoding step compiled where measured faster (the
    # compilation, its first call, timed apart: tformer.nn.kernels.compiling), and the peers' stopping
    # rule as the documented option (beam_search's early_stopping).
    runs: dict[str, Callable] = {"tformer greedy": greedy("off"), "tformer beam 4": beam("off")}
    why_not = compiling.why_not_compiled(torch.device("cpu")) or (
        "--quick: a minute of compiling (TFORMER_COMPILE=1 adds them)" if s.quick and compiling.mode() != "on"
        else None)
    if why_not is None:
        runs[GREEDY_COMPILED], runs[BEAM_COMPILED] = greedy("on"), beam("on")
        runs[BEAM_EARLY] = beam("on", early_stopping=True)
    else:
        report.notes.append(f"{name}: no compiled rows: {why_not}")
    hf = hf_marian(model)
    workdir = tempfile.TemporaryDirectory(prefix="tformer-ct2-")
    notes = {}
    if hf is None:
        report.notes.append("transformers is not installed: HF generate skipped (pip install tformer[hf])")
    else:
        with torch.no_grad():
            tgt = torch.cat([torch.full((batch, 1), BOS), src[:, :8].clamp(min=4)], dim=1)
            diff = (hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
                    - model(src, tgt, src_attention_mask=mask).logits).abs().max().item()
        if diff > LOGITS_TOLERANCE:
            report.rows.append(Row(name, "HF MarianMTModel generate", note=f"not timed: logits "
                                   f"differ by {diff:.1e} > {LOGITS_TOLERANCE:.0e}"))
        else:
            runs["HF generate greedy"] = lambda: hf_generate(hf, src, mask, max_len, eos, 1)
            runs["HF generate beam 4"] = lambda: hf_generate(hf, src, mask, max_len, eos, 4)
            notes["HF generate greedy"] = f"logits max diff {diff:.1e}"
    ct2, why = ({}, "HF export missing") if hf is None else ct2_workers(
        hf, src, mask, max_len, eos, s.threads, Path(workdir.name))
    if why:
        report.notes.append(f"{name}: CTranslate2 skipped: {why}")
    try:
        return _timed(report, name, model, runs, ct2, notes, src, mask, max_len, eos, vocab, s)
    finally:
        for w in ct2.values():
            w.close()
        workdir.cleanup()


def _forced(compile_: str, search, *args, **kwargs) -> list[list[int]]:
    with compiling.forced(compile_):  # "off": eager; "on": the step compiled where faster
        return search(*args, **kwargs).tolist()


def _timed(report: Report, name: str, model: Seq2SeqTransformer, runs: dict, ct2: dict,
           notes: dict, src: Tensor, mask: Tensor, max_len: int, eos: int, vocab: int, s) -> Report:
    """Check every contender's output against tformer's, time them in rounds, fill the report."""
    batch = src.size(0)
    outputs = {}
    with torch.inference_mode():
        for n, run in runs.items():
            t = time.perf_counter()
            outputs[n] = run()
            if "compiled" in n:  # its first call compiles: timed apart, never in the median
                notes[n] = f"first call (compiling) {time.perf_counter() - t:.1f} s"
    for n, w in ct2.items():
        try:
            outputs[n] = w.ready()["output"]
            runs[n] = w
        except RuntimeError as e:
            report.rows.append(Row(name, n, note=f"not timed: {e}"))
    for n, out in outputs.items():
        if n in ("tformer greedy", "tformer beam 4"):
            continue
        reference = outputs["tformer beam 4" if "beam" in n else "tformer greedy"]
        same = sum(a == b for a, b in zip(out, reference, strict=True))
        agree = f"{same}/{batch} rows as tformer's"
        if "beam" in n and same != batch:
            agree += "; " + compared_search(model, src, mask, out, reference)
        notes[n] = f"{notes[n]}; {agree}" if n in notes else agree
        if "greedy" in n and same != batch:  # greedy is deterministic: the outputs must agree
            report.rows.append(Row(name, n, note=f"not timed: {agree}"))
            del runs[n]
    with torch.inference_mode():
        timings = measure(runs, s.n_rounds(5))
        for n in [n for n in runs if n.startswith("tformer")]:  # after timing, never in it
            where = f"time: {breakdown.describe(breakdown.time_parts(runs[n]))}"
            notes[n] = f"{notes[n]}; {where}" if n in notes else where
    tokens = {n: sum(map(len, outputs[n])) for n in runs}  # generated tokens, EOS included
    first = timings["tformer greedy"]
    for n, t in timings.items():
        report.rows.append(Row(name, n, t.median * 1e3, t.spread, tokens[n] / t.median,
                               paired_ratio(t, first), t.cores, note=notes.get(n, "")))
    lengths = [len(row) for row in outputs["tformer greedy"]]
    report.notes.append(
        f"{name}: d {model.config.d_model}, {model.config.n_layers}+{model.config.decoder_layers} "
        f"layers, vocab {vocab}, random weights; batch {batch} real-length sources "
        f"({int(mask.sum(1).min())}-{int(mask.sum(1).max())} tokens), at most {max_len} new tokens, "
        f"greedy lengths {min(lengths)}-{max(lengths)} (EOS = id {eos}, see benchmarking.decode_peers); "
        "tokens/s counts each contender's generated tokens; greedy outputs may not differ, beam "
        "outputs may: the searches stop by different rules (tformer: once a source's best "
        "finished hypothesis scores at least its best live beam; HF: once 4 are finished and the "
        "worst of them does; CTranslate2: once 4 are finished, whatever their scores), so a peer's differing "
        "rows are scored under the model as the searches rank them; CTranslate2 in its own process "
        f"({', '.join(f'{k}={v}' for k, v in peers.CT2_ENV.items())}).")
    # issue 33: greedy and beam 4 at least 1.25x CTranslate2's; greedy at least HF generate's
    for ours, peer, bound in (("tformer greedy", "HF generate greedy", 1.0),
                              ("tformer greedy", "CTranslate2 greedy", 1.25),
                              ("tformer beam 4", "CTranslate2 beam 4", 1.25),
                              (BEAM_COMPILED, "CTranslate2 beam 4", 1.25),
                              (BEAM_EARLY, "CTranslate2 beam 4", 1.25)):
        if ours in timings:
            report.targets.append(Target(
                name, f"{ours} >= {bound}x the speed of {peer}",
                paired_ratio(timings[peer], timings[ours]) if peer in timings else None, bound))
    return report
