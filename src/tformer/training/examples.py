"""The typed examples of a data run: each record's token ids, and its `cost` (the tokens it
adds to a batch's padded width, which length bucketing sorts by)."""

from __future__ import annotations

from dataclasses import dataclass

from tformer.text.batches import EncoderBatch, encoder_arrays


@dataclass
class Seq2SeqExample:
    source: list[int]  # source ids + EOS
    target: list[int]  # target ids, no specials

    @property
    def cost(self) -> int:
        return len(self.source) + len(self.target)

    @property
    def longest(self) -> int:  # its longest text with its EOS or BOS, as max_length counts it
        return max(len(self.source), len(self.target) + 1)


@dataclass
class EncodedText:
    ids: list[int]  # with the tokenizer's specials
    type_ids: list[int] | None  # None: a model without token types (a synthetic task's)


@dataclass
class LabeledExample:
    text: EncodedText
    label: int  # -1: no label (prediction)

    @property
    def cost(self) -> int:
        return len(self.text.ids)

    @property
    def longest(self) -> int:
        return len(self.text.ids)


@dataclass
class PairExample:
    anchor: EncodedText
    positive: EncodedText
    negative: EncodedText | None = None

    @property
    def cost(self) -> int:
        return sum(len(t.ids) for t in (self.anchor, self.positive, self.negative) if t is not None)

    @property
    def longest(self) -> int:
        return max(len(t.ids) for t in (self.anchor, self.positive, self.negative) if t is not None)


def encoder_batch(texts: list[EncodedText], pad_id: int, labels: list[int] | None = None) -> EncoderBatch:
    types = None if any(t.type_ids is None for t in texts) else [t.type_ids for t in texts]
    return encoder_arrays([t.ids for t in texts], pad_id, labels, types).to_torch()
