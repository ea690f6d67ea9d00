"""Request bodies, checked: each mistake is a RequestError naming the field, what was expected
and what came (the server answers it as a 4xx JSON error)."""

from __future__ import annotations

import json
from typing import Any

MAX_BEAM = 16


class RequestError(Exception):
    """A bad request: HTTP status, the field at fault, and a message that names it."""

    def __init__(self, status: int, field: str | None, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.field, self.message, self.kind = status, field, message, kind

    def body(self) -> dict[str, Any]:
        # OpenAI's error shape ({"error": {message, type, param, code}}): what its clients parse.
        return {"error": {"message": self.message, "type": self.kind, "param": self.field,
                          "code": self.status}}


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, "body", f"body: expected a JSON object, got malformed JSON ({e})") from None
    if not isinstance(body, dict):
        raise RequestError(422, "body", f"body: expected a JSON object, got {_type(body)}")
    return body


def check_fields(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise RequestError(422, unknown[0], f"{unknown[0]}: unknown field; expected fields among "
                           f"{', '.join(allowed)}")


def texts(body: dict[str, Any], name: str, max_inputs: int) -> list[str]:
    """A string or a non-empty list of strings, each non-empty, at most max_inputs of them."""
    if name not in body:
        raise RequestError(422, name, f"{name}: required (a string or a list of strings), got nothing")
    value = body[name]
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise RequestError(422, name, f"{name}: expected a string or a list of strings, got {_type(value)}")
    _count(name, items, max_inputs)
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise RequestError(422, f"{name}[{i}]", f"{name}[{i}]: expected a string, got {_type(t)}")
        if not t.strip():
            raise RequestError(422, f"{name}[{i}]", f"{name}[{i}]: expected a non-empty text, got {t!r}")
    return items


def records(body: dict[str, Any], name: str, max_inputs: int) -> list[dict[str, str]]:
    """Classification inputs: strings, or {"text", "text_pair"} objects for sentence pairs."""
    if name not in body:
        raise RequestError(422, name, f"{name}: required (a string or a list), got nothing")
    value = body[name]
    items = [value] if isinstance(value, str | dict) else value
    if not isinstance(items, list):
        raise RequestError(422, name, f"{name}: expected a string, an object or a list, got {_type(value)}")
    _count(name, items, max_inputs)
    out = []
    for i, item in enumerate(items):
        where = f"{name}[{i}]"
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict):
            raise RequestError(422, where, f"{where}: expected a string or an object with text "
                               f"(and text_pair), got {_type(item)}")
        check_fields(item, ("text", "text_pair"))
        for key in ("text", "text_pair"):
            if key in item and not (isinstance(item[key], str) and item[key].strip()):
                raise RequestError(422, f"{where}.{key}", f"{where}.{key}: expected a non-empty string, "
                                   f"got {item[key]!r}")
        if "text" not in item:
            raise RequestError(422, f"{where}.text", f"{where}.text: required, got nothing")
        out.append({k: item[k] for k in ("text", "text_pair") if k in item})
    return out


def boolean(body: dict[str, Any], name: str, default: bool | None) -> bool | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(422, name, f"{name}: expected true or false, got {_type(value)}")
    return value


def integer(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, name, f"{name}: expected an integer, got {_type(value)}")
    if not low <= value <= high:
        raise RequestError(422, name, f"{name}: expected {low}..{high}, got {value}")
    return value


def number(body: dict[str, Any], name: str, default: float, low: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(422, name, f"{name}: expected a number, got {_type(value)}")
    if not value > low:
        raise RequestError(422, name, f"{name}: expected a number above {low}, got {value}")
    return float(value)


def choice(body: dict[str, Any], name: str, default: str, options: tuple[str, ...]) -> str:
    value = body.get(name)
    if value is None:
        return default
    if value not in options:
        raise RequestError(422, name, f"{name}: expected one of {', '.join(options)}, got {value!r}")
    return value


def _count(name: str, items: list, max_inputs: int) -> None:
    if not items:
        raise RequestError(422, name, f"{name}: expected at least one input, got an empty list")
    if len(items) > max_inputs:
        raise RequestError(413, name, f"{name}: expected at most {max_inputs} inputs per request "
                           f"(--max-client-batch), got {len(items)}")


def _type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
