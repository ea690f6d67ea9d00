"""Beam search's bookkeeping after each decoding step (tformer.nn.generate.beam_search): the next
beams, the finished hypotheses, which sources stop. Some 50 operator calls on tensors of a few
hundred values, 0.23-0.27 ms a step at 4-64 sources x 4 beams on an Intel Xeon (2 threads);
compiled (torch.compile, inductor) they took 0.24-0.30 ms, so they run as they are.

Shape legend: B' sources still searching, K beams, C each beam's candidates (K + 1, or V when
the vocabulary is smaller), L the longest output, T the tokens so far (BOS included).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tformer.nn.cache import stay_in_place


class Beams(NamedTuple):
    """A search's state between steps, one row per source (B') or per beam (B'*K)."""

    scores: Tensor  # (B'*K,) each live beam's total log-probability (-inf: none)
    tokens: Tensor  # (B'*K, T) each beam's tokens, BOS first
    hyp_tokens: Tensor  # (B', L) each source's best finished hypothesis
    hyp_scores: Tensor  # (B',) its total log-probability
    hyp_final: Tensor  # (B',) and its length-penalised score (-inf: none yet)
    stopped: Tensor  # (B',) no live beam can win any more
    finished: Tensor  # (B',) hypotheses ended so far (the peers' rule: early_stopping)


def advance(state: Beams, beam_logp: Tensor, beam_token: Tensor, penalty: float, eos_id: int,
            early_stopping: bool, in_place: bool) -> tuple[Beams, Tensor]:
    """One step's bookkeeping, from each beam's C best next tokens (``beam_logp``, ``beam_token``:
    a source's K best candidates that are not EOS, and any EOS among its K best, are among them,
    a beam's candidates ranking as its log-probabilities do). The rule is beam_search's
    (its docstring). ``penalty``: the new length to the power length_penalty;
    ``in_place``: order the next beams to move the fewest cache rows (cache.stay_in_place), not
    best first. Returns the new state and ``beam`` (B'*K,): the beam each next beam continues,
    by which the caller reorders the cache.

    Shape: beam_logp, beam_token (B'*K, C) -> state as above with T + 1 tokens, beam (B'*K,)
    """
    n = state.stopped.size(0)
    k, kept = state.scores.size(0) // n, beam_logp.size(1)
    cand = (state.scores[:, None] + beam_logp).view(n, k * kept)  # (B', K*C)
    top_scores, top = cand.topk(min(2 * k, k * kept), dim=-1)  # (B', 2K) best first
    top_token = beam_token.view(n, k * kept).gather(1, top)  # (B', 2K)
    first_beam = torch.arange(n, device=cand.device) * k  # (B',) each source's beam 0, a row of B'*K
    is_eos = top_token == eos_id
    # Finished hypotheses: the best EOS among the K best (a step's all have one length).
    first = is_eos[:, :k].int().argmax(dim=-1, keepdim=True)  # (B', 1)
    eos_score = top_scores.gather(1, first)[:, 0]  # (B',)
    eos_final = torch.where(is_eos[:, :k].any(dim=-1), eos_score / penalty, float("-inf"))
    better = ~state.stopped & (eos_final > state.hyp_final)  # (B',)
    parent = top.gather(1, first)[:, 0] // kept + first_beam  # (B',)
    step = state.tokens.size(1) - 1
    old = state.hyp_tokens
    hyp_tokens = torch.cat([torch.where(better[:, None], state.tokens[parent, 1:], old[:, :step]),
                            torch.where(better, eos_id, old[:, step])[:, None], old[:, step + 1:]],
                           dim=1)  # (B', L)
    hyp_scores = torch.where(better, eos_score, state.hyp_scores)
    hyp_final = torch.where(better, eos_final, state.hyp_final)
    # The next beams: the K best candidates that are not EOS (a stable sort keeps the order).
    pick = torch.sort(is_eos.to(torch.uint8), dim=-1, stable=True).indices[:, :k]  # (B', K)
    if in_place:
        pick = stay_in_place(top.gather(1, pick) // kept, pick)
    token = top_token.gather(1, pick).view(-1)  # (B'*K,)
    scores = top_scores.gather(1, pick).view(-1)
    scores = scores.masked_fill(token == eos_id, float("-inf"))  # V < K + 1 only: dead beams
    # Stop where the best hypothesis scores at least what the best live beam does now.
    stopped = state.stopped | (hyp_final >= scores.view(n, k).amax(dim=-1) / penalty)
    finished = state.finished
    if early_stopping:  # or, with the peers' rule, once K hypotheses have finished
        finished = finished + is_eos[:, :k].sum(dim=-1)
        stopped = stopped | (finished >= k)
    beam = (top.gather(1, pick) // kept + first_beam[:, None]).view(-1)  # (B'*K,)
    tokens = torch.cat([state.tokens.index_select(0, beam), token[:, None]], dim=1)
    return Beams(scores, tokens, hyp_tokens, hyp_scores, hyp_final, stopped, finished), beam
