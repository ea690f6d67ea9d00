"""The typed examples of a data run: each record's token ids, and its `cost` (the tokens it
adds to a batch's padded width, which length bucketing sorts by)."""

from __future__ import annotations

from dataclasses import dataclass

from tformer.text.batches import EncodedText


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
class TextExample:
    """One encoded text: what a batch of it costs and how long it is, in tokens."""

    text: EncodedText

    @property
    def cost(self) -> int:
        return len(self.text.ids)

    @property
    def longest(self) -> int:
        return len(self.text.ids)


@dataclass
class LabeledExample(TextExample):
    label: int  # -1: no label (prediction)


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

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(len(t.ids) for t in (self.anchor, self.positive, self.negative) if t is not None)
