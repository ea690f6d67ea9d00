"""Request bodies, checked: JSON within limits, then each field, with errors that name it.

Nothing a client sends reaches a 5xx: ``parse_json`` refuses (400) bodies nested deeper than
``MAX_DEPTH``, numbers longer than ``MAX_NUMBER_CHARS`` characters (Python would spend time on,
or refuse, a 5,000-digit integer), NaN and Infinity, and (422, naming the field) strings that are
not valid Unicode (a lone surrogate such as ``"\\ud800"`` parses, but no tokenizer or answer can
encode it). The field checkers below then see only plain, shallow, valid JSON.

The body is parsed in a tokenizer thread (app.py), but a thread inside one C call keeps the GIL,
and so the event loop, until the call returns: the scans over the whole body (for long numbers,
for JSON's whitespace around the value) go a ``PIECE`` at a time. One regex over a 16 MB body
of whitespace, or of one string, held /health for 180-200 ms; in pieces, 25-40 ms in all.
"""

from __future__ import annotations

import gc
import json
import math
import re
from typing import Any

MAX_BEAM = 16
MAX_DEPTH = 8  # the deepest body a client needs is 3 ({"inputs": [[1, 2]]}, {"parameters": {"stop": [..]}})
MAX_NUMBER_CHARS = 32
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # a digit -> b"0", else b" "
_LONG_DIGITS = b"0" * (MAX_NUMBER_CHARS + 1)  # in a body so translated: a number too long
_JSON_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace (RFC 8259 §2)
PIECE = 1 << 18  # bytes or characters one scan takes: well under a millisecond
# TGI's error_type for each of our error kinds (what huggingface_hub turns into its exceptions).
ERROR_TYPES = {"invalid_request_error": "validation", "overloaded": "overloaded", "server_error": "backend"}


