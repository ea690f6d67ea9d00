"""Long texts: tokenize only the prefix that the cut to max_length keeps.

A text is cut to the model's maximum length, so only its first tokens matter; tokenizing all
of a 16 MB line to keep 128 of its tokens held gigabytes (the backend's offsets, words and
strings for every token). ``window(backend, text, budget)`` tokenizes a growing prefix instead,
until the prefix holds more than ``budget`` tokens that are surely the whole text's first ones:

    prefix, sure = window(backend, text, budget)  # sure: None when the text is short (prefix is text)

Which tokens of a prefix are the whole text's: the backend normalizes, splits the text into
words (pre-tokens) and tokenizes each word on its own (WordPiece, BPE, Unigram alike), so only
the word the prefix cuts can differ. Tokens of the prefix's last word, and tokens ending near
its end (an added token such as ``[SEP]`` cut in two, or an accent after the cut that would
have combined), are not counted. The tokens kept after the cut are then the same as whole-text
tokenization gives (tests/text/test_prefix.py checks it against full tokenization).

A text cut this way has a token count known only from below: ``AtLeast(n)``, an int that
prints as "n or more", so that a message naming it stays true.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

# Characters tokenized per token wanted, at first (4x more each time that was too few).
WINDOW_CHARS_PER_TOKEN = 16
# Tokens ending within this many characters of a prefix's end are not counted as the whole
# text's (besides those of its last word), or the longest added token's length if longer.
EDGE_CHARS = 64


class AtLeast(int):
    """A token count known from below (a text tokenized only as far as its cut needed)."""

    def __str__(self) -> str:
        return f"{int(self)} or more"

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else format(int(self), spec) + " or more"


def plus(count: int, extra: int) -> int:
    """count + extra, still a lower bound where count is one (a seq2seq source's pieces + EOS)."""
    return AtLeast(count + extra) if isinstance(count, AtLeast) else count + extra


def longest(counts: Sequence[int]) -> int:
    """The largest count, an ``AtLeast`` where any count is one (a cut text may be the longest)."""
    top = max(counts)
    return AtLeast(top) if any(isinstance(n, AtLeast) for n in counts) else top


def edge_chars(backend: Any) -> int:
    """How near a prefix's end a token may not count: EDGE_CHARS, or the longest added token."""
    added = [len(t.content) for t in backend.get_added_tokens_decoder().values()]
    return max([EDGE_CHARS, *[n + 1 for n in added]])


def window(backend: Any, text: str, budget: int, edge: int = EDGE_CHARS) -> tuple[str, int | None]:
    """``text`` and None when it is short; else a prefix of it whose first ``budget`` + 1
    tokens (no special tokens) are the whole text's, and how many such tokens it holds
    (more than ``budget``)."""
    for prefix, sure in prefixes(backend, text, budget, edge):
        if sure is None or sure > budget:
            return prefix, sure
    raise AssertionError("unreachable: the last prefix is the whole text")


def pair_window(backend: Any, a: str, b: str, budget: int, edge: int = EDGE_CHARS
                ) -> tuple[tuple[str, int | None], tuple[str, int | None]]:
    """``window`` for a pair cut longest first to ``budget`` tokens in all. The backend gives
    the shorter segment max(its length, budget - its length) and the longer the rest, or when
    both pass half the budget half each with any odd token to the longer (tokenizers'
    LongestFirst): so a cut segment must be known to be the longer one (more sure tokens than
    the other's whole count) and, for an odd budget, of two cut segments one is taken whole
    (the shorter: only then is it known which one gets the odd token)."""
    steps = prefixes(backend, a, budget, edge), prefixes(backend, b, budget, edge)
    (pa, na), (pb, nb) = next(steps[0]), next(steps[1])
    while na is not None or nb is not None:
        if na is None or nb is None:  # one whole: the cut one must hold more than it (and budget)
            whole = len(backend.encode(pa if na is None else pb, add_special_tokens=False).ids)
            if (na if nb is None else nb) > max(budget, whole):
                break
            pa, na = next(steps[0]) if na is not None else (pa, na)
            pb, nb = next(steps[1]) if nb is not None else (pb, nb)
            continue
        if na > budget and nb > budget and budget % 2 == 0:
            break
        if na <= budget or budget % 2:
            pa, na = next(steps[0])
        if nb <= budget or budget % 2:
            pb, nb = next(steps[1])
    return (pa, na), (pb, nb)


def longest_first(lengths: Sequence[int], budget: int) -> list[int]:
    """How many tokens of each segment (one or two) a cut to ``budget`` keeps, as the tokenizers
    library's LongestFirst truncation decides: the shorter segment keeps its tokens and the
    longer the rest, unless the shorter has more than half, then half each (any odd token to
    the longer; to the second when they are equally long). Each count may be a lower bound
    (an ``AtLeast`` from a prefix, tformer.text.prefix) where the text was windowed so that
    the decision is the same for the true counts."""
    if len(lengths) == 1:
        return [min(lengths[0], budget)]
    first, second = lengths
    short, long = sorted((first, second))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    kept = (short, long) if first <= second else (long, short)
    return [min(first, kept[0]), min(second, kept[1])]


def prefixes(backend: Any, text: str, budget: int, edge: int) -> Iterator[tuple[str, int | None]]:
    """Ever longer prefixes of ``text`` (4x each time) with the tokens each surely shares with
    the whole text; last, the text itself with None."""
    chars = max(budget, 64) * WINDOW_CHARS_PER_TOKEN
    while len(text) > chars:
        prefix = text[:chars]
        yield prefix, _sure_tokens(backend.encode(prefix, add_special_tokens=False), len(prefix) - edge)
        chars *= 4
    yield text, None


def _sure_tokens(encoding: Any, end: int) -> int:
    """The leading tokens of a prefix's encoding before its last word, each ending by ``end``."""
    words = encoding.word_ids
    last = next((w for w in reversed(words) if w is not None), None)
    n = 0
    for word, (_, stop) in zip(words, encoding.offsets, strict=True):
        if (word is not None and word == last) or stop > end:
            break
        n += 1
    return n
