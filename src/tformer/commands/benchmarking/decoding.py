"""The decoding workload: greedy decoding with the key/value cache against recomputing the prefix."""

from __future__ import annotations

import torch

from tformer.commands.benchmarking import models as M
from tformer.commands.benchmarking.harness import Report, Target, measure, paired_ratio
from tformer.commands.benchmarking.rows import Settings, timed_rows
from tformer.nn.model import Seq2SeqTransformer


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
    report.rows += timed_rows(name, timings, batch * steps)
    report.rows[-1].note = report.rows[-2].note = (
        f"{steps} tokens x batch {batch}, source {src_len}; identical tokens: {same}")
    report.targets.append(Target(name, f"KV cache >= 3x the speed of recomputing the prefix "
                                       f"({steps} tokens)",
                                 paired_ratio(timings["tformer recompute prefix"],
                                              timings["tformer KV cache"]), 3.0))
    return report
