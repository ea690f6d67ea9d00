"""NumPy mirror of tformer.nn.generate's greedy search, with the reference's KV cache.

Shape legend: B batch, S source length, L generated length, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tformer.reference.loss import log_softmax
from tformer.tasks.tokenizer import BOS, EOS, PAD


@dataclass
class GenerationOutput:
    """sequences (B, L): generated ids after BOS, the EOS included when produced, PAD after it.
    scores (B,): sum of token log-probabilities."""

    sequences: np.ndarray
    scores: np.ndarray

    def tolist(self) -> list[list[int]]:
        """Per row, the ids up to and including the first EOS (PAD stripped)."""
        rows = []
        for row in self.sequences.tolist():
            rows.append(row[: row.index(EOS) + 1] if EOS in row else [i for i in row if i != PAD])
        return rows


def greedy_search(model, src_ids: np.ndarray, src_attention_mask: np.ndarray | None = None,
                  max_len: int = 64, bos_id: int = BOS, eos_id: int = EOS,
                  pad_id: int = PAD) -> GenerationOutput:
    """Pick the most likely token at every step until each row has produced EOS.

    Shape:
        src_ids, src_attention_mask: (B, S) -> sequences (B, L <= max_len), scores (B,)
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len: expected a positive int, got {max_len!r}")
    b = src_ids.shape[0]
    memory = model.encode(src_ids, src_attention_mask).last_hidden_state  # (B, S, D)
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
    return GenerationOutput(tokens[:, 1:], scores)
