"""What `tformer serve` asks of a run, whatever its kind: its inputs admitted, a batch answered.

    items = run.admit(inputs, truncate)   # in the server's tokenizer threads: tokenized once
    answers = run.run_batch([item.payload for item in items], key)   # in the model thread

Each kind's Run class says which protocols it answers (``protocols``: names that
tformer.serve.routes knows) and how it admits and answers; this module holds what they share:
the ``Item`` the batcher packs, the refusals (``InputRefused``: 422, ``TooLong``: 413) and
/tokenize's token lists.

A text far longer than the token limit is tokenized only as far as the limit needs
(``Tokenizer.prefixes``, tformer.text.prefix: the one way every command does it): a 5 MB text
costs what a few kB do, the tokens kept are the same, and the model thread gets the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tformer.text.prefix import Unread, is_cut


@dataclass
class Item:
    """One input text as the batcher sees it.

    n: tokens the model will run (after any cut; a long text read in windows: all of them,
    tformer.text.windows); full: tokens before the cut (at least, for a text tokenized only as
    far as the limit needed; an ``Unread`` for one read only to its reach, cut whatever its
    count); payload: what the run's ``run_batch`` needs (token ids, or the text itself); cut:
    whether it was cut (None: where full > n, or an ``Unread``)."""

    n: int
    full: int
    payload: Any
    cut: bool | None = None

    @property
    def truncated(self) -> bool:
        return is_cut(self.full, self.n) if self.cut is None else self.cut


class InputRefused(ValueError):
    """An input this model cannot take: the server answers ``status``, naming the inputs."""

    status = 422


class TooLong(InputRefused):
    """An input longer than the limit, with truncation off: the server answers 413."""

    status = 413


def too_long(lengths: list[int], limit: int | None, truncate: bool, positions: list[int] | None = None,
             cut: list[bool] | None = None) -> list[int]:
    """Indices of inputs over the limit (or read only to their reach: an ``Unread``; or, given,
    where cut[i]: a pair read in windows, whose reach is its own); raises TooLong for the first
    when not truncating. lengths[i]: an ``AtLeast`` (printed "n or more") for a text counted
    only as far as its cut needed; positions[i]: its index in the request."""
    long = [i for i, n in enumerate(lengths) if (is_cut(n, limit) if cut is None else cut[i])]
    if long and not truncate:
        i = long[0]
        n, where = lengths[i], f"input[{positions[i] if positions else i}]"
        if isinstance(n, Unread) and n <= limit:  # its count does not say it
            raise TooLong(f"{where}: {n.lost(limit)} (send truncate: true, or shorten it)")
        raise TooLong(f"{where}: expected at most {limit} tokens, got {n} (send truncate: true, or "
                      "shorten it)")
    return long


def input_limit(max_input_tokens: int | None, limit: int) -> int:
    """--max-input-tokens checked against the run's own maximum length ``limit`` (None: that)."""
    if max_input_tokens is not None and max_input_tokens > limit:
        raise ValueError(f"--max-input-tokens: expected at most {limit} (the run's maximum length), "
                         f"got {max_input_tokens}")
    return max_input_tokens or limit


# /tokenize's answer is ~70 bytes of JSON a token (and ~10x that as Python objects before): a
# request's tokens in all are capped, so that a 16 MB body cannot ask for gigabytes.
TOKENIZE_MAX_TOKENS = 1 << 17


def token_lists(tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
    """TEI's /tokenize: each text's tokens with their character offsets, no truncation; more
    than ``TOKENIZE_MAX_TOKENS`` in all is refused (413)."""
    lowered = [t.lower() for t in texts] if tokenizer.lowercase else texts
    encodings = tokenizer.backend.encode_batch(lowered, add_special_tokens=add_special_tokens)
    total = sum(len(e.ids) for e in encodings)
    if total > TOKENIZE_MAX_TOKENS:
        raise TooLong(f"inputs: expected at most {TOKENIZE_MAX_TOKENS} tokens to list in all, got {total} "
                      "(send fewer or shorter texts)")
    out = []
    for text, e in zip(texts, encodings, strict=True):
        out.append([{"id": i, "text": tok if special else text[a:b], "special": bool(special),
                     "start": None if special else a, "stop": None if special else b}
                    for i, tok, (a, b), special in zip(e.ids, e.tokens, e.offsets, e.special_tokens_mask,
                                                       strict=True)])
    return out
