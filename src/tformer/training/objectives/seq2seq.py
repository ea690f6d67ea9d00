"""Sequence to sequence: the encoder-decoder learns to generate the target from the source.

Trained with teacher-forced cross-entropy; scored by generating (greedy, or beam search):
exact match of whole sequences for a synthetic task, BLEU and chrF of the decoded text for
your files. The best weights are kept by the teacher-forced validation loss.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from tformer.config import TransformerConfig
from tformer.nn.generate import generate
from tformer.nn.model import Seq2SeqTransformer
from tformer.text.batches import Seq2SeqBatch, seq2seq_arrays
from tformer.training.examples import Seq2SeqExample
from tformer.training.losses import seq2seq_loss
from tformer.training.objectives.base import DeadlinePassed, Objective, Tally

# Generation stops after LENGTH_A * (source tokens) + LENGTH_B tokens (and at the run's max
# length), as Marian (--max-length-factor) and fairseq (--max-len-a/b) bound theirs: an untrained
# or looping model decoded every test sentence to 128 tokens, 200 s after a 3-minute budget.
# Targets of 2x their source and 10 more hold every pair of the English -> German catalogs.
LENGTH_A, LENGTH_B = 2.0, 10


COPYING = "copying the source"  # the trivial baseline


def generation_limit(source_tokens: int, max_new_tokens: int) -> int:
    """The most tokens generated for a source of `source_tokens` (EOS included)."""
    return max(1, min(max_new_tokens, math.ceil(LENGTH_A * source_tokens) + LENGTH_B))


class Seq2Seq(Objective):
    kind = "seq2seq"
    model_kind = "seq2seq"
    inputs = ("source",)
    # The validation sample's corpus BLEU moved by a point or more between neighbouring
    # validations, and once picked weights 300 updates older than the loss's (test BLEU 20.2
    # instead of 23.9): the loss is the steadier judge.
    best_by = "loss"

    def what(self) -> str:
        return "sequence-to-sequence (source -> target)"

    @property
    def main_metric(self) -> str:
        return self.source.sequence_metric

    def model_config(self) -> TransformerConfig:
        return self.source.seq2seq_config()

    def build_model(self, model_config: TransformerConfig | None = None) -> nn.Module:
        if model_config is None and self.config.from_pretrained:
            raise ValueError("from_pretrained: fine-tuning needs an encoder objective "
                             "(text+label or anchor+positive); source+target trains from scratch")
        return Seq2SeqTransformer(model_config or self.model_config())

    def encode(self, examples: list) -> list[Seq2SeqExample]:
        s = self.source
        sources = s.pieces([s.field(ex, "source") for ex in examples])
        targets = s.pieces([s.field(ex, "target") for ex in examples])
        return [Seq2SeqExample(src + [s.eos_id], tgt) for src, tgt in zip(sources, targets, strict=True)]

    def collate(self, encoded: list[Seq2SeqExample]) -> Seq2SeqBatch:
        s = self.source
        return seq2seq_arrays([e.source for e in encoded], [e.target for e in encoded],
                              s.bos_id, s.eos_id, s.pad_id).to_torch()

    def loss(self, model: nn.Module, batch: Seq2SeqBatch, label_smoothing: float = 0.0):
        return seq2seq_loss(model, batch, label_smoothing, self.source.pad_id)

    def predict_batch(self, model: nn.Module, batch: Seq2SeqBatch, beam_size: int = 1,
                      length_penalty: float = 1.0, max_len: int | None = None,
                      deadline: float | None = None) -> list[list[int]]:
        """Generated ids (up to EOS) per example; max_len: the most tokens (default: bounded by
        the batch's longest source, ``generation_limit``); deadline: a time.perf_counter()
        reading at which generation stops: DeadlinePassed where it cut outputs short."""
        s = self.source
        if max_len is None:
            max_len = generation_limit(int(batch.src_mask.sum(dim=1).max()), s.max_new_tokens)
        out = generate(model, batch.src, batch.src_mask, beam_size=beam_size, max_len=max_len,
                       length_penalty=length_penalty, bos_id=s.bos_id, eos_id=s.eos_id, pad_id=s.pad_id,
                       deadline=deadline)
        if not out.complete:
            raise DeadlinePassed
        return out.tolist()

    def _bounded(self, options: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        return {**options, "deadline": deadline}

    def _baseline(self, examples: list) -> tuple[float, str]:
        """Copying the source: the score of each source given as its own output."""
        return self.source.copy_score(examples), COPYING

    def tally(self) -> SequenceTally:
        return SequenceTally(self)

    def score(self, examples: list, preds: list[list[int]]) -> tuple[dict[str, float], list[str]]:
        return self.source.score_sequences(preds, examples)

    def generate(self, model: nn.Module, texts: list[str], beam_size: int = 1,
                 length_penalty: float = 1.0, max_len: int | None = None, batch_size: int = 32) -> list[str]:
        """The output text of each input text."""
        ids = self.predict(model, self.source.inputs(texts, self.inputs), batch_size=batch_size,
                           beam_size=beam_size, length_penalty=length_penalty, max_len=max_len)
        return [self.source.decode(p) for p in ids]


class SequenceTally(Tally):
    """The source's sequence counts of the outputs and of the copied sources (the baseline),
    summed window by window: the corpus scores of them all, and nothing else kept."""

    def __init__(self, objective: Seq2Seq) -> None:
        self.source, self.metric = objective.source, objective.main_metric
        self.outputs: Any = 0  # np.ndarray after the first window
        self.copies: Any = 0

    def add(self, examples: list, preds: list) -> None:
        self.outputs = self.outputs + self.source.sequence_counts(preds, examples)[0]
        self.copies = self.copies + self.source.copy_counts(examples)

    def metrics(self) -> dict[str, float]:
        return self.source.sequence_scores(self.outputs)

    def baseline(self) -> dict[str, Any]:
        return {"baseline": self.source.sequence_scores(self.copies)[self.metric], "baseline_by": COPYING}
