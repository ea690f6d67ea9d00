"""The body parser (tformer.serve.schema.parse_json): json.loads's answers and errors, with no
C call over more than a piece of the body (a thread in one keeps the event loop waiting)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tformer.serve import schema
from tformer.serve.schema import MAX_NUMBER_CHARS, PIECE, RequestError, check_fields, parse_json


def test_a_16_mb_body_is_scanned_a_piece_at_a_time(monkeypatch):
    """One regex over a 16 MB body held the GIL, and with it /health, for 250 ms (a body of
    whitespace, or one long string): each scan now sees at most a piece."""
    spans = {"digits": [], "space": []}
    long_digits, space = schema._long_digits, schema._JSON_SPACE

    def digits(piece):
        spans["digits"].append(len(piece))
        return long_digits(piece)

    class Space:
        def match(self, text, pos, endpos):
            spans["space"].append(min(endpos, len(text)) - pos)
            return space.match(text, pos, endpos)

    monkeypatch.setattr(schema, "_long_digits", digits)
    monkeypatch.setattr(schema, "_JSON_SPACE", Space())
    size = 16 * 1024 * 1024
    with pytest.raises(RequestError, match=r"malformed JSON \(Expecting value: line 1 column 16777217"):
        parse_json(b" " * size)
    half = size // 2
    assert parse_json(b" " * half + b'{"inputs": "' + b"x" * half + b'"}  ')["inputs"] == "x" * half
    for name, seen in spans.items():
        assert seen and max(seen) <= PIECE + MAX_NUMBER_CHARS, name


@pytest.mark.parametrize("offset", [0, 1, PIECE - MAX_NUMBER_CHARS - 1, PIECE - 20, PIECE - 1, PIECE, 2 * PIECE - 5])
def test_a_long_number_is_found_wherever_the_pieces_end(offset):
    """A run of digits that straddles two pieces is still one number too long (and one digit
    fewer is a number)."""
    head = b'{"a": "' + b"x" * offset + b'", "n": '
    tail = b", " + b"x" * PIECE + b"}"
    long = b"1" * (MAX_NUMBER_CHARS + 1)
    with pytest.raises(RequestError, match=f"got an integer of {MAX_NUMBER_CHARS + 1}"):
        parse_json(head + long + tail.replace(b"x" * PIECE, b'"z"'))
    assert parse_json(head + long[1:] + b', "z": 0}')["n"] == int(long[1:])


@pytest.mark.parametrize("raw", [
    b"", b"   ", b"\n\t \r", b"{", b'{"a": 1} x', b'{"a": 1}  \n {}', b'  \n  {"a": }', b'{"a": 1}\n\n]',
    b'\xef\xbb\xbf{"a": 1}', b"[1, 2]", b'"text"', b'\t{"a": [1, 2.5, "\\u00e9", null, true]}\r\n',
    '{"a": "é"}'.encode("utf-16"), b'{"a": "\xff"}',
])
def test_answers_and_errors_are_json_loads_ones(raw):
    """The same values as json.loads, and the same messages (positions counted in the whole
    body, its leading whitespace included)."""
    try:
        expected = json.loads(raw)
    except ValueError as e:
        with pytest.raises(RequestError) as refused:
            parse_json(raw)
        assert refused.value.status == 400 and refused.value.message.endswith(f"malformed JSON ({e})")
        return
    if not isinstance(expected, dict):
        with pytest.raises(RequestError, match="expected a JSON object, got"):
            parse_json(raw)
        return
    assert parse_json(raw) == expected


def test_an_unknown_field_is_the_first_the_client_sent():
    """The unknown fields were sorted to name the first: 0.9 s holding the GIL (and /health)
    for a 16 MB body of a million fields. The first in the body is named, found at once."""
    body = {"inputs": "a", "zeta": 1, "alpha": 2, **{f"k{i}": 0 for i in range(100_000)}}
    with pytest.raises(RequestError) as refused:
        check_fields(body, ("inputs", "normalize"))
    assert refused.value.field == "zeta" and refused.value.message == (
        "zeta: unknown field; expected fields among inputs, normalize")
    check_fields({"inputs": "a", "normalize": True}, ("inputs", "normalize"))
    with pytest.raises(RequestError, match=r"^x{57}\.\.\.: unknown field"):
        check_fields({"x" * 10_000_000: 1}, ("inputs",))


def test_millions_of_values_are_checked():
    """A server given long token-id lists (--max-client-batch x --max-input-tokens in the
    millions) parses bodies of millions of values; they are checked without a name made for
    each (a name per value cost seconds)."""
    body = parse_json(json.dumps({"inputs": [[1] * 2_000_000], "x": [[]] * 1_000_000}).encode())
    assert len(body["inputs"][0]) == 2_000_000 and len(body["x"]) == 1_000_000


def _commas_outside_strings(raw: bytes) -> int:
    """The count, byte by byte (the independent reading ValueCounter's scans must agree with)."""
    count, in_string, escaped = 0, False, False
    for byte in raw:
        if escaped:
            escaped = False
        elif in_string and byte == ord("\\"):
            escaped = True
        elif byte == ord('"'):
            in_string = not in_string
        elif byte == ord(",") and not in_string:
            count += 1
    return count


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab,"\\ \n\u00e9'),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(alphabet='a,"\\'), inner, max_size=4),
    max_leaves=30)


@given(value=_JSON_VALUES, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
@settings(max_examples=300, deadline=None)
def test_value_counter_counts_commas_outside_strings_however_the_body_arrives(value, cuts):
    """Commas, quotes and backslashes in texts and keys, cut anywhere (between a backslash and
    the byte it escapes too): the count equals a byte-by-byte reading's."""
    raw = json.dumps({"inputs": value}, ensure_ascii=False).encode()
    counter, start = schema.ValueCounter(), 0
    for cut in sorted({min(c, len(raw)) for c in cuts}) + [len(raw)]:
        counter.feed(raw[start:cut])
        start = cut
    assert counter.commas == _commas_outside_strings(raw)


def test_value_counter_carries_one_backslash_not_a_run():
    """16 MB of backslashes, fed in chunks, carries at most one to the next chunk (a carried
    run would be copied again with every chunk: quadratic)."""
    counter = schema.ValueCounter()
    for _ in range(100):
        counter.feed(b"\\" * 65_537)
        assert len(counter._carry) <= 1