class RequestError(Exception):
    """A bad request: HTTP status, the field at fault, and a message that names it."""

    def __init__(self, status: int, field: str | None, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.field, self.message, self.kind = status, field, message, kind

    def body(self) -> dict[str, Any]:
        # OpenAI's error shape ({"error": {message, type, param, code}}), what its clients parse,
        # plus TGI's "error_type" beside it (huggingface_hub reads that one).
        return {"error": {"message": self.message, "type": self.kind, "param": self.field,
                          "code": self.status},
                "error_type": ERROR_TYPES.get(self.kind, "validation")}


# The body as a whole ---------------------------------------------------------------------------------
def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object within the limits (see the module's docstring)."""
    # Integers are checked one by one only where the body holds a long run of digits (a Python
    # call per integer cost 2 s for 8M token ids); the collector is off while the parser builds
    # objects (it ran over them as they were made: 2.4 s -> 0.3 s for 5M lists, holding the GIL).
    hooks: dict[str, Any] = {"parse_float": _float, "parse_constant": _constant}
    if _has_long_digits(raw):
        hooks["parse_int"] = _integer
    collecting = gc.isenabled()
    gc.disable()
    try:
        # json.loads(raw), with its whitespace scans a piece at a time (see the module's docstring)
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        body, end = json.JSONDecoder(**hooks).raw_decode(text, _skip_space(text, 0))
        end = _skip_space(text, end)
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
    except RecursionError:  # the C parser's own guard, at about a thousand levels
        raise _too_deep() from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, "body", f"body: expected a JSON object, got malformed JSON ({e})") from None
    finally:
        if collecting:
            gc.enable()
    if not isinstance(body, dict):
        raise RequestError(422, "body", f"body: expected a JSON object, got {_type(body)}")
    _check_values(body)
    return body


class ValueCounter:
    """The commas outside strings of a JSON body, counted chunk by chunk as it arrives: each
    value past the first in a list or object takes one. What the parser costs grows with the
    values, not the bytes (16 MB in one string parse in 30 ms; 8M numbers in over a second, all
    in one call that holds the GIL), and commas inside strings are text, not values.

    A string's escapes go first (``\\\\`` then ``\\"``: neither ends a string), so every quote
    left opens or closes one; an odd run of backslashes at a chunk's end leaves one for the next
    chunk, as it may escape that chunk's first byte. Each call runs a few C scans of one chunk."""

    def __init__(self) -> None:
        self.commas = 0
        self._in_string = False
        self._carry = b""

    def feed(self, chunk: bytes) -> int:
        chunk = self._carry + chunk
        kept = chunk.rstrip(b"\\")
        self._carry = b"\\" * ((len(chunk) - len(kept)) % 2)  # pairs escape each other
        chunk = kept
        parts = chunk.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')  # text between quotes
        self.commas += b"".join(parts[1 if self._in_string else 0 :: 2]).count(b",")
        self._in_string ^= len(parts) % 2 == 0  # an odd number of quotes
        return self.commas


def _has_long_digits(raw: bytes) -> bool:
    """Whether the body holds a run of more than MAX_NUMBER_CHARS digits; the pieces overlap by
    that much, so that a run across two pieces is found whole. (A regex over 16 MB took 250 ms;
    a translation and a substring search, 30 ms.)"""
    return any(_long_digits(raw[start:start + PIECE + MAX_NUMBER_CHARS])
               for start in range(0, len(raw), PIECE))


def _long_digits(piece: bytes) -> bool:
    return _LONG_DIGITS in piece.translate(_DIGITS)


def _skip_space(text: str, start: int) -> int:
    """The index of the first character at or after ``start`` that is not JSON's whitespace
    (len(text) if none)."""
    for piece in range(start, len(text), PIECE):
        end = _JSON_SPACE.match(text, piece, piece + PIECE).end()
        if end < min(piece + PIECE, len(text)):
            return end
    return len(text)


def _integer(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise RequestError(400, "body", f"body: expected numbers of at most {MAX_NUMBER_CHARS} "
                           f"characters, got an integer of {len(text)}")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise RequestError(400, "body", f"body: expected numbers of at most {MAX_NUMBER_CHARS} "
                           f"characters, got a number of {len(text)}")
    value = float(text)
    if not math.isfinite(value):
        raise RequestError(400, "body", f"body: expected finite numbers, got {text[:40]}")
    return value


def _constant(text: str) -> float:
    raise RequestError(400, "body", f"body: expected JSON numbers, got {text} (not JSON)")


def _too_deep() -> RequestError:
    return RequestError(400, "body", f"body: expected JSON nested at most {MAX_DEPTH} deep, got deeper")


def _check_values(body: dict[str, Any]) -> None:
    """Depth and Unicode, walked without recursion; errors name the field (inputs[2]). A field's
    name is made only for an error: made for each of millions of values, it cost seconds."""
    stack: list[tuple[dict | list, tuple | None, int]] = [(body, None, 1)]  # (container, path, depth)
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep()
        if isinstance(value, dict):
            for key, item in value.items():
                if not key.isascii():
                    _check_text(key, _name((path, ".<key>")) if path else "body.<key>")
                _check_item(item, (path, key), depth, stack)
        else:
            for i, item in enumerate(value):
                _check_item(item, (path, i), depth, stack)


def _check_item(item: Any, path: tuple, depth: int, stack: list) -> None:
    kind = type(item)
    if kind is str:
        if not item.isascii():
            _check_text(item, _name(path))
    elif kind is dict or kind is list:
        if item:
            stack.append((item, path, depth + 1))
        elif depth + 1 > MAX_DEPTH:
            raise _too_deep()


def _name(path: tuple) -> str:
    """(((None, "inputs"), 2), "text") -> "inputs[2].text"."""
    parts = []
    while path is not None:
        path, key = path
        if isinstance(key, int):
            parts.append(f"[{key}]")
        else:
            parts.append(key if path is None or key == ".<key>" else f".{key}")
    return "".join(reversed(parts))


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(422, where, f"{where}: expected valid Unicode text, got a lone surrogate "
                           f"{text[e.start]!r} at character {e.start}") from None


# Fields -----------------------------------------------------------------------------------------------
def check_fields(body: dict[str, Any], allowed: tuple[str, ...], where: str = "") -> None:
    """The first field the client sent that is not allowed, refused (sorting them all to name one
    held the GIL 0.9 s for a body of a million fields)."""
    for key in body:
        if key not in allowed:
            key = key if len(key) <= 60 else key[:57] + "..."  # a 10 MB name is not echoed whole
            name = f"{where}.{key}" if where else key
            raise RequestError(422, name, f"{name}: unknown field; expected fields among "
                               f"{', '.join(allowed)}")


def obj(body: dict[str, Any], name: str) -> dict[str, Any]:
    """An optional object field (TGI's and HF's ``parameters``); {} when absent or null."""
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(422, name, f"{name}: expected an object, got {_type(value)}")
    return value


def texts(body: dict[str, Any], name: str, max_inputs: int) -> list[str]:
    """A string or a non-empty list of strings, each non-empty, at most max_inputs of them."""
    items = _list(body, name, max_inputs, "a string or a list of strings")
    for i, t in enumerate(items):
        _text(t, f"{name}[{i}]")
    return items


def inputs(body: dict[str, Any], name: str, max_inputs: int, vocab_size: int) -> list[str | list[int]]:
    """Texts or token ids, as OpenAI and TEI take them: a string, a list of strings, a list of
    token ids (one input), or a list of those."""
    value = body.get(name)
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        value = [value]  # one input as token ids
    items = _list({name: value} if name in body else {}, name, max_inputs,
                  "a string, a list of strings, token ids or a list of token-id lists")
    for i, item in enumerate(items):
        if isinstance(item, list):
            _ids(item, f"{name}[{i}]", vocab_size)
        else:
            _text(item, f"{name}[{i}]")
    return items


def records(body: dict[str, Any], name: str, max_inputs: int) -> tuple[list[dict[str, str]], bool]:
    """Classification inputs in TEI's forms, and whether they came as a batch: a string or a
    flat [text] / [text, text_pair] list is one input; a list of those (or of
    {"text", "text_pair"} objects) is a batch."""
    value = body.get(name)
    single = isinstance(value, str | dict) or (isinstance(value, list) and bool(value)
                                               and all(isinstance(v, str) for v in value))
    items = _list({name: [value]} if single else body, name, max_inputs,
                  "a string, a [text, text_pair] list, or a list of those")
    out = []
    for i, item in enumerate(items):
        where = name if single else f"{name}[{i}]"
        if isinstance(item, str):
            item = {"text": item}
        elif isinstance(item, list):  # TEI: [text] or [text, text_pair]
            if not 1 <= len(item) <= 2:
                raise RequestError(422, where, f"{where}: expected [text] or [text, text_pair] (a batch "
                                   f"is a list of those), got a list of {len(item)}")
            item = dict(zip(("text", "text_pair"), item, strict=False))
        if not isinstance(item, dict):
            raise RequestError(422, where, f"{where}: expected a string, a [text, text_pair] list or an "
                               f"object with text (and text_pair), got {_type(item)}")
        check_fields(item, ("text", "text_pair"), where)
        if "text" not in item:
            raise RequestError(422, f"{where}.text", f"{where}.text: required, got nothing")
        for key in ("text", "text_pair"):
            if key in item:
                _text(item[key], f"{where}.{key}")
        out.append({k: item[k] for k in ("text", "text_pair") if k in item})
    return out, not single


def boolean(body: dict[str, Any], name: str, default: bool | None, where: str = "") -> bool | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        field = f"{where}.{name}" if where else name
        raise RequestError(422, field, f"{field}: expected true or false, got {_type(value)}")
    return value


def integer(body: dict[str, Any], name: str, default: int | None, low: int, high: int,
            where: str = "") -> int | None:
    value = body.get(name)
    if value is None:
        return default
    field = f"{where}.{name}" if where else name
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, field, f"{field}: expected an integer, got {_type(value)}")
    if not low <= value <= high:
        raise RequestError(422, field, f"{field}: expected {low}..{high}, got {value}")
    return value


def number(body: dict[str, Any], name: str, default: float, low: float, where: str = "") -> float:
    value = body.get(name)
    if value is None:
        return default
    field = f"{where}.{name}" if where else name
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(422, field, f"{field}: expected a number, got {_type(value)}")
    if not value > low:
        raise RequestError(422, field, f"{field}: expected a number above {low}, got {value}")
    return float(value)


def choice(body: dict[str, Any], name: str, default: str, options: tuple[str, ...], where: str = "") -> str:
    value = body.get(name)
    if value is None:
        return default
    if value not in options:
        field = f"{where}.{name}" if where else name
        raise RequestError(422, field, f"{field}: expected one of {', '.join(options)}, got {_short(value)}")
    return value


def string(body: dict[str, Any], name: str, where: str = "") -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        field = f"{where}.{name}" if where else name
        raise RequestError(422, field, f"{field}: expected a string, got {_type(value)}")
    return value


def unsupported(body: dict[str, Any], where: str, allowed: dict[str, Any], why: str) -> None:
    """Fields this server knows but does not do: refused unless null or the one value it does."""
    for name, fine in allowed.items():
        value = body.get(name)
        if value is not None and value != fine:
            field = f"{where}.{name}"
            expected = "null" if fine is None else f"null or {json.dumps(fine)}"
            raise RequestError(422, field, f"{field}: expected {expected} ({why}), got {_short(value)}")


# Helpers ------------------------------------------------------------------------------------------------
def _list(body: dict[str, Any], name: str, max_inputs: int, what: str,
          singles: tuple[type, ...] = (str,)) -> list:
    if name not in body or body[name] is None:
        raise RequestError(422, name, f"{name}: required ({what}), got nothing")
    value = body[name]
    items = [value] if isinstance(value, singles) else value
    if not isinstance(items, list):
        raise RequestError(422, name, f"{name}: expected {what}, got {_type(value)}")
    if not items:
        raise RequestError(422, name, f"{name}: expected at least one input, got an empty list")
    if len(items) > max_inputs:
        raise RequestError(413, name, f"{name}: expected at most {max_inputs} inputs per request "
                           f"(--max-client-batch), got {len(items)}")
    return items


def _text(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise RequestError(422, where, f"{where}: expected a string, got {_type(value)}")
    if not value.strip():
        raise RequestError(422, where, f"{where}: expected a non-empty text, got {_short(value)}")


def _ids(value: list, where: str, vocab_size: int) -> None:
    if not value:
        raise RequestError(422, where, f"{where}: expected at least one token id, got an empty list")
    for j, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int):
            raise RequestError(422, f"{where}[{j}]", f"{where}[{j}]: expected a token id, got {_type(t)}")
        if not 0 <= t < vocab_size:
            raise RequestError(422, f"{where}[{j}]", f"{where}[{j}]: expected a token id in "
                               f"0..{vocab_size - 1}, got {t}")


def _short(value: Any) -> str:
    """The value as the client wrote it (JSON: true, null, "text"; not Python's True, None, 'text')."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
