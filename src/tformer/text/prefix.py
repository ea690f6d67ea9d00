"""Long texts: tokenize only the prefix that the cut to max_length keeps.

A text is cut to the model's maximum length, so only its first tokens matter; tokenizing all
of a 16 MB line to keep 128 of its tokens held gigabytes (the backend's offsets, words and
strings for every token). ``window(backend, text, budget)`` tokenizes a growing prefix instead,
until the prefix holds more than ``budget`` tokens that are surely the whole text's first ones:

    prefix, sure = window(backend, text, budget)  # sure: None when the text is short (prefix is text)

Which tokens of a prefix are the whole text's: the backend normalizes, splits the text into
words (pre-tokens) and tokenizes each word on its own (WordPiece, BPE, Unigram alike), so only
the word the prefix cuts can differ. Tokens ending within EDGE_CHARS of the prefix's end are not
counted (an added token such as ``[SEP]`` cut in two, an accent after the cut that would have
combined), nor those of its last word within LONG_WORD_CHARS: so a text that is one word of
megabytes (a base64 blob; Chinese for a tokenizer that splits only at spaces) is cut inside
that word, at a short text's cost. Far from the cut a word's pieces are the whole word's:
WordPiece makes a word of over 100 characters one unknown token (which reaches the cut, so never
counts), and a BPE or Unigram piece depends only on the characters near it (a few dozen at
most where we measured; the algorithms do not promise it, so tests/text/test_prefix.py checks
it). The tokens kept after the cut are then the same as whole-text tokenization gives
(tests/text/test_prefix.py checks it against full tokenization).

A text is read no further than ``reach(budget)`` characters (READ_CHARS_PER_TOKEN per token
wanted); one whose cut is not settled by then is taken as that prefix, all its tokens counted.
Only such texts can get other ids than the whole text cut: a WordPiece word of megabytes (one
unknown token with no end in sight: the words after it are never read), a flood of spaces,
and two texts past the reach sharing an odd budget (LongestFirst gives the odd token to the
one with more tokens, known once the shorter is read to its end; read to the reach, it goes to
the one with more tokens in its prefix). Such a text is flagged as cut whatever its count
(``is_cut``), unless all it holds past the reach is whitespace: its count is an ``Unread``,
which says how far it was read, so a warning names it and ``truncation=False`` refuses it
(its prefix may hold fewer tokens than max_length: without the flag the rest was lost
silently). Telling takes a scan of the rest for a character other than whitespace, never its
tokenization.

A text cut this way has a token count known only from below: ``AtLeast(n)``, an int that
prints as "n or more", so that a message naming it stays true.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

# Characters tokenized per token wanted, at first (4x more each time that was too few)...
WINDOW_CHARS_PER_TOKEN = 16
# ...and at most (the third window): the cost stays bounded by the cut, whatever the text.
READ_CHARS_PER_TOKEN = 16 * WINDOW_CHARS_PER_TOKEN
# Tokens ending within this many characters of a prefix's end are not counted as the whole
# text's (besides those of its last word), or the longest added token's length if longer.
EDGE_CHARS = 64
# Tokens of the word a prefix cuts count only if they end this many characters before its end
# (or WordPiece's max_input_chars_per_word, if more: a word that long is one unknown token).
LONG_WORD_CHARS = 1024


class AtLeast(int):
    """A token count known from below (a text tokenized only as far as its cut needed)."""

    def __str__(self) -> str:
        return f"{int(self)} or more"

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else format(int(self), spec) + " or more"


class Unread(AtLeast):
    """The token count of a text read only to its reach: its first ``read`` of ``chars``
    characters, no cut in sight by then, and more than whitespace after them, never tokenized.
    It is cut (``is_cut``) whatever its count; ``segment`` says which of a pair (0 or 1) was
    read so, None for a text alone."""

    def __new__(cls, n: int, read: int, chars: int, segment: int | None = None) -> Unread:
        self = super().__new__(cls, n)
        self.read, self.chars, self.segment = read, chars, segment
        return self

    def __getnewargs__(self) -> tuple[int, int, int, int | None]:  # (copy and pickle)
        return int(self), self.read, self.chars, self.segment

    def plus(self, extra: int) -> Unread:
        return Unread(int(self) + extra, self.read, self.chars, self.segment)

    def lost(self, limit: int) -> str:
        """What a refusal says: "read only to its first 16,384 characters of 40,012 (...), so
        the rest would be lost"."""
        whose = "" if self.segment is None else ("its text " if self.segment == 0 else "its pair ")
        return (f"{whose}read only to its first {self.read:,} characters of {self.chars:,} (tokenizing "
                f"stops there when no cut to {limit} tokens is in sight), so the rest would be lost")


