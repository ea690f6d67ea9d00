"""The decoder's key/value cache during a search (tformer.nn.generate): room to grow in place,
beams reordered, finished rows dropped.

A cache is one ``LayerCache`` per decoder layer: self-attention (k, v), then cross-attention
(k, v), each (rows, H, positions, Dh). The self-attention ones grow a position a step (into their
room: tformer.nn.attention.with_room); the cross-attention ones hold the memory's projections,
one row per source, which the K beams of that source share.

Shape legend: B batch, K beams, H heads, L positions, Dh head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tformer.nn.attention import append_positions, with_room
from tformer.nn.layers import LayerCache

Cache = tuple[LayerCache, ...]


def reorder_cache(cache: Cache, beam: Tensor) -> Cache:
    """Keep the self-attention caches of the surviving beams: row i becomes row beam[i], in
    place (the step's caches are new tensors that only this search holds), and only the rows
    whose beam changed are copied, not the whole cache (keep_rows).

    The cross-attention keys/values are left as they are: they depend on the source only, and
    the beams of a source share its one row of them (MultiHeadAttention).
    """
    keep_rows([t for layer in cache for t in layer[:2]], beam)
    return cache


def stay_in_place(parent: Tensor, ranked: Tensor) -> Tensor:
    """``ranked``, each source's next beams best first, in an order in which as few cache rows
    move as can: a parent's best child takes the parent's own beam slot (its row stays where it
    is), the other children fill the slots left free, best first. Beams best first moved 35-48%
    of the rows a step in beam 4 searches of random models, this order 21-24%.

    Shape: parent (B', K): the beam (within its source) each next beam continues, best first;
    ranked (B', K) -> (B', K) ranked's entries, slot s holding the beam that goes there
    """
    k = parent.size(1)
    same = parent[:, :, None] == parent[:, None, :]  # (B', K, K)
    first = ~(same & torch.ones(k, k, dtype=torch.bool, device=parent.device).tril(-1)).any(dim=-1)
    taken = (parent[:, :, None] == torch.arange(k, device=parent.device)).any(dim=1)  # (B', K) slots
    free = torch.sort(taken, dim=-1, stable=True).indices  # (B', K) free slots first, in order
    younger = torch.sort(first, dim=-1, stable=True).indices  # (B', K) the other children first
    slot = torch.where(first, parent, torch.empty_like(parent).scatter_(1, younger, free))
    return torch.empty_like(ranked).scatter_(1, slot, ranked)


def self_bytes(cache: Cache) -> int:
    """The bytes of the self-attention keys and values in use (what reordering every row moves)."""
    return sum(2 * self_k.numel() * self_k.element_size() for self_k, *_ in cache)


def grow(cache: Cache, new: Cache) -> Cache:
    """Each layer's self-attention keys/values followed by a step's new positions (``new``, as
    ``model.decode(..., grow_cache=False)`` returns them), in place into their room
    (append_positions); the cross-attention ones as they are.

    Shape: cache (rows, H, L, Dh) each, new (rows, H, T, Dh) -> (rows, H, L + T, Dh)
    """
    return tuple((append_positions(self_k, new_k), append_positions(self_v, new_v), cross_k, cross_v)
                 for (self_k, self_v, cross_k, cross_v), (new_k, new_v, *_) in zip(cache, new, strict=True))


def with_room_all(cache: Cache, capacity: int) -> Cache:
    """Every layer's self-attention keys/values copied into buffers with room for ``capacity``
    positions, which the next steps fill in place; the cross-attention ones contiguous (views of
    the memory's projection before: one layout for every step, as select_beams leaves them, so
    that a compiled step is not compiled again for another)."""
    return tuple((with_room(self_k, capacity), with_room(self_v, capacity), cross_k.contiguous(),
                  cross_v.contiguous()) for self_k, self_v, cross_k, cross_v in cache)


def select_rows(cache: Cache, index: Tensor) -> Cache:
    """Keep the rows `index` (batch on dim 0) of every layer's self- and cross-attention cache,
    in place (keep_rows): the self-attention ones keep their room."""
    kept = iter(keep_rows([t for layer in cache for t in layer], index))
    return tuple(tuple(next(kept) for _ in layer) for layer in cache)


def select_beams(cache: Cache, beams: Tensor, rows: Tensor) -> Cache:
    """Keep the beams `beams` of the self-attention caches and the source rows `rows` of the
    cross-attention ones (one row per source), in place (keep_rows): the self-attention ones keep
    their room."""
    selves = iter(keep_rows([t for layer in cache for t in layer[:2]], beams))
    crosses = iter(keep_rows([t for layer in cache for t in layer[2:]], rows))
    return tuple((next(selves), next(selves), next(crosses), next(crosses)) for _ in cache)


def keep_rows(tensors: list[Tensor], index: Tensor) -> list[Tensor]:
    """``t[index]`` of each tensor (index no longer than its rows), made in its own first rows: a
    view of them. Only the rows whose place changes are copied, into memory the next steps read
    already: a beam step's reorder moves a fifth to a half of the rows (reorder_cache), and when
    finished rows leave a search about half the kept ones move, where a fresh tensor copied
    every kept row into new pages (and the self-attention ones once more, into a buffer with
    room). The tensors must be the search's own (a search's caches are).

    Shape: each t (R, ...), index (N <= R,) -> each (N, ...), a view of t
    """
    moved = (index != torch.arange(index.numel(), device=index.device)).nonzero()[:, 0]  # (M,)
    if moved.numel():  # (one device sync for all of them)
        came_from = index[moved]
        for t in tensors:  # index_select copies them out first: a row may be read after it is written
            t.index_copy_(0, moved, t.index_select(0, came_from))
    return [t[: index.numel()] for t in tensors]
