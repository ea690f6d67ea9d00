"""Long texts read in windows: a text longer than the model's maximum length is read as
overlapping windows of it, each one a text the model reads whole, not as its first tokens only.

    starts = window_starts(n, width)            # where each window of a text's n tokens begins
    pieces = split(encoding, max_length, True)  # (ids, type_ids) per window, specials in each

The first window is what the cut keeps (the same ids: ``split(..., windows=False)`` is the cut);
each next one begins STRIDE_SHARE of a window later, so a quarter of every window is read twice
(the tokens at a window's edge get context on both sides: Pappagari et al. 2019 read long
documents in segments of 200 tokens with 50 of overlap), and the last ends at the text's end (a
full window, never a scrap of a few tokens). A text is read in at most MAX_WINDOWS windows:
what lies past them is cut, and said to be (``coverage``: the tokens they read).

A pair (text, text_pair): each window holds the shorter segment as the cut keeps it (the
tokenizers library's LongestFirst, tformer.text.prefix.longest_first), and a window of the
longer one in the rest; a query and its long document are read as the query with each part of
the document.

Which windows answer, and how their answers are pooled, is the model side's:
tformer.text.batches.EncoderBatch (``owner``, ``pooled``), tformer.training.windows.
"""

from __future__ import annotations

import itertools
from typing import Any

from tformer.text.prefix import longest_first

STRIDE_SHARE = 0.75  # a window starts this share of a window after the one before it
MAX_WINDOWS = 16  # the most windows one text is read in (16 of 128 tokens: its first 1,538)


def stride(width: int) -> int:
    """Tokens from one window's start to the next one's, for windows of `width` tokens."""
    return max(1, int(width * STRIDE_SHARE))


def coverage(width: int, max_windows: int = MAX_WINDOWS) -> int:
    """The most tokens of a text (no specials) its windows of `width` tokens read."""
    return width + (max_windows - 1) * stride(width)


def window_starts(n: int, width: int, max_windows: int = MAX_WINDOWS) -> list[int]:
    """The first token of each window of a text of `n` tokens (no specials), windows of `width`:
    every stride(width) tokens while a window would end before the text does, then one that
    ends at its end; at most `max_windows` (a longer text's windows read its first
    coverage(width) tokens: the rest is cut)."""
    if n <= width:
        return [0]
    starts = list(range(0, n - width, stride(width)))  # windows that end before the text does
    if len(starts) >= max_windows:
        return starts[:max_windows]
    return [*starts, n - width]


def split(encoding: Any, max_length: int, windows: bool) -> tuple[list[tuple[list[int], list[int]]], int]:
    """The windows of an encoding (a tokenizers ``Encoding``, specials included): each one's
    (ids, type_ids), each with the specials and at most max_length tokens; and how many tokens
    of it they read (specials once). Without `windows`, or for a text that fits, one: the cut
    (the specials and each segment's first tokens, as the backend's LongestFirst truncation
    would keep them). Cut here, not by the backend: it would make every combination of the two
    segments' overflowing pieces, gigabytes for a long pair and a small max_length."""
    blocks, at = [], 0  # (segment or None for specials, first place, tokens), in order
    for mark, run in itertools.groupby(encoding.sequence_ids):  # per token: 0 or 1, None (a special)
        n = len(list(run))
        blocks.append((mark, at, n))
        at += n
    lengths = [sum(n for m, _, n in blocks if m == s) for s in range(encoding.n_sequences)]
    specials = at - sum(lengths)
    keep = longest_first(lengths, max_length - specials)
    # The windowed segment: the one alone, or of a pair the longer (the second when as long).
    slid = 0 if len(lengths) == 1 else int(lengths[1] >= lengths[0])
    starts = window_starts(lengths[slid], keep[slid]) if windows else [0]
    ids, types, out = encoding.ids, encoding.type_ids, []
    for start in starts:
        # The places kept, block by block: the specials', a segment's first tokens (the slid
        # one's from the window's start). (Each segment is one block: "[CLS] a [SEP] b [SEP]".)
        spans = [(a, a + n) if m is None else (a + start * (m == slid), a + start * (m == slid) + keep[m])
                 for m, a, n in blocks]
        out.append((list(itertools.chain.from_iterable(ids[a:b] for a, b in spans)),
                    list(itertools.chain.from_iterable(types[a:b] for a, b in spans))))
    read = specials + sum(keep) - keep[slid] + min(lengths[slid], starts[-1] + keep[slid])
    return out, read


def rows(order: list[int], reads: list[int], size: int) -> list[int]:
    """The first texts of `order` whose windows (reads[i] each) make at most `size` rows of a
    batch, at least one: a batch of long texts holds as many rows as one of short texts."""
    taken = list(itertools.takewhile(lambda n: n <= size, itertools.accumulate(reads[i] for i in order)))
    return order[: max(1, len(taken))]
