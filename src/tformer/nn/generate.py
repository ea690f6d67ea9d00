"""Greedy and beam-search decoding for `Seq2SeqTransformer`, batched, with a KV cache.

The source is encoded once; each step feeds only the newest target token to
`model.decode` together with the cached keys/values of the earlier ones (cross-
attention caches the memory's projections at step 0), so a step costs O(T), not O(T^2).
Rows that have finished leave the batch (greedy: a row that produced EOS; beam: a source whose
best hypothesis outscores its live beams), a quarter of the batch at a time, so a few long
outputs do not drag the finished rows through every remaining step; the kept rows move to the
caches' first rows in place (tformer.nn.cache.keep_rows). One device sync per step
(the finished count), and in beam search a second (which beams moved: the cache is reordered in
place, moved rows only; once it is large, a parent's best child keeps the parent's row).
Each step's log-probabilities are written into one buffer the search keeps (tformer.nn.step).
The self-attention caches have room for max_len positions after the first step, so each step
writes its keys in place instead of copying the whole cache (tformer.nn.attention.with_room);
the step itself returns them (tformer.nn.step: a compiled step cannot write into its input).
Beam search ranks each beam's K + 1 best tokens, not all K*V candidates, sets finished
hypotheses aside (they never hold a beam), and the K beams of a source share its one row of
cross-attention keys/values (MultiHeadAttention groups their queries).

Shape legend: B batch, K beams, S source length, L generated length, D model dim, V vocab.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from tformer.nn import kernels
from tformer.nn.beams import Beams, advance
from tformer.nn.cache import reorder_cache as _reorder_cache
from tformer.nn.cache import select_beams as _select_beams
from tformer.nn.cache import select_rows as _select
from tformer.nn.cache import self_bytes
from tformer.nn.cache import with_room_all as _with_room
from tformer.nn.search_args import (
    check_beam_size,
    check_deadline,
    check_length_penalty,
    check_search_fits,
    check_seq2seq,
    check_special_ids,
    search_max_len,
)
from tformer.nn.step import decode_step, fresh_inputs
from tformer.text.specials import BOS, EOS, PAD  # defaults; callers pass their tokenizer's ids


@dataclass
class GenerationOutput:
    """sequences (B, L): generated ids after BOS, the EOS included when produced, PAD after it.
    scores (B,): sum of token log-probabilities (beam search: before the length penalty).
    complete: False when the deadline stopped the search with rows still going (their outputs
    are cut, not finished: a score of them would judge outputs the model never ended)."""

    sequences: Tensor
    scores: Tensor
    eos_id: int = EOS
    pad_id: int = PAD
    complete: bool = True

    def tolist(self) -> list[list[int]]:
        """Per row, the ids up to and including the first EOS (PAD stripped)."""
        eos, pad = self.eos_id, self.pad_id
        rows = []
        for row in self.sequences.tolist():
            rows.append(row[: row.index(eos) + 1] if eos in row else [i for i in row if i != pad])
        return rows


def _check(model, max_len: int | None, bos_id: int, eos_id: int, pad_id: int,
           deadline: float | None) -> int:
    """The search's own arguments, refused in one line before anything is computed; returns
    max_len (by default 64, at most the model's positions). ``src_ids`` and
    ``src_attention_mask`` are the model's to check (``model.encode``): one message for both."""
    max_len = search_max_len(model, max_len)
    check_special_ids(bos_id, eos_id, pad_id, model.config.target_vocab_size)
    check_deadline(deadline)
    return max_len


def _in_eval_mode(search):
    """``search`` runs the model in eval mode (no dropout) and gives it back in the mode it came
    in, also when it raises (model.encode refusing the sources, a Ctrl-C): a training model left
    in eval mode after an error trained on without dropout."""

    @functools.wraps(search)
    def run(model, *args, **kwargs) -> GenerationOutput:
        check_seq2seq(model)  # before .training: None or an Encoder is refused naming `model`
        was_training = model.training
        model.eval()
        try:
            return search(model, *args, **kwargs)
        finally:
            model.train(was_training)

    return run


@torch.no_grad()
@_in_eval_mode
def greedy_search(
    model,
    src_ids: Tensor,
    src_attention_mask: Tensor | None = None,
    max_len: int | None = None,
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
    (slow; it exists to check the cached path). ``max_len``: the most tokens generated
    (default 64; at most the model's positions, config.max_len, as `tformer generate
    --max-len`). ``model`` is a Seq2SeqTransformer, ``src_ids`` a torch.Tensor.

    Shape:
        src_ids, src_attention_mask: (B, S) -> sequences (B, L <= max_len), scores (B,)
    """
    max_len = _check(model, max_len, bos_id, eos_id, pad_id, deadline)
    memory = model.encode(src_ids, src_attention_mask=src_attention_mask).last_hidden_state
    b, device = src_ids.size(0), src_ids.device
    memory, mask = fresh_inputs(memory, src_attention_mask)
    tokens = torch.full((b, max_len + 1), pad_id, dtype=torch.long, device=device)  # (B, 1 + L)
    tokens[:, 0] = bos_id
    scores = torch.zeros(b, dtype=_score_dtype(memory), device=device)
    rows = torch.arange(b, device=device)  # (B',) the rows still in the batch, as rows of B
    done = torch.zeros(b, dtype=torch.bool, device=device)  # (B',) produced EOS
    scratch = _scratch(model, b, scores.dtype, device) if use_cache else None  # (B, V) log-probs
    past = None
    length, cut = 0, False
    for step in range(max_len):
        length = step + 1
        if not use_cache:  # the whole prefix again, every row
            out = model.decode(tokens[rows, : step + 1], memory, memory_attention_mask=mask)
            logp = out.logits[:, -1].to(scores.dtype).log_softmax(dim=-1)  # (B', V)
        else:
            step_in = tokens[rows, step : step + 1]  # (B', 1)
            logp, past = decode_step(model, step_in, memory, mask, past, scores.dtype, step, scratch)
            past = past if step else _with_room(past, max_len)
        best = logp.argmax(dim=-1)  # (B',)
        scores.index_add_(0, rows, torch.where(done, 0.0, logp.gather(1, best[:, None])[:, 0]))
        best = best.masked_fill(done, pad_id)  # finished rows only pad
        tokens[rows, step + 1] = best
        done |= best == eos_id
        finished = int(done.sum())  # the step's one device sync
        if finished == rows.numel():
            break
        if _past(deadline) and step + 1 < max_len:
            cut = True
            break
        if use_cache and finished * _DROP_SHARE >= rows.numel():
            keep = (~done).nonzero()[:, 0]  # (B'',)
            rows, done, memory = rows[keep], done[keep], memory[keep]
            past = _select(past, keep)
            mask = None if mask is None else mask[keep]
    return GenerationOutput(tokens[:, 1 : length + 1], scores, eos_id, pad_id, complete=not cut)


def _score_dtype(memory: Tensor) -> torch.dtype:
    """Log-probabilities are summed in float32 at least (a bf16 model's too), in float64 for a
    float64 model."""
    return torch.promote_types(memory.dtype, torch.float32)


def _scratch(model, rows: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The buffer each step's log-probabilities are written into (tformer.nn.step.log_probs)."""
    return torch.empty(rows, model.config.target_vocab_size, dtype=dtype, device=device)


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


# Finished rows leave the batch once they are a quarter of it: dropping copies the kept rows that
# move in every layer's cache, so a copy per finished row would cost more than computing a few
# idle rows. With rows kept in place, an eighth or a sixteenth measured 0.5-0.8% slower at
# Marian's size (beam 4, Intel Xeon, paired in one process), a half 5%.
_DROP_SHARE = 4
# Next beams in the order that moves the fewest cache rows (cache.stay_in_place), once moving a
# row costs more than ordering them: ~15 operator calls a step (~50 us on an Intel Xeon) against
# a fifth fewer rows copied. Paired, beam 4 over 64 sources (256 rows) of random models on an
# Intel Xeon: at Marian's size (1.5 MiB of cache a position) 1% faster all along; at the default
# size (0.25 MiB a position) 1-2% slower, so it waits for 8 MiB (the 32nd position there).
_STAY_IN_PLACE_FROM = 8 << 20


@torch.no_grad()
@_in_eval_mode
def beam_search(
    model,
    src_ids: Tensor,
    src_attention_mask: Tensor | None = None,
    beam_size: int = 4,
    max_len: int | None = None,
    length_penalty: float = 1.0,
    bos_id: int = BOS,
    eos_id: int = EOS,
    pad_id: int = PAD,
    deadline: float | None = None,
    early_stopping: bool = False,
) -> GenerationOutput:
    """Keep the `beam_size` (K) most likely unfinished prefixes per source; return the best
    finished one.

    Each step ranks a source's candidates (a live prefix and one more token) by total
    log-probability. An EOS candidate among the K best is a finished hypothesis, set aside
    with the score score / len ** length_penalty (len counts EOS); the K best candidates that
    are not EOS are the next step's beams, so a finished prefix never takes a beam's place.
    A source stops once its best hypothesis scores at least as high as its best live prefix
    scores now (at once when its best candidate is EOS): another token can only lower a total,
    so with length_penalty 0 nothing better can come; with a positive one a live prefix's
    average could still rise, and stopping is a heuristic. It sits between the peers': Hugging
    Face's default waits until K hypotheses are finished and the worst of them scores as high
    (it can return K; it runs longer and may find a better one), CTranslate2 (as fairseq and
    Marian) once K hypotheses are finished, whatever their scores (sooner on a near-flat
    distribution, where EOS is often among the K best; it may return a worse one; on a trained
    model it measured later, see benchmarks/README.md). At max_len or the `deadline` (a
    time.perf_counter() reading), the live prefixes count as hypotheses as they are.
    length_penalty 0 ranks hypotheses by total log-probability, which favours short outputs; 1
    by the per-token average. A source that has stopped leaves the batch with its best
    hypothesis (as greedy's rows do). max_len as in greedy_search.

    ``early_stopping=True`` adds the peers' rule: a source also stops once K of its hypotheses
    have finished (counting each EOS among a step's K best candidates), whatever their scores,
    as Hugging Face's ``early_stopping=True``, CTranslate2, fairseq and Marian do. It can only
    stop a source sooner, so it is faster where EOS comes early among the candidates (random
    or uncertain models), and it may return a worse hypothesis than the default search
    (benchmarks/README.md measures both on random and trained models).

    Shape:
        src_ids, src_attention_mask: (B, S) -> sequences (B, L <= max_len), scores (B,)
    """
    max_len = _check(model, max_len, bos_id, eos_id, pad_id, deadline)
    check_beam_size(beam_size)
    check_length_penalty(length_penalty, max_len)
    if isinstance(src_ids, Tensor):  # else model.encode refuses it, naming it
        check_search_fits(model.config, src_ids.size(0), beam_size, max_len,
                          _score_dtype(next(model.parameters())).itemsize)
    # One memory row per source: its K beams attend to it as one group of queries
    # (MultiHeadAttention), so it is neither repeated K times nor copied when beams move.
    memory = model.encode(src_ids, src_attention_mask=src_attention_mask).last_hidden_state
    b, k, device = src_ids.size(0), beam_size, src_ids.device
    memory, mask = fresh_inputs(memory, src_attention_mask)  # (B, S, D), (B, S)
    # Only beam 0 is live at the start; the others are copies that must not be picked twice.
    scores = torch.full((b, k), float("-inf"), dtype=_score_dtype(memory), device=device)
    scores[:, 0] = 0.0
    # Each source's best finished hypothesis so far: tokens, total and length-penalised score.
    state = Beams(scores=scores.view(-1),  # (B*K,)
                  tokens=torch.full((b * k, 1), bos_id, dtype=torch.long, device=device),  # (B*K, 1)
                  hyp_tokens=torch.full((b, max_len), pad_id, dtype=torch.long, device=device),
                  hyp_scores=torch.zeros(b, dtype=scores.dtype, device=device),
                  hyp_final=torch.full((b,), float("-inf"), dtype=scores.dtype, device=device),
                  stopped=torch.zeros(b, dtype=torch.bool, device=device),
                  finished=torch.zeros(b, dtype=torch.long, device=device))
    srcs = torch.arange(b, device=device)  # (B',) rows of B still searching
    scratch = _scratch(model, b * k, scores.dtype, device)  # (B*K, V) each step's log-probabilities
    out_tokens = torch.full((b, max_len), pad_id, dtype=torch.long, device=device)  # (B, L)
    out_scores = torch.zeros(b, dtype=scores.dtype, device=device)

    def write_out(rows: Tensor) -> None:
        """The hypotheses of the rows ``rows`` (of B') are final: copy them to the output."""
        out_tokens[srcs[rows]] = state.hyp_tokens[rows]
        out_scores[srcs[rows]] = state.hyp_scores[rows]

    past, last = None, state.tokens  # last: (B'*K, 1) the newest token of each beam
    kept = None  # each beam's best tokens: K + 1 of them (at most one is EOS), or all V
    length, cut = 0, False
    for step in range(max_len):
        n, length = srcs.numel(), step + 1
        logp, present = decode_step(model, last, memory, mask, past, state.scores.dtype, step,
                                    scratch)  # (B'*K, V)
        kept = kept or min(k + 1, logp.size(-1))
        # A source's K best candidates that are not EOS, and any EOS among its K best, are
        # among its beams' own K + 1 best tokens: a beam's candidates rank as its log-probs do.
        beam_logp, beam_token = kernels.topk(logp, kept)  # (B'*K, kept)
        penalty = length ** length_penalty
        in_place = self_bytes(present) >= _STAY_IN_PLACE_FROM  # order beams to move the fewest rows
        state, beam = advance(state, beam_logp, beam_token, penalty, eos_id, early_stopping, in_place)
        last = state.tokens[:, -1:].contiguous()  # (B'*K, 1) the next step's input, alike each step
        past = _reorder_cache(present if step else _with_room(present, max_len), beam)
        leaving = int(state.stopped.sum())  # the step's one device sync
        if leaving == n or step + 1 == max_len:
            break
        if _past(deadline):
            cut = True
            break
        if leaving * _DROP_SHARE >= n:
            write_out(state.stopped.nonzero()[:, 0])
            keep = (~state.stopped).nonzero()[:, 0]  # (B'',) rows
            beams = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)  # (B''*K,)
            srcs, past = srcs[keep], _select_beams(past, beams, keep)
            memory, last = memory[keep], last[beams]
            state = Beams(state.scores[beams], state.tokens[beams], *(t[keep] for t in state[2:]))
            mask = None if mask is None else mask[keep]
    # Sources still searching (max_len or the deadline): their live prefixes are hypotheses too.
    n = srcs.numel()
    live_final, live = (state.scores.view(n, k) / length ** length_penalty).max(dim=-1)  # (B',)
    use_live = ~state.stopped & (live_final > state.hyp_final)
    rows = torch.arange(n, device=device)
    hyp_tokens = state.hyp_tokens.clone()
    hyp_tokens[:, :length] = torch.where(use_live[:, None], state.tokens[rows * k + live, 1:],
                                         hyp_tokens[:, :length])
    state = state._replace(hyp_tokens=hyp_tokens, hyp_scores=torch.where(
        use_live, state.scores.view(n, k)[rows, live], state.hyp_scores))
    write_out(rows)
    return GenerationOutput(out_tokens[:, :length], out_scores, eos_id, pad_id, complete=not cut)


def generate(
    model,
    src_ids: Tensor,
    src_attention_mask: Tensor | None = None,
    beam_size: int = 1,
    max_len: int | None = None,
    length_penalty: float = 1.0,
    bos_id: int = BOS,
    eos_id: int = EOS,
    pad_id: int = PAD,
    deadline: float | None = None,
    early_stopping: bool = False,
) -> GenerationOutput:
    """Greedy search for beam_size 1, beam search otherwise; the special ids are the
    caller's tokenizer's; generation stops at the `deadline` (a time.perf_counter() reading).
    max_len: the most tokens (default 64, at most the model's positions); early_stopping: see
    beam_search."""
    ids = dict(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, deadline=deadline)
    max_len = search_max_len(model, max_len)
    check_length_penalty(length_penalty, max_len)  # refused alike whichever search runs
    if beam_size == 1:
        return greedy_search(model, src_ids, src_attention_mask, max_len=max_len, **ids)
    return beam_search(model, src_ids, src_attention_mask, beam_size=beam_size,
                       max_len=max_len, length_penalty=length_penalty, early_stopping=early_stopping,
                       **ids)