class TextTooLong(ValueError):
    """A text longer than the model's maximum length, or read only to its reach (``Unread``:
    the rest would be lost), where truncation was not allowed."""

    def __init__(self, index: int, length: int, limit: int) -> None:
        self.index, self.length, self.limit = index, length, limit
        super().__init__(f"texts[{index}]: {self.expected()}")

    def expected(self) -> str:
        if isinstance(self.length, Unread) and self.length <= self.limit:  # its count does not say it
            return f"{self.length.lost(self.limit)}; shorten it or allow truncation"
        return (f"expected at most {self.limit} tokens (the model's maximum length), got {self.length}; "
                "shorten it or allow truncation")


def is_cut(count: int, limit: int | None) -> bool:
    """Whether a text of ``count`` tokens (``EncodedText.full``) is cut at ``limit``: it has more,
    or it was read only to its reach (an ``Unread``: what lies past it is lost, however few
    tokens the prefix held)."""
    return limit is not None and (count > limit or isinstance(count, Unread))


def cut_reason(counts: Sequence[int], limit: int, whose: str = "the model's") -> str:
    """Why texts were cut (each one ``is_cut``), as a warning says it after "k of N texts":
    longer than the limit (the longest one's count), or else read only to the reach (how far:
    their count does not say it), or both; ends in "so they were truncated" (``LongTexts``)."""
    long = LongTexts(limit)
    for n in counts:
        long.note(None, n)
    return long.reason(whose)

def plus(count: int, extra: int) -> int:
    """count + extra, still a lower bound where count is one (a seq2seq source's pieces + EOS),
    still read only to its reach where count was (``Unread``)."""
    if isinstance(count, Unread):
        return count.plus(extra)
    return AtLeast(count + extra) if isinstance(count, AtLeast) else count + extra


def longest(counts: Sequence[int]) -> int:
    """The largest count, an ``AtLeast`` where any count is one (a cut text may be the longest)."""
    top = max(counts)
    return AtLeast(top) if any(isinstance(n, AtLeast) for n in counts) else top


class LongTexts:
    """The texts cut to a model's maximum length (``limit`` tokens), as one warning tells of
    them: how many; of those longer than the limit, the longest (``longest``'s way); of those
    read only to their reach (``Unread``, at most ``limit`` tokens), how far and how long; and
    where the first SHOWN are. Only those are kept, so a file of a million long lines holds five
    places, not a million."""

    SHOWN = 5

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = self.named = 0
        self.first: list[Any] = []  # where the first SHOWN named ones are
        self.long = self.top = 0  # longer than the limit: how many, the most tokens
        self.early = False  # whether one of those counts is an AtLeast
        self.unread = self.read_max = self.chars = 0  # Unread within the limit: how many, how far, how long
        self.read_min: int | None = None

    def note(self, where: Any, tokens: int) -> None:
        """One more cut text of `tokens` tokens, found at `where` (None: somewhere unnamed)."""
        self.count += 1
        if tokens > self.limit:
            self.long += 1
            self.top = max(self.top, int(tokens))
            self.early = self.early or isinstance(tokens, AtLeast)
        elif isinstance(tokens, Unread):
            self.unread += 1
            self.read_min = tokens.read if self.read_min is None else min(self.read_min, tokens.read)
            self.read_max, self.chars = max(self.read_max, tokens.read), max(self.chars, tokens.chars)
        if where is not None:
            self.named += 1
            if len(self.first) < self.SHOWN:
                self.first.append(where)

    def longest(self) -> int:
        return AtLeast(self.top) if self.early else self.top

    def places(self, name: Any = str) -> str:
        """The first SHOWN places, named by `name`, and ", ..." where more were named."""
        return ", ".join(name(where) for where in self.first) + (", ..." if self.named > self.SHOWN else "")

    def reason(self, whose: str = "the model's") -> str:
        """Why they were cut, as ``cut_reason`` says it."""
        reasons = []
        if self.long:
            reasons.append(f"are longer than {whose} maximum length ({self.limit} tokens; the longest has "
                           f"{self.longest()})")
        if self.unread:
            first, last = self.read_min, self.read_max
            read = f"{first:,}" if first == last else f"{first:,} to {last:,}"  # (a pair's budget differs)
            some = f"{self.unread} of them, " if self.long else ""
            reasons.append(f"were read only to their first {read} characters ({some}of {self.chars:,} in the "
                           f"longest: tokenizing stops there when no cut to {self.limit} tokens is in sight)")
        return " or ".join(reasons) + ", so they were truncated"

def edge_chars(backend: Any) -> int:
    """How near a prefix's end a token may not count: EDGE_CHARS, or the longest added token."""
    added = [len(t.content) for t in backend.get_added_tokens_decoder().values()]
    return max([EDGE_CHARS, *[n + 1 for n in added]])


