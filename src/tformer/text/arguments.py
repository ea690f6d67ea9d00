"""The checks of what a caller hands the tokenizer (texts, their pairs, token ids), each refused
in one line naming the argument: plain Python, shared by the tokenizer, the runs and the
sentence encoder."""

from __future__ import annotations

import operator
from collections.abc import Iterable

from tformer.errors import FieldError, shown


def texts_list(name: str, texts: str | Iterable[str]) -> list[str]:
    """One str (one text) or an iterable of texts as a list; bytes or a number refused naming
    `name` (bytes iterate as ints, a number not at all: both were bare errors)."""
    if isinstance(texts, (bytes, bytearray)) or not isinstance(texts, (str, Iterable)):
        raise TypeError(f"{name}: expected a str or an iterable of str, got {type(texts).__name__}")
    return [texts] if isinstance(texts, str) else list(texts)


def check_texts(name: str, texts: list[str], one: bool = False) -> None:
    """Each a str with text in it, refused naming it (``name`` for ``one`` text given as a str,
    else ``name[i]``): a blank one (empty or whitespace only) has nothing to answer for or embed,
    and every command, the server and the runs refuse it (a blank --file line too); so is one
    holding a lone surrogate (check_encodable)."""
    for i, t in enumerate(texts):
        where = name if one else f"{name}[{i}]"
        if not isinstance(t, str):
            raise TypeError(f"{where}: expected a str, got {type(t).__name__}")
        if not t.strip():
            raise ValueError(f"{where}: expected a non-empty text, got {shown(t)}")
        check_encodable(where, t)


def check_encodable(where: str, text: str) -> None:
    """Refuse a str UTF-8 cannot encode: half of a UTF-16 pair ("a\\ud800", a lone surrogate,
    as a JSON escape or a file name decoded with surrogateescape spells it), which no tokenizer
    takes (its error was a bare TypeError naming no argument)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise FieldError(where, f"expected text UTF-8 can encode, got a lone surrogate "
                                f"{text[e.start]!r} at character {e.start + 1}") from None


def pairs_list(pairs: str | Iterable[str | None], n: int) -> list[str | None]:
    """The second segment of each of `n` texts (None: that text has none; one str: the one
    text's), as a list; refused in one line naming `pairs` (a number was "has no len()")."""
    if isinstance(pairs, (bytes, bytearray)) or not isinstance(pairs, (str, Iterable)):
        raise TypeError(f"pairs: expected a str or an iterable of str (or None), got {type(pairs).__name__}")
    out = [pairs] if isinstance(pairs, str) else list(pairs)
    if len(out) != n:
        raise ValueError(f"pairs: expected {n} (one per text), got {len(out)}")
    for i, p in enumerate(out):
        if p is not None and not isinstance(p, str):
            raise TypeError(f"pairs[{i}]: expected a str or None, got {type(p).__name__}")
        if p is not None:
            check_encodable(f"pairs[{i}]" if not isinstance(pairs, str) else "pairs", p)
    return out


def token_ids(ids: Iterable[int], vocab_size: int, name: str = "ids") -> list[int]:
    """Token ids as Python ints; a negative one, a number past the tokenizers backend's (u32) or
    a non-int refused naming it (they were OverflowError or TypeError from the backend). An id
    past the vocabulary stays the backend's to skip, as a model's output may hold one."""
    if isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name}: expected a sequence of token ids (ints), got {type(ids).__name__}")
    out = []
    for i, t in enumerate(ids):
        where = name if name == "token_id" else f"{name}[{i}]"
        try:
            v = operator.index(t)  # an int, a numpy integer, a 0-d integer tensor
        except TypeError:
            raise TypeError(f"{where}: expected an int token id, got {type(t).__name__}") from None
        if not 0 <= v < 2**32:
            raise ValueError(f"{where}: expected a token id in [0, {vocab_size}), got {v}")
        out.append(v)
    return out
