"""Padded batches: the tensors a model is trained and evaluated on, for every source.

Synthetic tasks and your own data build the same three batch types:

    Seq2SeqBatch   src, src_mask, tgt_in, tgt_mask, labels   (encoder-decoder)
    EncoderBatch   input_ids, attention_mask, labels, token_type_ids   (classifier, encoder):
                   encoder_batch(texts) from EncodedText, what Tokenizer.encode gives; a long
                   text read in windows is a row per window (``owner``), ``pooled`` after
    PairBatch      anchor, positive, negative: EncoderBatches   (sentence embeddings)

Torch-free until a batch is made: the ``*_arrays`` builders give NumPy batches (the NumPy
reference trains on them), ``to_torch()`` the same values as tensors. Masks: True = real token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tformer.text.prefix import is_cut
from tformer.text.specials import PAD

if TYPE_CHECKING:
    from torch import Tensor

# Prediction sorts the examples of this many batches by length together: a batch pads little and
# its rows finish decoding together, while the command line still prints every few hundred inputs.
SORT_WINDOW = 16
# Under a deadline, predictions are sorted by length within windows of this many batches, so that
# what is done when it comes is a prefix but for the window it cuts (at most this many batches'
# work lost). Unsorted, a validation of short package summaries (12.5 tokens on average, up to 64)
# padded each batch of 64 to its longest.
DEADLINE_WINDOW = 4


def prediction_windows(n: int, batch_size: int, deadline: bool, first: int) -> Iterator[tuple[int, int]]:
    """(start, end) of the windows prediction sorts `n` examples in, in order: SORT_WINDOW
    batches each; under a `deadline`, a window of its `first` examples (a batch that runs
    whatever the time), then DEADLINE_WINDOW batches each."""
    start = min(n, batch_size, first) if deadline else 0
    if start:
        yield 0, start
    size = batch_size * (DEADLINE_WINDOW if deadline else SORT_WINDOW)
    for s in range(start, n, size):
        yield s, min(s + size, n)


def done_prefix(preds: list) -> list:
    """A window's predictions before its first unfinished one (None)."""
    return preds[: next((i for i, p in enumerate(preds) if p is None), len(preds))]


def pad_arrays(rows: list[list[int]], value: int = PAD) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id lists -> (ids (B, L) int64, mask (B, L) bool, True = real token)."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), value, dtype=np.int64)  # (B, L)
    mask = np.zeros((len(rows), width), dtype=bool)  # (B, L)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = True
    return ids, mask


def pad(rows: list[list[int]], value: int = PAD) -> tuple[Tensor, Tensor]:
    """Right-pad id lists -> (ids (B, L) long, mask (B, L) bool) as torch tensors."""
    import torch  # here, so that the NumPy side imports this module without torch

    ids, mask = pad_arrays(rows, value)
    return torch.from_numpy(ids), torch.from_numpy(mask)


