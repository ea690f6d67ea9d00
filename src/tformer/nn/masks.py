"""Every attention mask is built here. One convention: boolean, True = may attend.

Inputs users bring:
- ``attention_mask`` (B, S): True/1 = real token, False/0 = padding (HuggingFace's polarity).
- ``attn_mask`` broadcastable to (B, T, S): True = query t may attend key s.
Converters take the other conventions at the boundary: PyTorch's ``key_padding_mask``
(True = pad) and additive float masks (0 = attend, -inf = blocked). PyTorch's boolean
``attn_mask`` of nn.MultiheadAttention / nn.Transformer is True = blocked too: pass ``~attn_mask``
(F.scaled_dot_product_attention's is True = may attend, as ours).

``make_mask`` turns them, once, into a ``Mask``: the one object layers, pooling and the
classifier consume. It holds what attention needs (``allowed``, and lazily the rows that may
attend nothing) and what unpadded execution needs (lazily, the real tokens' index and the
groups of equal lengths). Nothing downstream converts a mask again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from tformer.nn.kernels.tracing import values_readable

# Additive masks mark blocked entries with -inf or a very negative finite value
# (HuggingFace uses finfo.min); anything at or below this counts as blocked.
_ADDITIVE_BLOCKED = -1e4


def from_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """PyTorch's ``key_padding_mask`` (True = pad) -> ``attention_mask`` (True = real)."""
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask: expected a bool tensor (True = pad), got {key_padding_mask.dtype}"
            + ("; a float one is additive: convert it with from_additive_mask"
               if key_padding_mask.is_floating_point() else "")
        )
    return ~key_padding_mask


def from_hf_attention_mask(attention_mask: Tensor) -> Tensor:
    """HuggingFace ``attention_mask`` (1 = real, 0 = pad; int, float or bool) -> bool (True = real)."""
    if attention_mask.dtype == torch.bool:
        return attention_mask
    _check_zero_one(attention_mask, "attention_mask")
    return attention_mask != 0


def _check_zero_one(mask: Tensor, name: str) -> None:
    """Refuse a mask holding anything but 0 and 1 (token ids passed by mistake, a -1 sentinel,
    a soft weight), naming the first such value. Skipped where values cannot be read (tracing)."""
    if not values_readable(mask):
        return
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        value = mask[bad][0].item()
        raise ValueError(f"{name}: expected only 0 and 1 (or bool; 1 = may attend), got {value}")


def from_additive_mask(mask: Tensor) -> Tensor:
    """Additive float mask (0 = attend, -inf or very negative = blocked) -> bool (True = attend).

    A mask holding other values is a bias, not a mask, and cannot be converted.
    """
    if not mask.is_floating_point():
        raise TypeError(f"mask: expected a float additive mask, got {mask.dtype}")
    blocked = mask <= _ADDITIVE_BLOCKED
    if not bool(((mask == 0) | blocked).all()):
        if bool(((mask == 0) | (mask == 1)).all()):  # HF's polarity, not an additive mask
            raise ValueError("mask: expected an additive mask (0 = attend, -inf = blocked), got "
                             "one of only 0 and 1 (1 = attend): convert it with from_hf_attention_mask")
        raise ValueError(
            "mask: an additive mask must hold only 0 (attend) and -inf or <= -1e4 (blocked); "
            "this one holds other values (a bias), which a boolean mask cannot express"
        )
    return ~blocked


