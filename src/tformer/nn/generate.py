"""Greedy and beam-search decoding for `Seq2SeqTransformer`, batched, with a KV cache.

The source is encoded once; each step feeds only the newest target token to
`model.decode` together with the cached keys/values of the earlier ones (cross-
attention caches the memory's projections at step 0), so a step costs O(T), not O(T^2).
Rows that have finished leave the batch (greedy: a row that produced EOS; beam: a row whose
beams all did), a quarter of the batch at a time, so a few long outputs do not drag the
finished rows through every remaining step. One device sync per step (the finished count), and
in beam search a second (which beams moved: the cache is reordered in place, moved rows only).
The self-attention caches have room for max_len positions after the first step, so each step
writes its keys in place instead of copying the whole cache (tformer.nn.attention.with_room).
Beam search ranks each beam's K best tokens, not all K*V candidates, and the K beams of a source
share its one row of cross-attention keys/values (MultiHeadAttention groups their queries).

Shape legend: B batch, K beams, S source length, L generated length, D model dim, V vocab.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer import kernels
from tformer.nn.attention import with_room
from tformer.nn.layers import LayerCache
from tformer.text.specials import BOS, EOS, PAD  # defaults; callers pass their tokenizer's ids


@dataclass
class GenerationOutput:
    """sequences (B, L): generated ids after BOS, the EOS included when produced, PAD after it.
    scores (B,): sum of token log-probabilities (beam search: before the length penalty)."""

    sequences: Tensor
    scores: Tensor
    eos_id: int = EOS
    pad_id: int = PAD

    def tolist(self) -> list[list[int]]:
        """Per row, the ids up to and including the first EOS (PAD stripped)."""
        eos, pad = self.eos_id, self.pad_id
        rows = []
        for row in self.sequences.tolist():
            rows.append(row[: row.index(eos) + 1] if eos in row else [i for i in row if i != pad])
        return rows


def _check(src_ids: Tensor, src_attention_mask: Tensor | None, max_len: int) -> None:
    if src_ids.dim() != 2:
        raise ValueError(f"src_ids: expected shape (B, S), got {tuple(src_ids.shape)}")
    if src_attention_mask is not None and src_attention_mask.shape != src_ids.shape:
        raise ValueError(
            f"src_attention_mask: expected shape (B, S) = {tuple(src_ids.shape)}, "
            f"got {tuple(src_attention_mask.shape)}"
        )
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len: expected a positive int, got {max_len!r}")


def _reorder_cache(cache: tuple[LayerCache, ...], beam: Tensor) -> tuple[LayerCache, ...]:
    """Keep the self-attention caches of the surviving beams: row i becomes row beam[i], in
    place (the step's caches are new tensors that only this search holds), and only the rows
    whose beam changed are copied, not the whole cache.

    The cross-attention keys/values are left as they are: they depend on the source only, and
    the beams of a source share its one row of them (MultiHeadAttention).
    """
    moved = (beam != torch.arange(beam.numel(), device=beam.device)).nonzero()[:, 0]  # (M,)
    if moved.numel():
        came_from = beam[moved]
        for self_k, self_v, _, _ in cache:
            self_k.index_copy_(0, moved, self_k.index_select(0, came_from))
            self_v.index_copy_(0, moved, self_v.index_select(0, came_from))
    return cache


def _with_room(cache: tuple[LayerCache, ...], capacity: int) -> tuple[LayerCache, ...]:
    """Every layer's self-attention keys/values copied into buffers with room for ``capacity``
    positions, which the next steps fill in place; the cross-attention ones as they are."""
    return tuple((with_room(self_k, capacity), with_room(self_v, capacity), cross_k, cross_v)
                 for self_k, self_v, cross_k, cross_v in cache)


@torch.no_grad()
def greedy_search(
    model,
    src_ids: Tensor,
    src_attention_mask: Tensor | None = None,
    max_len: int = 64,
    bos_id: int = BOS,
    eos_id: int = EOS,
    pad_id: int = PAD,
    use_cache: bool = True,
    deadline: float | None = None,
) -> GenerationOutput:
    """Pick the most likely token at every step until each row has produced EOS (or, with a
    `deadline`, a time.perf_counter() reading, until then: the rows are cut where they are).

    With the cache, rows that have finished leave the batch (their memory, mask and cache
    rows are dropped), so the last long outputs do not carry the finished ones along.
    ``use_cache=False`` re-runs the decoder over the whole prefix each step, for every row
    (slow; it exists to check the cached path).

    Shape:
        src_ids, src_attention_mask: (B, S) -> sequences (B, L <= max_len), scores (B,)
    """
    _check(src_ids, src_attention_mask, max_len)
    was_training = model.training
    model.eval()
    b, device = src_ids.size(0), src_ids.device
    memory = model.encode(src_ids, src_attention_mask=src_attention_mask).last_hidden_state
    mask = src_attention_mask
    tokens = torch.full((b, max_len + 1), pad_id, dtype=torch.long, device=device)  # (B, 1 + L)
    tokens[:, 0] = bos_id
    scores = torch.zeros(b, device=device)
    rows = torch.arange(b, device=device)  # (B',) the rows still in the batch, as rows of B
    done = torch.zeros(b, dtype=torch.bool, device=device)  # (B',) produced EOS
    past = None
    length = 0
    for step in range(max_len):
        length = step + 1
        step_in = tokens[rows, step : step + 1] if use_cache else tokens[rows, : step + 1]
        out = model.decode(step_in, memory, memory_attention_mask=mask,
                           past_key_values=past, use_cache=use_cache)
        past = out.past_key_values if use_cache else None
        if use_cache and step == 0:
            past = _with_room(past, max_len)
        logp = out.logits[:, -1].float().log_softmax(dim=-1)  # (B', V)
        best = logp.argmax(dim=-1)  # (B',)
        scores.index_add_(0, rows, torch.where(done, 0.0, logp.gather(1, best[:, None])[:, 0]))
        best = best.masked_fill(done, pad_id)  # finished rows only pad
        tokens[rows, step + 1] = best
        done |= best == eos_id
        finished = int(done.sum())  # the step's one device sync
        if finished == rows.numel() or _past(deadline):
            break
        if use_cache and finished * _DROP_SHARE >= rows.numel():
            keep = (~done).nonzero()[:, 0]  # (B'',)
            rows, done, memory = rows[keep], done[keep], memory[keep]
            past = _select(past, keep, max_len)
            mask = None if mask is None else mask[keep]
    model.train(was_training)
    return GenerationOutput(tokens[:, 1 : length + 1], scores, eos_id, pad_id)


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


# Finished rows leave the batch once they are a quarter of it: dropping copies every layer's
# cache, so a copy per finished row would cost more than computing a few idle rows.
_DROP_SHARE = 4


def _select(cache: tuple[LayerCache, ...], index: Tensor, capacity: int) -> tuple[LayerCache, ...]:
    """Keep the rows `index` (batch on dim 0) of every layer's self- and cross-attention cache;
    the self-attention ones keep room for ``capacity`` positions."""
    return _select_beams(cache, index, index, capacity)


@torch.no_grad()
def beam_search(
    model,
    src_ids: Tensor,
    src_attention_mask: Tensor | None = None,
    beam_size: int = 4,
    max_len: int = 64,
    length_penalty: float = 1.0,
    bos_id: int = BOS,
    eos_id: int = EOS,
    pad_id: int = PAD,
    deadline: float | None = None,
) -> GenerationOutput:
    """Keep the `beam_size` most likely prefixes per source; return the best finished one.

    A finished beam (it produced EOS) stays in the beam with its score frozen, so it
    competes with the unfinished ones until the search ends. The final pick divides
    each score by len ** length_penalty (len counts EOS): 0 ranks by total
    log-probability, which favours short outputs; 1 by the per-token average.
    The search stops when every beam of every row has finished, at max_len, or at the
    `deadline` (a time.perf_counter() reading); a row
    whose beams have all finished can change no more, so it leaves the batch with its pick.

    Shape:
        src_ids, src_attention_mask: (B, S) -> sequences (B, L <= max_len), scores (B,)
    """
    _check(src_ids, src_attention_mask, max_len)
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size: expected a positive int, got {beam_size!r}")
    was_training = model.training
    model.eval()
    b, k, device = src_ids.size(0), beam_size, src_ids.device
    # One memory row per source: its K beams attend to it as one group of queries
    # (MultiHeadAttention), so it is neither repeated K times nor copied when beams move.
    memory = model.encode(src_ids, src_attention_mask=src_attention_mask).last_hidden_state
    mask = src_attention_mask  # (B, S)
    tokens = torch.full((b * k, 1), bos_id, dtype=torch.long, device=device)  # (B*K, 1)
    # Only beam 0 is live at the start; the others are copies that must not be picked twice.
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    scores = scores.view(-1)  # (B*K,)
    done = torch.zeros(b * k, dtype=torch.bool, device=device)
    lengths = torch.zeros(b * k, device=device)  # generated tokens, EOS included
    # A row whose beams have all finished leaves the batch with its pick (as greedy's rows do).
    srcs = torch.arange(b, device=device)  # (B',) rows of B still searching
    best_tokens = torch.full((b, max_len), pad_id, dtype=torch.long, device=device)  # (B, L)
    best_scores = torch.zeros(b, device=device)

    def pick(leaving: Tensor) -> None:
        """Write out the best beam (length-penalised) of the rows ``leaving`` (B',) bool; it
        reads the search state (scores, lengths, tokens, srcs) as it is at the call."""
        n = leaving.numel()
        final = (scores / lengths.clamp(min=1) ** length_penalty).view(n, k)  # (B', K)
        best = final.argmax(dim=-1) + torch.arange(n, device=device) * k  # (B',) beam rows
        best = best[leaving]
        best_tokens[srcs[leaving], : tokens.size(1) - 1] = tokens[best, 1:]
        best_scores[srcs[leaving]] = scores[best]

    past = None
    kept = None  # each beam's best tokens: K of them, or all V when the vocabulary is smaller
    for step in range(max_len):
        n = srcs.numel()
        out = model.decode(tokens[:, -1:], memory, memory_attention_mask=mask,
                           past_key_values=past, use_cache=True)
        logp = out.logits[:, -1].float().log_softmax(dim=-1)  # (B'*K, V)
        if kept is None:
            kept = min(k, logp.size(-1))
            # A finished beam can only be extended by PAD, at no cost: its candidates.
            finished_logp = torch.full((kept,), float("-inf"), device=device)
            finished_logp[0] = 0.0
            finished_token = torch.full((kept,), pad_id, dtype=torch.long, device=device)
        # A source's K best candidates (beam score + token log-prob, of K*V) are among its beams'
        # own K best tokens, as a beam's candidates rank as its log-probabilities do.
        beam_logp, beam_token = kernels.topk(logp, kept)  # (B'*K, kept)
        beam_logp = torch.where(done[:, None], finished_logp, beam_logp)
        beam_token = torch.where(done[:, None], finished_token, beam_token)
        cand = (scores[:, None] + beam_logp).view(n, k * kept)  # (B', K*kept)
        top_scores, top = cand.topk(k, dim=-1)  # (B', K)
        beam = (top // kept + torch.arange(n, device=device)[:, None] * k).view(-1)  # (B'*K,) rows
        token = beam_token.view(n, k * kept).gather(1, top).view(-1)  # (B'*K,)
        scores = top_scores.view(-1)
        tokens = torch.cat([tokens.index_select(0, beam), token[:, None]], dim=1)
        past = out.past_key_values if step else _with_room(out.past_key_values, max_len)
        past = _reorder_cache(past, beam)
        was_done = done.index_select(0, beam)
        lengths = lengths.index_select(0, beam) + (~was_done).float()
        done = was_done | (token == eos_id)
        finished = done.view(n, k).all(dim=-1)  # (B',)
        leaving = int(finished.sum())  # the step's one device sync
        if leaving == n or _past(deadline):
            break
        if leaving * _DROP_SHARE >= n:
            pick(finished)
            keep = (~finished).nonzero()[:, 0]  # (B'',) rows
            beams = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)  # (B''*K,)
            srcs, past = srcs[keep], _select_beams(past, beams, keep, max_len)
            memory, tokens, scores = memory[keep], tokens[beams], scores[beams]
            done, lengths = done[beams], lengths[beams]
            mask = None if mask is None else mask[keep]
    pick(torch.ones(srcs.numel(), dtype=torch.bool, device=device))
    model.train(was_training)
    return GenerationOutput(best_tokens[:, : tokens.size(1) - 1], best_scores, eos_id, pad_id)


def _select_beams(cache: tuple[LayerCache, ...], beams: Tensor, rows: Tensor,
                  capacity: int) -> tuple[LayerCache, ...]:
    """Keep the beams `beams` of the self-attention caches (with room for ``capacity``
    positions) and the source rows `rows` of the cross-attention ones (one row per source)."""
    return tuple((with_room(self_k.index_select(0, beams), capacity),
                  with_room(self_v.index_select(0, beams), capacity),
                  cross_k.index_select(0, rows), cross_v.index_select(0, rows))
                 for self_k, self_v, cross_k, cross_v in cache)


def generate(
    model,
    src_ids: Tensor,
    src_attention_mask: Tensor | None = None,
    beam_size: int = 1,
    max_len: int = 64,
    length_penalty: float = 1.0,
    bos_id: int = BOS,
    eos_id: int = EOS,
    pad_id: int = PAD,
    deadline: float | None = None,
) -> GenerationOutput:
    """Greedy search for beam_size 1, beam search otherwise; the special ids are the
    caller's tokenizer's; generation stops at the `deadline` (a time.perf_counter() reading)."""
    ids = dict(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, deadline=deadline)
    if beam_size == 1:
        return greedy_search(model, src_ids, src_attention_mask, max_len=max_len, **ids)
    return beam_search(model, src_ids, src_attention_mask, beam_size=beam_size,
                       max_len=max_len, length_penalty=length_penalty, **ids)