class _Batch:
    def to_torch(self):
        """The same batch with every NumPy array as a tensor (sharing memory)."""
        import torch  # here, so that the NumPy side imports this module without torch

        def convert(value: Any) -> Any:
            if isinstance(value, np.ndarray):
                return torch.from_numpy(value)
            return value.to_torch() if isinstance(value, _Batch) else value

        return type(self)(**{f.name: convert(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def to(self, device):
        """The same batch with every tensor on `device`: to a CUDA GPU pinned and without
        blocking (to_device)."""
        def move(value: Any) -> Any:
            if isinstance(value, _Batch):
                return value.to(device)
            return None if value is None else to_device(value, device)

        return type(self)(**{f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)})


@dataclass
class Seq2SeqBatch(_Batch):
    """Padded tensors for teacher-forced training (masks: True = real token).

    src        (B, S) source ids + EOS
    src_mask   (B, S)
    tgt_in     (B, T) BOS + target ids: what the decoder reads
    tgt_mask   (B, T)
    labels     (B, T) target ids + EOS: what it must predict; PAD where padding
    """

    src: Tensor
    src_mask: Tensor
    tgt_in: Tensor
    tgt_mask: Tensor
    labels: Tensor

    def n_tokens(self) -> int:
        return int(self.src_mask.sum() + self.tgt_mask.sum())

    def n_examples(self) -> int:
        return len(self.src)


@dataclass
class EncoderBatch(_Batch):
    """Encoder inputs: input_ids, attention_mask (W, S); labels (B,) or None;
    token_type_ids (W, S) or None (segment A = 0, B = 1); owner (W,) or None: the text
    each row reads, where a long text is read in windows (tformer.text.windows), a row each,
    its rows together and in order (None: W = B, a row per text)."""

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor | None = None
    token_type_ids: Tensor | None = None
    owner: Tensor | None = None

    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def n_examples(self) -> int:
        return len(self.input_ids) if self.owner is None else int(self.owner[-1]) + 1

    def pooled(self, values: Tensor, how: str = "mean") -> Tensor:
        """The rows' outputs (logits, scores or vectors) as one per text: a text's windows'
        pooled (``mean``, ``max`` or the ``first`` window's), in at least float32; as they are
        where no text has windows. The mean of a text's rows sums them in order (deterministic
        on every device: no atomic adds).

        Shape:
            values (W, ...) -> (B, ...)
        """
        if self.owner is None:
            return values
        owner = self.owner.to(values.device)
        values = values if values.dtype.is_floating_point and values.element_size() >= 4 else values.float()
        counts = owner.bincount(minlength=self.n_examples())  # (B,) windows per text
        starts = counts.cumsum(0) - counts  # (B,) each text's first row
        if how == "first":
            return values[starts]
        # (B, K) the rows of each text, padded with its first: K = the most windows of a text
        k = owner.new_tensor(list(range(int(counts.max()))))
        real = k[None, :] < counts[:, None]  # (B, K)
        rows = values[(starts[:, None] + k[None, :]).where(real, starts[:, None])]  # (B, K, ...)
        real = real.view(*real.shape, *[1] * (values.dim() - 1))
        if how == "mean":
            return (rows * real).sum(1) / counts.view(-1, *[1] * (values.dim() - 1)).to(values.dtype)
        if how == "max":
            return rows.amax(1)  # (the padding repeats a real row: it never wins alone)
        raise ValueError(f"how: expected mean, max or first, got {how!r}")


@dataclass
class PairBatch(_Batch):
    """Embedding training: anchors and positives, row-aligned; hard negatives (of the rows
    that have one) as extra candidates."""

    anchor: EncoderBatch
    positive: EncoderBatch
    negative: EncoderBatch | None = None

    def n_tokens(self) -> int:
        return sum(b.n_tokens() for b in (self.anchor, self.positive, self.negative) if b is not None)

    def n_examples(self) -> int:
        return self.anchor.n_examples()


@dataclass
class EncodedText:
    """One text as a model reads it: ids with the tokenizer's specials, token types (None for a
    model without them), and ``full``: its token count before any cut (None: not cut). A long
    text read in windows (tformer.text.windows): ids is its first, ``rest`` the others, and
    ``read`` the tokens they read (specials once; None: len(ids))."""

    ids: list[int]
    type_ids: list[int] | None
    full: int | None = None
    rest: tuple[EncodedText, ...] = ()
    read: int | None = None

    @property
    def truncated(self) -> bool:
        """Cut: more tokens than it reads, or read only to its reach (tformer.text.prefix.Unread)."""
        return self.full is not None and is_cut(self.full, len(self.ids) if self.read is None else self.read)

    @property
    def windows(self) -> list[EncodedText]:
        """Each window as a text of its own (one: the text itself, where it has no others)."""
        if not self.rest:
            return [self]
        return [EncodedText(self.ids, self.type_ids), *self.rest]

    @property
    def tokens(self) -> int:
        """The tokens the model runs for it: every window's."""
        return len(self.ids) + sum(len(w.ids) for w in self.rest)


def seq2seq_arrays(sources: list[list[int]], targets: list[list[int]], bos: int, eos: int,
                   pad_id: int = PAD) -> Seq2SeqBatch:
    """Source ids (EOS included) and target ids (no specials) -> a NumPy Seq2SeqBatch."""
    src, src_mask = pad_arrays(sources, pad_id)
    tgt_in, tgt_mask = pad_arrays([[bos] + t for t in targets], pad_id)
    labels, _ = pad_arrays([t + [eos] for t in targets], pad_id)
    return Seq2SeqBatch(src, src_mask, tgt_in, tgt_mask, labels)


def encoder_arrays(ids: list[list[int]], pad_id: int = PAD, labels: list[int] | None = None,
                   type_ids: list[list[int]] | None = None, owner: list[int] | None = None) -> EncoderBatch:
    """Encoder id lists (specials included) -> a NumPy EncoderBatch (owner: each row's text)."""
    input_ids, mask = pad_arrays(ids, pad_id)
    types = pad_arrays(type_ids, 0)[0] if type_ids is not None else None
    label_array = np.array(labels, dtype=np.int64) if labels is not None else None  # (B,)
    owners = np.array(owner, dtype=np.int64) if owner is not None else None  # (W,)
    return EncoderBatch(input_ids, mask, label_array, types, owners)


def encoder_batch(texts: list[EncodedText], pad_id: int = PAD,
                  labels: list[int] | None = None) -> EncoderBatch:
    """Encoded texts, padded to the longest: a torch EncoderBatch (token types where every text
    has them); a text read in windows is a row per window (``owner`` says whose)."""
    rows = [w for t in texts for w in t.windows]
    owner = [i for i, t in enumerate(texts) for _ in t.windows] if len(rows) > len(texts) else None
    types = None if any(t.type_ids is None for t in rows) else [t.type_ids for t in rows]
    return encoder_arrays([t.ids for t in rows], pad_id, labels, types, owner).to_torch()


def to_device(tensor, device):
    """`tensor` on `device`. A host tensor bound for a CUDA GPU is pinned first (page-locked, as
    its DMA engines need) and copied without blocking: the host goes on queueing work while the
    copy runs, and kernels that read it wait for it on the same stream."""
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
