"""What a protocol module gives for each path (``Endpoint``), what it may ask of the app's
service (``Service``), and the JSON answer every endpoint writes."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from tformer.kinds.run import Run
from tformer.kinds.serving import Item
from tformer.serve.config import ServeConfig
from tformer.serve.metrics import Metrics
from tformer.serve.schema import RequestError


@dataclass(frozen=True)
class Endpoint:
    """parse(body) -> (inputs, key, truncate, extra); respond(results, items, extra) -> Response.
    key: the setting a model batch shares; tokenize_only: the inputs are tokenized and
    answered (``served.tokenize(inputs, key)``), without the model."""

    parse: Callable[[dict], tuple[list, Hashable, bool, dict]]
    respond: Callable[[list, list[Item], dict], Response]
    tokenize_only: bool = False


class Service(Protocol):
    """What the protocol modules need from the app's service (tformer.serve.app.Service)."""

    config: ServeConfig
    served: Run  # the run (or model directory) served: tformer.kinds
    input_limit: int  # the most tokens an input is read to (--max-input-tokens, else the run's)
    metrics: Metrics

    async def answer(self, request: Request, path: str, endpoint: Endpoint) -> Response: ...

    def info(self) -> dict[str, Any]: ...


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(value, ensure_ascii=False, separators=(",", ":")), status_code=status,
                    media_type="application/json", headers=headers)


def error(e: RequestError, headers: dict[str, str] | None = None) -> Response:
    return json_response(e.body(), e.status, headers)
