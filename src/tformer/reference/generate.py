"""NumPy mirror of tformer.nn.generate: greedy and beam search, with the reference's KV cache.

Written to be read: greedy runs the batch together; beam search runs one source at a time and
ranks every candidate (each live prefix and one more token, K * V of them), where the torch
search batches the sources, ranks each beam's K + 1 best tokens only and drops stopped sources
from the batch. The rule is the same, so both return the same hypotheses (tests/reference).

Shape legend: B batch, K beams, S source length, L generated length, D model dim, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tformer.nn.search_args import (
    check_beam_size,
    check_length_penalty,
    check_search_fits,
    check_special_ids,
    search_max_len,
)
from tformer.reference.loss import log_softmax
from tformer.training.tasks.tokenizer import BOS, EOS, PAD


@dataclass
class GenerationOutput:
    """sequences (B, L): generated ids after BOS, the EOS included when produced, PAD after it.
    scores (B,): sum of token log-probabilities (beam search: before the length penalty)."""

    sequences: np.ndarray
    scores: np.ndarray
    eos_id: int = EOS
    pad_id: int = PAD

    def tolist(self) -> list[list[int]]:
        """Per row, the ids up to and including the first EOS (PAD stripped)."""
        eos, pad = self.eos_id, self.pad_id
        rows = []
        for row in self.sequences.tolist():
            rows.append(row[: row.index(eos) + 1] if eos in row else [i for i in row if i != pad])
        return rows


def _check(model, max_len: int | None, bos_id: int, eos_id: int, pad_id: int) -> int:
    """The search's own arguments, refused in one line before anything is computed; returns
    max_len (by default 64, at most the model's positions). ``src_ids`` and
    ``src_attention_mask`` are the model's to check (``model.encode``): one message for both."""
    max_len = search_max_len(model, max_len)
    check_special_ids(bos_id, eos_id, pad_id, model.config.target_vocab_size)
    return max_len


def greedy_search(model, src_ids: np.ndarray, src_attention_mask: np.ndarray | None = None,
                  max_len: int | None = None, bos_id: int = BOS, eos_id: int = EOS,
                  pad_id: int = PAD) -> GenerationOutput:
    """Pick the most likely token at every step until each row has produced EOS.

    Shape:
        src_ids, src_attention_mask: (B, S) -> sequences (B, L <= max_len), scores (B,)
    """
    src_ids = np.asarray(src_ids)
    max_len = _check(model, max_len, bos_id, eos_id, pad_id)
    memory = model.encode(src_ids, src_attention_mask).last_hidden_state  # (B, S, D)
    b = src_ids.shape[0]
    tokens = np.full((b, 1), bos_id, dtype=np.int64)  # (B, 1)
    scores = np.zeros(b)
    done = np.zeros(b, dtype=bool)
    past = None
    for _ in range(max_len):
        out = model.decode(tokens[:, -1:], memory, memory_attention_mask=src_attention_mask,
                           past_key_values=past, use_cache=True)
        past = out.past_key_values
        logp = log_softmax(out.logits[:, -1].astype(np.float64))  # (B, V)
        best = logp.argmax(axis=-1)  # (B,)
        scores += np.where(done, 0.0, logp[np.arange(b), best])
        best = np.where(done, pad_id, best)  # finished rows only pad
        tokens = np.concatenate([tokens, best[:, None]], axis=1)
        done |= best == eos_id
        if done.all():
            break
    return GenerationOutput(tokens[:, 1:], scores, eos_id, pad_id)


def beam_search(model, src_ids: np.ndarray, src_attention_mask: np.ndarray | None = None,
                beam_size: int = 4, max_len: int | None = None, length_penalty: float = 1.0,
                bos_id: int = BOS, eos_id: int = EOS, pad_id: int = PAD,
                early_stopping: bool = False) -> GenerationOutput:
    """Keep the `beam_size` (K) most likely unfinished prefixes per source; return the best
    finished one (the rule of tformer.nn.generate.beam_search, whose docstring compares it with
    the peers').

    Every step scores each candidate (a live prefix and one more token) by its total
    log-probability. An EOS candidate among the K best is a finished hypothesis, ranked by
    total / len ** length_penalty (len counts EOS); the K best candidates that are not EOS are
    the next step's live prefixes. A source stops once its best hypothesis ranks at least as
    high as its best live prefix does now: a further token only lowers a total. At max_len the
    live prefixes count as hypotheses as they are. ``early_stopping``: a source also stops once
    K hypotheses have finished (each EOS among a step's K best counts), whatever their scores.

    Shape:
        src_ids, src_attention_mask: (B, S) -> sequences (B, L <= max_len), scores (B,)
    """
    src_ids = np.asarray(src_ids)
    max_len = _check(model, max_len, bos_id, eos_id, pad_id)
    check_beam_size(beam_size)
    check_length_penalty(length_penalty, max_len)
    check_search_fits(model.config, 1, beam_size, max_len, itemsize=8)  # one source at a time
    memory = model.encode(src_ids, src_attention_mask).last_hidden_state  # (B, S, D)
    found = []  # per source: (tokens after BOS, total log-probability, steps it ran)
    for i in range(src_ids.shape[0]):
        mask = None if src_attention_mask is None else np.asarray(src_attention_mask)[i : i + 1]
        found.append(_search_one(model, memory[i : i + 1], mask, beam_size, max_len,
                                 length_penalty, bos_id, eos_id, early_stopping))
    steps = max(ran for _, _, ran in found)  # the batch runs until its last source stops
    sequences = np.full((len(found), steps), pad_id, dtype=np.int64)  # (B, L)
    for row, (tokens, _, _) in zip(sequences, found, strict=True):
        row[: len(tokens)] = tokens
    scores = np.array([total for _, total, _ in found])
    return GenerationOutput(sequences, scores, eos_id, pad_id)


def _search_one(model, memory: np.ndarray, mask: np.ndarray | None, k: int, max_len: int,
                length_penalty: float, bos_id: int, eos_id: int,
                early_stopping: bool = False) -> tuple[list[int], float, int]:
    """Beam search for one source: memory (1, S, D) serves its K prefixes (the attention
    groups their queries). Returns the best hypothesis, its total and the steps run."""
    tokens = np.full((k, 1), bos_id, dtype=np.int64)  # (K, 1 + step) the live prefixes
    # Only prefix 0 is live at the start; the others are copies that must not be picked twice.
    totals = np.full(k, -np.inf)
    totals[0] = 0.0
    best_tokens, best_total, best_rank = [], 0.0, -np.inf  # the best finished hypothesis
    finished = 0  # hypotheses ended so far
    past = None
    for step in range(max_len):
        length = step + 1
        out = model.decode(tokens[:, -1:], memory, memory_attention_mask=mask,
                           past_key_values=past, use_cache=True)
        logp = log_softmax(out.logits[:, -1].astype(np.float64))  # (K, V)
        vocab = logp.shape[-1]
        candidates = (totals[:, None] + logp).reshape(-1)  # (K*V,) prefix p, token t at p*V + t
        order = np.argsort(-candidates, kind="stable")  # best first
        prefix, token = order // vocab, order % vocab
        # A finished hypothesis: the best EOS among the K best (a step's all have one length).
        eos_among_best = np.flatnonzero(token[:k] == eos_id)
        finished += eos_among_best.size
        if eos_among_best.size:
            j = eos_among_best[0]
            rank = candidates[order[j]] / length**length_penalty
            if rank > best_rank:
                best_tokens = tokens[prefix[j], 1:].tolist() + [eos_id]
                best_total, best_rank = candidates[order[j]], rank
        # The next live prefixes: the K best candidates that are not EOS.
        keep = np.flatnonzero(token != eos_id)[:k]  # (K,) positions in `order`
        beam, totals = prefix[keep], candidates[order[keep]]  # (K,) the prefix each continues
        tokens = np.concatenate([tokens[beam], token[keep, None]], axis=1)
        # Each layer's self-attention cache follows its prefix; the cross-attention one is the
        # source's, shared by every prefix.
        past = tuple((self_k[beam], self_v[beam], cross_k, cross_v)
                     for self_k, self_v, cross_k, cross_v in out.past_key_values)
        if best_rank >= totals[0] / length**length_penalty or (early_stopping and finished >= k):
            return best_tokens, float(best_total), length
    # max_len: the live prefixes are hypotheses as they are.
    live_rank = totals / max_len**length_penalty
    if live_rank.max() > best_rank:
        j = int(live_rank.argmax())
        best_tokens, best_total = tokens[j, 1:].tolist(), totals[j]
    return best_tokens, float(best_total), max_len


def generate(model, src_ids: np.ndarray, src_attention_mask: np.ndarray | None = None,
             beam_size: int = 1, max_len: int | None = None, length_penalty: float = 1.0,
             bos_id: int = BOS, eos_id: int = EOS, pad_id: int = PAD,
             early_stopping: bool = False) -> GenerationOutput:
    """Greedy search for beam_size 1, beam search otherwise; the special ids are the
    caller's tokenizer's (early_stopping: see beam_search)."""
    ids = dict(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    max_len = search_max_len(model, max_len)
    check_length_penalty(length_penalty, max_len)  # refused alike whichever search runs
    if beam_size == 1:
        return greedy_search(model, src_ids, src_attention_mask, max_len=max_len, **ids)
    return beam_search(model, src_ids, src_attention_mask, beam_size=beam_size,
                       max_len=max_len, length_penalty=length_penalty, early_stopping=early_stopping,
                       **ids)
