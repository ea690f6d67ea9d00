"""Scaled dot-product attention and multi-head attention (Vaswani et al. 2017, §3.2).

Shape legend: B batch, T query length, S key length, N packed tokens, D model dim, H heads,
Dh head dim. Masks are a ``tformer.nn.masks.Mask`` (or, for these leaf functions, a bool tensor
broadcastable to (B, H, T, S)); True = may attend.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from tformer.config import check_positive, check_probability
from tformer.nn import kernels
from tformer.nn.dropout import dropout
from tformer.nn.inputs import check_embeddings
from tformer.nn.kernels.tracing import tracing
from tformer.nn.masks import Mask, Packing, as_mask

KeyValue = tuple[Tensor, Tensor]  # cached (k, v), each (B, H, S, Dh)


def with_room(cache: Tensor, capacity: int) -> Tensor:
    """Cached keys or values, copied to the start of a buffer with room for ``capacity``
    positions: the view of the filled ones, which ``append_positions`` extends in place.

    The buffer belongs to one line of decoding (a search): each step writes its keys into the
    room, so two steps from the same cache would write the same positions.

    Shape: cache (B, H, L, Dh) -> (B, H, L, Dh), a view of a (B, H, max(capacity, L), Dh) buffer
    """
    b, h, length, dh = cache.shape
    buffer = cache.new_empty(b, h, max(capacity, length), dh)
    buffer[:, :, :length] = cache
    return buffer[:, :, :length]


def append_positions(past: Tensor, new: Tensor) -> Tensor:
    """The cached keys (or values) followed by the new ones: in place when ``past`` has room
    after its last position (``with_room``), so a decoding step copies its own keys only, where
    torch.cat copies the whole cache every step (at Marian's size, 256 beams, 13% of a beam
    search on an Intel Xeon); else torch.cat. The same values either way.

    Room is read from the strides (inference mode keeps no record of what a view was cut
    from): a slice ``k[:, :, :n]`` of a longer cache has room too, and its positions from n on
    would be written over, so pass a cache whose room is free, as ``with_room`` makes it.

    Shape: past (B, H, L, Dh), new (B, H, T, Dh) -> (B, H, L + T, Dh)
    """
    b, h, length, dh = past.shape
    grown_shape = (b, h, length + new.size(2), dh)
    if why_not_in_place(past, grown_shape) is not None:
        return torch.cat([past, new], dim=2)
    grown = past.as_strided(grown_shape, past.stride())  # past's positions, then the room
    room = grown[:, :, length:]
    if (new.data_ptr(), new.stride()) != (room.data_ptr(), room.stride()):  # else already there
        room.copy_(new)
    return grown


def why_not_in_place(past: Tensor, grown_shape: tuple[int, int, int, int]) -> str | None:
    """Why the cache ``past`` cannot grow to ``grown_shape`` in place, or None when it can."""
    if tracing():  # first: the storage questions below would break a compiler's graph
        return "compilers and exporters record torch.cat, not a write into an input"
    b, h, length, dh = grown_shape
    s0, s1, s2, s3 = past.stride()
    if s3 != 1 or s2 != dh:
        return "positions not laid out one after another (a view of a projection's output)"
    if s1 < length * s2 or s0 < h * s1:
        return "no room after the last position: the next head's or row's positions follow"
    end = past.storage_offset() + (b - 1) * s0 + (h - 1) * s1 + length * s2  # one past the last
    if end * past.element_size() > past.untyped_storage().nbytes():
        return "no room after the last position: the storage ends"
    return None


def attend_past_and_new(q: Tensor, past: KeyValue, k: Tensor, v: Tensor, mask: Mask | None,
                        dropout_p: float, need_weights: bool
                        ) -> tuple[Tensor, Tensor | None, KeyValue]:
    """Attention to the cached positions followed by the new ones, the cache left as it is
    (``grow_cache=False``: the caller stores the new keys and values itself).

    Run eagerly on a cache with room (``with_room``), the new positions are written into the
    room, after the cache's last position, and attended as a grown cache is (the caller's
    append then finds them there). Where the room cannot be written (a compiled step: inductor
    does not write into an input's room), one query a row and unmasked (a decoding step), the
    scores of the past block and of the new position share one maximum and one sum, as flash
    attention merges blocks of keys (Dao et al. 2022): the cache is read where it is, not copied
    (kernels.attention_past_and_new). Anything else attends to the two concatenated, a copy.

    Shape: q, k, v (B, H, T, Dh); past (B, H, L, Dh) each; mask broadcastable to (B, H, T, L + T)
        -> output (B, H, T, Dh), weights (B, H, T, L + T) or None, the new (k, v)
    """
    past_k, past_v = past
    length = past_k.size(2)
    if not tracing():  # append_positions: into the room (or a copy where there is none)
        k_all, v_all = append_positions(past_k, k), append_positions(past_v, v)  # (B, H, L + T, Dh)
        out, weights = scaled_dot_product_attention(q, k_all, v_all, mask, dropout_p, need_weights)
        return out, weights, (k_all[:, :, length:], v_all[:, :, length:])  # the room's views
    if q.size(2) == 1 and mask is None and dropout_p == 0.0 and not need_weights and length:
        check_qkv(q, past_k, past_v, None)
        return kernels.attention_past_and_new(q, past_k, past_v, k, v), None, (k, v)
    out, weights = scaled_dot_product_attention(q, torch.cat([past_k, k], dim=2),
                                                torch.cat([past_v, v], dim=2), mask, dropout_p, need_weights)
    return out, weights, (k, v)


def check_qkv(q: Tensor, k: Tensor, v: Tensor, mask: Mask | None) -> None:
    """One line naming the argument for mis-shaped inputs, not torch's matmul or broadcasting
    error (the same words as tformer.reference). Shape comparisons only: it runs every call.
    Shape: q (B, H, T, Dh); k, v (B, H, S, Dh); mask broadcastable to (B, H, T, S)."""
    for name, x, n in (("q", q, "T"), ("k", k, "S")):
        if x.dim() != 4:
            raise ValueError(f"{name}: expected shape (B, H, {n}, Dh), got {tuple(x.shape)}")
    (b, h, t, dh), s = q.shape, k.shape[2]
    for name, x in (("k", k), ("v", v)):
        if x.shape != (b, h, s, dh):
            raise ValueError(f"{name}: expected shape (B, H, S, Dh) = {(b, h, s, dh)}, got {tuple(x.shape)}")
    allowed = () if mask is None else tuple(mask.allowed.shape)
    trailing = (b, h, t, s)[4 - len(allowed) :] if len(allowed) <= 4 else None
    # (m != 1 and m != n, not m not in (1, n): traced, a size's membership in a tuple was False)
    if trailing is None or any(m != 1 and m != n for m, n in zip(allowed, trailing, strict=True)):
        raise ValueError(f"mask: expected a shape broadcastable to (B, H, T, S) = {(b, h, t, s)}, "
                         f"got {allowed}")


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(Dh)) v  (§3.2.1).

    A query row whose mask allows no key returns zeros (and zero weights), never NaN.
    Without ``need_weights`` a fused kernel may compute the same numbers (tformer.nn.kernels says
    when); this explicit formula is the only one.

    Shape:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh); mask: broadcastable to (B, H, T, S)
        returns: output (B, H, T, Dh) and weights (B, H, T, S) or None
    """
    mask = as_mask(mask)
    check_qkv(q, k, v, mask)
    allowed = None if mask is None else mask.allowed
    if kernels.why_not_fused_attention(q, k, dropout_p, need_weights) is None:
        out = kernels.attention(q, k, v, allowed, dropout_p)
        if mask is not None and mask.has_empty_rows:
            out = out.masked_fill(mask.attends_nothing, 0.0)  # whatever the kernel gave there
        return out, None
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if allowed is not None:
        # finfo.min, not -inf: an all-blocked row then softmaxes to finite values that
        # are zeroed below, so no NaN reaches the forward or the backward pass.
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    if allowed is not None:
        weights = weights.masked_fill(mask.attends_nothing, 0.0)
    out = dropout(weights, dropout_p) @ v  # (B, H, T, Dh)
    return out, (weights if need_weights else None)


def _queries_per_memory_row(queries: int, memory_rows: int) -> int:
    """How many consecutive query rows share each memory row: 1, or the beams of one source in
    beam search (tformer.nn.generate), which attend to its memory row once, as one group of
    queries, instead of to K identical copies of it."""
    if memory_rows < 1 or queries % memory_rows:
        raise ValueError(f"memory: expected a batch that divides the query batch ({queries}), "
                         f"got {memory_rows}")
    return queries // memory_rows


def _group(q: Tensor, g: int) -> Tensor:
    """(Bm * g, H, T, X) -> (Bm, H, g * T, X): the queries of g consecutive rows as one row's."""
    if g == 1:
        return q
    bg, h, t, x = q.shape
    return q.view(bg // g, g, h, t, x).transpose(1, 2).reshape(bg // g, h, g * t, x)


def _ungroup(out: Tensor, g: int) -> Tensor:
    """The inverse of ``_group``: (Bm, H, g * T, X) -> (Bm * g, H, T, X)."""
    if g == 1:
        return out
    b, h, gt, x = out.shape
    return out.view(b, h, g, gt // g, x).transpose(1, 2).reshape(b * g, h, gt // g, x)


class AttentionOutput(NamedTuple):
    output: Tensor  # (B, T, D)
    weights: Tensor | None  # (B, H, T, S) when requested
    present: KeyValue | None  # (k, v) to cache when requested


class MultiHeadAttention(nn.Module):
    """Multi-head attention (§3.2.2).

    Self-attention projects q, k, v with one fused (D, 3D) matrix; cross-attention
    (``cross=True``) projects q from the decoder and k, v from the encoder memory. A memory of
    Bm rows may serve B = g * Bm query rows, g consecutive rows each (beam search's beams of one
    source): each memory row's keys and values are then computed and read once for its g rows.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        cross: bool = False,
    ) -> None:
        super().__init__()
        check_positive("d_model", d_model)
        check_positive("n_heads", n_heads)
        check_probability("dropout", dropout)
        if d_model % n_heads:
            raise ValueError(
                f"d_model: expected a multiple of n_heads ({n_heads}), got {d_model}"
            )
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout, self.cross = dropout, cross
        if cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: Tensor, parts: int = 1) -> tuple[Tensor, ...]:
        """(B, N, parts * D) -> parts x (B, H, N, Dh), views of x."""
        b, n, _ = x.shape
        return x.view(b, n, parts, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Mask | Packing | Tensor | None = None,
        past_key_value: KeyValue | None = None,
        use_cache: bool = False,
        need_weights: bool = False,
        grow_cache: bool = True,
    ) -> AttentionOutput:
        """Attend from ``x`` to itself, or to ``memory`` when ``cross``.

        With a cache, self-attention appends the new keys/values to ``past_key_value`` (into
        its room, in place, when it has some: ``with_room``); with ``grow_cache=False`` it
        leaves the cache as it is and ``present`` holds the new positions' keys/values only
        (a compiled decoding step returns them: it cannot write into its input's room);
        cross-attention reuses it instead of projecting ``memory`` again. With a ``Packing``
        for a mask, ``x`` is a packed batch of real tokens (see ``Encoder.forward``): attention
        then runs within each sequence, as the packing describes them.

        Shape:
            x: (B, T, D), or packed (rows, D) with a Packing; memory: (Bm, S, D), Bm dividing B;
            mask: broadcastable to (B, H, T, S) (cross-attention: to (Bm, H, T, S))
            returns output like x, weights (B, H, T, S) or None, present (k, v) or None
        """
        p = self.dropout if self.training else 0.0
        if isinstance(mask, Packing):
            out = self._packed_self_attention(kernels.linear(x, self.qkv_proj), mask, p)
            return AttentionOutput(kernels.linear(out, self.out_proj), None, None)
        check_embeddings(x, self.d_model, "x")
        if memory is not None:
            check_embeddings(memory, self.d_model, "memory")
        mask = as_mask(mask)
        g = 1  # query rows per memory row
        if self.cross:
            (q,) = self._split_heads(kernels.linear(x, self.q_proj))  # (B, H, T, Dh)
            if past_key_value is not None:
                k, v = past_key_value  # memory's keys/values, computed at step 0
            else:
                if memory is None:
                    raise ValueError("memory: cross-attention needs the encoder output")
                k, v = self._split_heads(kernels.linear(memory, self.kv_proj), 2)  # (Bm, H, S, Dh)
            g = _queries_per_memory_row(q.size(0), k.size(0))
            q = _group(q, g)  # (Bm, H, g * T, Dh)
        else:
            q, k, v = self._split_heads(kernels.linear(x, self.qkv_proj), 3)  # 3 x (B, H, T, Dh)
            if past_key_value is not None and not grow_cache:  # present: the new k, v only
                out, weights, new = attend_past_and_new(q, past_key_value, k, v, mask, p, need_weights)
                return self._output(out, weights, g, new if use_cache else None)
            if past_key_value is not None:
                k = append_positions(past_key_value[0], k)  # (B, H, S_past + T, Dh)
                v = append_positions(past_key_value[1], v)
        out, weights = scaled_dot_product_attention(q, k, v, mask, p, need_weights)
        return self._output(out, weights, g, (k, v) if use_cache else None)

    def _output(self, out: Tensor, weights: Tensor | None, g: int, present: KeyValue | None
                ) -> AttentionOutput:
        """The heads joined and projected (§3.2.2), the weights and the cache to return.

        Shape: out (B / g, H, g * T, Dh) -> output (B, T, D)
        """
        out, weights = _ungroup(out, g), None if weights is None else _ungroup(weights, g)
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, self.d_model)  # (B, T, D)
        return AttentionOutput(kernels.linear(out, self.out_proj), weights, present)

    def _packed_self_attention(self, qkv: Tensor, packing: Packing, dropout_p: float) -> Tensor:
        """Attention within each sequence of a packed batch, one call per group of equal lengths.

        Shape: qkv (rows, 3D) -> (rows, D): N real tokens, then zero rows (see Packing)
        """
        qkv = qkv.to(self._packed_dtype(qkv, packing, dropout_p))  # once a layer, not per group
        if torch.is_grad_enabled() and qkv.requires_grad:
            return self._packed_for_autograd(qkv, packing, dropout_p)
        # Each group's heads are written straight to their rows: one copy, not a reshape, a
        # concatenation and the zero rows appended, each a pass over the layer's tokens.
        out = qkv.new_empty(packing.rows, self.d_model)  # (rows, D)
        out[packing.index.numel() :] = 0.0
        start = 0
        for length, count in packing.groups:
            block = qkv[start : start + count * length].view(count, length, 3 * self.d_model)
            q, k, v = self._split_heads(block, 3)  # 3 x (count, H, L, Dh), in the layer's dtype
            heads = kernels.attention_as_is(q, k, v) if dropout_p == 0.0 else \
                scaled_dot_product_attention(q, k, v, None, dropout_p)[0]  # (count, H, L, Dh)
            rows = out[start : start + count * length].view(count, length, self.n_heads, -1)
            rows.copy_(heads.transpose(1, 2))  # (count, L, H, Dh)
            start += count * length
        return out

    def _packed_for_autograd(self, qkv: Tensor, packing: Packing, dropout_p: float) -> Tensor:
        """``_packed_self_attention`` where autograd records it: one call per bucket of groups of
        lengths, each padded to its longest where that costs less than the calls it saves
        (Packing.buckets: 32 short texts came in 16 groups, and each call is ~25 operators
        forward and backward), split apart once and concatenated once. (Writing into slices of
        one tensor, as inference does, costs a pass over the layer's tokens per group backward:
        each slice's gradient is a zero tensor of the whole input.)

        Shape: qkv (rows, 3D) -> (rows, D): N real tokens, then zero rows (see Packing)
        """
        call = kernels.attention_call_scores(self.n_heads, self.head_dim, dropout_p, qkv.device)
        buckets = packing.buckets(call, self.n_heads)
        sizes = [b.rows for b in buckets]
        blocks = qkv.split([*sizes, qkv.size(0) - sum(sizes)])  # the buckets, then the zero rows
        outs = []
        for b, block in zip(buckets, blocks, strict=False):
            if b.index is not None:  # (count * length, 3D) with zero rows where a sequence is shorter
                block = block.new_zeros(b.count * b.length, block.size(1)).index_copy(0, b.index, block)
            q, k, v = self._split_heads(block.view(b.count, b.length, 3 * self.d_model), 3)
            heads, _ = scaled_dot_product_attention(q, k, v, b.keys, dropout_p)  # (count, H, L, Dh)
            heads = heads.to(qkv.dtype).transpose(1, 2).reshape(b.count * b.length, self.d_model)
            outs.append(heads if b.index is None else heads.index_select(0, b.index))
        outs.append(qkv.new_zeros(qkv.size(0) - sum(sizes), self.d_model))
        return torch.cat(outs)  # (rows, D)

    def _packed_dtype(self, qkv: Tensor, packing: Packing, dropout_p: float) -> torch.dtype:
        """The dtype a layer's packed attention computes in (kernels.attention_dtype): with
        dropout as any attention with dropout; else the one chosen for its group of most tokens.
        Under autocast with dropout on CPU, the values as they are: the explicit softmax takes
        them, and autocast multiplies in bf16 whatever it is given (fp32 copies of bf16 values
        were converted back per bucket: ~20 ms of a 300 ms MiniLM fine-tune step in casts)."""
        if (dropout_p > 0.0 and torch.is_autocast_enabled(qkv.device.type)
                and kernels.why_not_fused_attention(qkv, qkv, dropout_p, False) is not None):
            return qkv.dtype  # (the same numbers: bf16 -> fp32 -> bf16 is exact)
        if dropout_p > 0.0 or qkv.dtype != torch.bfloat16:
            return kernels.attention_dtype(qkv)
        starts = itertools.accumulate((n * c for n, c in packing.groups), initial=0)  # rows before each
        start, (length, count) = max(zip(starts, packing.groups, strict=False),
                                     key=lambda at: at[1][0] * at[1][1])  # the group of most tokens
        block = qkv[start : start + count * length].view(count, length, 3 * self.d_model)
        return kernels.attention_dtype(*self._split_heads(block, 3))  # from (count, H, L, Dh) each