def window(backend: Any, text: str, budget: int, edge: int = EDGE_CHARS) -> tuple[str, int | None]:
    """``text`` and None when it is short; else a prefix of it whose first ``budget`` + 1
    tokens (no special tokens) are the whole text's, and how many such tokens it holds
    (more than ``budget``); or, where that is not known by ``reach(budget)`` characters, that
    prefix taken as the text, and its token count (an ``Unread`` where more than whitespace
    follows the prefix)."""
    for prefix, sure in prefixes(backend, text, budget, edge):
        if sure is None or sure > budget:
            return prefix, sure
    return prefix, sure  # read to the reach: the text taken as that prefix


def pair_window(backend: Any, a: str, b: str, budget: int, edge: int = EDGE_CHARS
                ) -> tuple[tuple[str, int | None], tuple[str, int | None]]:
    """``window`` for a pair cut longest first to ``budget`` tokens in all. The backend gives
    the shorter segment max(its length, budget - its length) and the longer the rest, or when
    both pass half the budget half each with any odd token to the longer (tokenizers'
    LongestFirst): so a cut segment must be known to be the longer one (more sure tokens than
    the other's whole count) and, for an odd budget, of two cut segments one is read to its
    end (the shorter: only then is it known which one gets the odd token), or both to the
    reach, where each is taken as read."""
    steps = prefixes(backend, a, budget, edge), prefixes(backend, b, budget, edge)
    (pa, na), (pb, nb) = next(steps[0]), next(steps[1])
    while True:
        done_a, done_b = _read(pa, na, budget), _read(pb, nb, budget)
        if done_a and done_b:
            break
        if done_a or done_b:  # one read: the cut one must hold more than it (and budget)
            whole = len(_encode(backend, pa if done_a else pb).ids)
            if (nb if done_a else na) > max(budget, whole):
                break
            pa, na = (pa, na) if done_a else next(steps[0])
            pb, nb = (pb, nb) if done_b else next(steps[1])
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
    the decision is the same for the true counts, or as read (a text read to its reach)."""
    if len(lengths) == 1:
        return [min(lengths[0], budget)]
    first, second = lengths
    short, long = sorted((first, second))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    kept = (short, long) if first <= second else (long, short)
    return [min(first, kept[0]), min(second, kept[1])]


def reach(budget: int) -> int:
    """The most characters of a text read to cut it to ``budget`` tokens."""
    return max(budget, 64) * READ_CHARS_PER_TOKEN


def prefixes(backend: Any, text: str, budget: int, edge: int) -> Iterator[tuple[str, int | None]]:
    """Ever longer prefixes of ``text`` (4x each time) with the tokens each surely shares with
    the whole text; last, the text itself with None, or its prefix at the reach with its
    token count (the text is read no further, so it is taken as that prefix: ``_as_read``)."""
    chars = max(budget, 64) * WINDOW_CHARS_PER_TOKEN
    long_word = max(LONG_WORD_CHARS, getattr(backend.model, "max_input_chars_per_word", 0))
    while len(text) > chars:
        prefix = text[:chars]
        encoding = _encode(backend, prefix)
        if chars >= reach(budget):  # no cut in sight (a word or a flood of spaces without end)
            yield prefix, _as_read(text, prefix, len(encoding.ids))
            return
        yield prefix, _sure_tokens(encoding, len(prefix), edge, long_word)
        chars *= 4
    yield text, None


_NOT_SPACE = re.compile(r"\S")


def _as_read(text: str, prefix: str, count: int) -> int:
    """The token count of ``text`` taken as its ``prefix`` (read to the reach): an ``Unread``
    where anything but whitespace follows the prefix (lost), else ``count`` (nothing lost). A
    scan for one such character, from the prefix's end; the rest is never tokenized."""
    if _NOT_SPACE.search(text, len(prefix)) is None:
        return count
    return Unread(count, len(prefix), len(text))


def _encode(backend: Any, text: str) -> Any:
    """One text's encoding, without special tokens, through ``encode_batch``: it lets go of the
    GIL while it works, where ``encode`` holds it (a 135 kB prefix: 43 ms in which a server's
    event loop, and /health, waited; the same time either way)."""
    return backend.encode_batch([text], add_special_tokens=False)[0]


def _read(prefix: str, sure: int | None, budget: int) -> bool:
    """Whether a segment is read as far as it will be: whole, or its prefix at the reach."""
    return sure is None or len(prefix) >= reach(budget)


def _sure_tokens(encoding: Any, length: int, edge: int, long_word: int) -> int:
    """The leading tokens of a prefix's encoding that end ``edge`` characters before its end
    (``long_word`` for those of its last word, the one it may cut)."""
    words = encoding.word_ids
    last = next((w for w in reversed(words) if w is not None), None)
    n = 0
    for word, (_, stop) in zip(words, encoding.offsets, strict=True):
        if stop > length - (max(edge, long_word) if word is not None and word == last else edge):
            break
        n += 1
    return n