def causal_mask(t: int, s: int | None = None, device: torch.device | None = None) -> Tensor:
    """(T, S) bool: query t may attend key s iff s <= t + (S - T).

    With a key/value cache the T new queries are the *last* T of S positions, so the
    diagonal shifts right by S - T (Vaswani et al. 2017, §3.2.3: no attending to the future).
    """
    s = t if s is None else s
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def as_bool(mask: Tensor, name: str) -> Tensor:
    """Accept bool or 0/1 integer masks in our polarity; reject floats (likely additive) and
    integers other than 0 and 1 (likely token ids)."""
    if not isinstance(mask, Tensor):  # a list or an array: a bare AttributeError on .dtype
        raise TypeError(f"{name}: expected a torch.Tensor mask (bool, True = may attend), got "
                        f"{type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point():
        raise TypeError(
            f"{name}: expected a bool or 0/1 integer mask (True = may attend), got {mask.dtype}; "
            "convert a 0/1 float mask with tformer.nn.masks.from_hf_attention_mask, an additive "
            "one with from_additive_mask"
        )
    _check_zero_one(mask, name)
    return mask != 0


# Packed row counts are rounded up to this: oneDNN keeps a primitive (with its reordered
# weights) per distinct row count, so exact counts would grow memory with every new batch.
PACK_ROWS_MULTIPLE = 64


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a padded batch are, for running the layers on them only.

    Sequences are sorted by length, so each group of equal lengths is one contiguous
    (count * length, D) block of the packed tokens that attention processes as a batch.
    The packed tensor has ``rows`` >= N rows: the real tokens, then zero rows up to a
    multiple of PACK_ROWS_MULTIPLE (they stay out of attention and are dropped on unpacking).

    Shape: index (N,) into the flattened (B * S) positions, in sorted-sequence order
    """

    index: Tensor
    groups: tuple[tuple[int, int], ...]  # (length, count), lengths > 0, in packed order
    batch: int
    seq: int
    _known: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def rows(self) -> int:
        n = self.index.numel()
        return -(-n // PACK_ROWS_MULTIPLE) * PACK_ROWS_MULTIPLE

    def pad_rows(self, x: Tensor) -> Tensor:
        """(N, D) -> (rows, D) with zero rows appended."""
        extra = self.rows - x.size(0)
        return x if extra == 0 else torch.cat([x, x.new_zeros(extra, x.size(-1))])

    def pack(self, h: Tensor) -> Tensor:
        """(B, S, D) -> (rows, D): the real tokens, then zero rows."""
        return self.pad_rows(h.reshape(self.batch * self.seq, h.size(-1))[self.index])

    def unpack(self, x: Tensor) -> Tensor:
        """(rows, D) -> (B, S, D), zeros at padded positions."""
        out = x.new_zeros(self.batch * self.seq, x.size(-1))
        out[self.index] = x[: self.index.numel()]
        return out.view(self.batch, self.seq, x.size(-1))

    def buckets(self, call_scores: float, heads: int) -> tuple[Bucket, ...]:
        """The groups of lengths joined into runs, each padded to its longest, where that is
        cheaper: a run costs `call_scores` (an attention call's price in scores, measured by
        tformer.nn.kernels.attention_call_scores) plus its padded scores (sequences x longest^2
        x `heads`); the cheapest runs (dynamic programming over the sorted groups). A run of one
        group has no index: its rows are the group's as they are. Kept per (call_scores, heads):
        every layer of a forward asks.

        Shape: each Bucket's index (its rows,) into its (count * length) padded positions;
        keys (count, 1, 1, length) bool, True = a real token
        """
        key = (call_scores, heads)
        if key not in self._known:
            self._known[key] = self._buckets(call_scores, heads)
        return self._known[key]

    def _buckets(self, call_scores: float, heads: int) -> tuple[Bucket, ...]:
        lengths = [n for n, _ in self.groups]
        counts = [c for _, c in self.groups]
        best, cut = [0.0], [0]  # best[i]: the cheapest runs of groups[:i]; the last run starts at cut[i]
        for end in range(1, len(self.groups) + 1):
            longest, sequences = lengths[end - 1], 0
            best.append(math.inf)
            cut.append(end - 1)
            for start in range(end - 1, -1, -1):
                if start < end - 1 and heads * (longest**2 - lengths[start] ** 2) > call_scores:
                    break  # padding one sequence of it costs more than a call: so do all shorter
                sequences += counts[start]
                cost = best[start] + call_scores + heads * sequences * longest**2
                if cost < best[end]:
                    best[end], cut[end] = cost, start
        runs, end = [], len(self.groups)
        while end > 0:
            runs.append((cut[end], end))
            end = cut[end]
        buckets, row = [], 0
        for start, end in reversed(runs):
            longest, sequences = lengths[end - 1], sum(counts[start:end])
            rows = sum(n * c for n, c in self.groups[start:end])
            index = keys = None
            if end - start > 1:
                device = self.index.device
                offsets = torch.repeat_interleave(torch.tensor(lengths[start:end], device=device),
                                                  torch.tensor(counts[start:end], device=device))
                keys = torch.arange(longest, device=device) < offsets[:, None]  # (count, length)
                index = keys.flatten().nonzero().squeeze(1)
                keys = keys[:, None, None, :]
            buckets.append(Bucket(row, rows, sequences, longest, index, keys))
            row += rows
        return tuple(buckets)


class Bucket(NamedTuple):
    """A run of a Packing's groups that attention processes as one batch, padded to `length`
    (``Packing.buckets``): packed rows [start, start + rows) of `count` sequences."""

    start: int
    rows: int
    count: int
    length: int
    index: Tensor | None  # (rows,) the packed rows' padded positions; None: one length, no padding
    keys: Tensor | None  # (count, 1, 1, length) bool, True = a real key


class Mask:
    """An attention mask, made once by ``make_mask`` and consumed by every layer.

    ``allowed`` (B|1, 1, T|1, S) bool, True = query t may attend key s.
    ``padding`` (B, S) bool, True = real token, when the mask came from an ``attention_mask``
    over the queries' own sequence (encoder self-attention); it is what pooling and
    unpadded execution read. ``keys`` (B, S) bool, True = real key, whenever the mask came from
    an ``attention_mask``. Derived facts are computed on first use and kept (by hand, not
    functools.cached_property, whose lock torch.compile cannot trace).
    """

    def __init__(self, allowed: Tensor, padding: Tensor | None = None,
                 keys: Tensor | None = None) -> None:
        self.allowed, self.padding, self.keys = allowed, padding, keys
        self._known: dict[str, object] = {}

    def _once(self, name: str, compute):
        if name not in self._known:
            self._known[name] = compute()
        return self._known[name]

    @property
    def attends_nothing(self) -> Tensor:
        """(B|1, 1, T|1, 1) True for query rows that may attend no key (they output zeros)."""
        return self._once("attends_nothing", lambda: ~self.allowed.any(dim=-1, keepdim=True))

    @property
    def has_empty_rows(self) -> bool:
        """Whether any query may attend nothing: one device sync, once per mask. Where values
        cannot be read (tracing, the meta device) the answer is "maybe", so True."""
        if not values_readable(self.allowed):
            return True
        return self._once("has_empty_rows", lambda: bool(self.attends_nothing.any()))

    @property
    def has_padding(self) -> bool:
        """Whether any position is padding (one device sync, once per mask; eager only)."""
        return self.padding is not None and self._once(
            "has_padding", lambda: not bool(self.padding.all()))

    @property
    def lengths(self) -> Tensor:
        """(B,) real tokens per sequence."""
        return self._once("lengths", lambda: self.padding.sum(dim=1))

    @property
    def packing(self) -> Packing:
        """The real tokens' index and the groups of equal lengths (needs ``padding``; eager only)."""
        return self._once("packing", self._pack)

    def _pack(self) -> Packing:
        b, s = self.padding.shape
        order = torch.argsort(self.lengths, stable=True)  # (B,) shortest first
        flat = order[:, None] * s + torch.arange(s, device=order.device)  # (B, S) in sorted order
        index = flat[self.padding[order]]  # (N,)
        sizes, counts = torch.unique_consecutive(self.lengths[order], return_counts=True)
        pairs = zip(sizes.tolist(), counts.tolist(), strict=True)
        groups = tuple((size, count) for size, count in pairs if size > 0)  # empty rows: no work
        return Packing(index, groups, b, s)

    def zero_padding(self, h: Tensor) -> Tensor:
        """(B, S, D) with padded positions set to zero (a no-op without padding)."""
        if self.padding is None:
            return h
        return h.masked_fill(~self.padding[..., None], 0.0)

    def zero_padded_keys(self, x: Tensor) -> Tensor:
        """(B, L, D) with the positions of padded keys set to zero, x holding the last L of the
        S key positions (a decoder's new ones after its cache); a no-op without ``keys``.

        A blocked key gets weight 0, but 0 x NaN is NaN: a NaN or inf stored at padding (in
        embeddings passed in) would reach the real tokens through weights @ v on the padded
        paths. The models call this once, on their inputs.
        """
        if self.keys is None:
            return x
        real = self.keys[:, self.keys.size(1) - x.size(1) :]  # (B, L)
        return x.masked_fill(~real[..., None], 0.0)


def as_mask(mask: Mask | Tensor | None) -> Mask | None:
    """Accept a ready ``Mask`` or a bool tensor broadcastable to (B, H, T, S) (leaf modules)."""
    if mask is None or isinstance(mask, Mask):
        return mask
    return Mask(as_bool(mask, "mask"))


def make_mask(
    attention_mask: Tensor | None,
    attn_mask: Tensor | None,
    batch: int,
    t: int,
    s: int,
    causal: bool = False,
    device: torch.device | None = None,
    name: str = "attention_mask",
) -> Mask | None:
    """Combine padding, general and causal masks into one ``Mask``, or None for no mask.

    Args:
        attention_mask: (B, S) keys that are real tokens.
        attn_mask: broadcastable to (B, T, S); True = query t may attend key s.
        causal: also forbid attending to later positions (decoder self-attention).
        device: where the mask should live (the activations' device).
        name: the padding mask's argument, as its errors name it.
    """
    allowed: Tensor | None = None
    padding: Tensor | None = None
    if attention_mask is not None:
        padding = as_bool(attention_mask, name).to(device)
        if padding.shape != (batch, s):
            raise ValueError(
                f"{name}: expected shape (B, S) = ({batch}, {s}), got {tuple(padding.shape)}"
                + ("; pass a (B, 1, T, S) mask as attn_mask" if padding.ndim == 4 else "")
            )
        allowed = padding[:, None, None, :]  # (B, 1, 1, S)
    if attn_mask is not None:
        attn_mask = as_bool(attn_mask, "attn_mask").to(device)
        if attn_mask.dim() == 2:
            attn_mask = attn_mask[None]  # (1, T, S)
        elif attn_mask.dim() == 4 and attn_mask.shape[1] == 1:
            attn_mask = attn_mask[:, 0]  # (B|1, 1, T|1, S): HF's extended mask, one for all heads
        ok = attn_mask.dim() == 3 and all(
            a in (1, b) for a, b in zip(attn_mask.shape, (batch, t, s), strict=True)
        )
        if not ok:
            raise ValueError(
                f"attn_mask: expected a shape broadcastable to (B, T, S) = ({batch}, {t}, {s}) "
                f"or (B, 1, T, S), got {tuple(attn_mask.shape)}"
            )
        general = attn_mask[:, None]  # (B|1, 1, T|1, S|1)
        allowed = general if allowed is None else allowed & general
    if causal:
        future = causal_mask(t, s, device=device)[None, None]  # (1, 1, T, S)
        allowed = future if allowed is None else allowed & future
    if allowed is None:
        return None
    # Padding describes the queries too only when they are the keys' own positions.
    return Mask(allowed, padding if t == s and not causal else None, padding)
