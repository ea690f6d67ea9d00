"""The model endpoints: for each, how its body is read and how its answer is written.

    POST /v1/embeddings  {"input": str | [str], "model"?, "encoding_format"?: "float"|"base64"}
                         -> {"object": "list", "data": [{"index", "embedding"}], "model", "usage"}
    POST /embed          {"inputs": str | [str], "normalize"?, "truncate"?}  -> [[float, ...], ...]
    POST /predict        {"inputs": str | {"text", "text_pair"?} | [...], "truncate"?}
                         -> {"predictions": [{"text", "label", "probabilities"}], "usage"}
    POST /generate       {"inputs": str | [str], "beam_size"?, "max_new_tokens"?, "length_penalty"?,
                          "truncate"?}  -> {"outputs": [str], "usage"}

The JSON answers also list ``truncated_inputs`` (indices of inputs cut to the token limit), as
the ``X-Truncated-Inputs`` header does for every endpoint (TEI's bare array has no room for it).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Protocol

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from tformer.serve import schema
from tformer.serve.config import ServeConfig
from tformer.serve.models import Item, Served

POST_PATHS = ("/v1/embeddings", "/embed", "/predict", "/generate")
Handler = Callable[[Request], Awaitable[Response]]


class Service(Protocol):
    """What the handlers need from the app's service (tformer.serve.app.Service)."""

    config: ServeConfig
    served: Served

    async def answer(self, request: Request, endpoint: str,
                     parse: Callable[[dict], tuple[list, Hashable, bool, dict]],
                     respond: Callable[[list, list[Item], dict], Response]) -> Response: ...


def handlers(service: Service) -> dict[str, Handler]:
    """One handler per model endpoint, bound to this worker's service."""
    c, served = service.config, service.served

    # Embeddings, OpenAI's shape ----------------------------------------------------------------
    def parse_openai(body: dict) -> tuple:
        schema.check_fields(body, ("input", "model", "encoding_format", "dimensions", "user"))
        texts = schema.texts(body, "input", c.max_client_batch)
        if not isinstance(body.get("model", ""), str):
            raise schema.RequestError(422, "model", f"model: expected a string, got {body['model']!r}")
        encoding = schema.choice(body, "encoding_format", "float", ("float", "base64"))
        schema.integer(body, "dimensions", served.dim, served.dim, served.dim)  # only its own
        return texts, served.normalize, c.truncate, {"encoding": encoding}

    def respond_openai(results: list[np.ndarray], items: list[Item], extra: dict) -> Response:
        data = [{"object": "embedding", "index": i, "embedding": _vector(v, extra["encoding"])}
                for i, v in enumerate(results)]
        return _json({"object": "list", "data": data, "model": c.model_name, **_usage(items)})

    # Embeddings, TEI's shape -----------------------------------------------------------------------
    def parse_tei(body: dict) -> tuple:
        schema.check_fields(body, ("inputs", "normalize", "truncate", "truncation_direction", "prompt_name"))
        texts = schema.texts(body, "inputs", c.max_client_batch)
        normalize = schema.boolean(body, "normalize", served.normalize)
        truncate = schema.boolean(body, "truncate", c.truncate)
        schema.choice(body, "truncation_direction", "right", ("right", "Right"))
        if body.get("prompt_name") is not None:
            raise schema.RequestError(422, "prompt_name", "prompt_name: expected null (this model has no "
                                      f"prompts), got {body['prompt_name']!r}")
        return texts, normalize, truncate, {}

    def respond_tei(results: list[np.ndarray], items: list[Item], extra: dict) -> Response:
        return _json([v.tolist() for v in results])

    # Classification -------------------------------------------------------------------------------
    def parse_predict(body: dict) -> tuple:
        schema.check_fields(body, ("inputs", "truncate"))
        records = schema.records(body, "inputs", c.max_client_batch)
        return records, None, schema.boolean(body, "truncate", c.truncate), {"records": records}

    def respond_predict(results: list[list[float]], items: list[Item], extra: dict) -> Response:
        labels, out = served.labels, []
        for record, probs in zip(extra["records"], results, strict=True):
            best = labels[max(range(len(probs)), key=probs.__getitem__)]
            # As `tformer predict --format jsonl` writes it.
            out.append({**record, "label": best,
                        "probabilities": {n: round(p, 6) for n, p in zip(labels, probs, strict=True)}})
        return _json({"predictions": out, **_usage(items)})

    # Generation -----------------------------------------------------------------------------------
    def parse_generate(body: dict) -> tuple:
        schema.check_fields(body, ("inputs", "beam_size", "max_new_tokens", "length_penalty", "truncate"))
        texts = schema.texts(body, "inputs", c.max_client_batch)
        beam = schema.integer(body, "beam_size", 1, 1, schema.MAX_BEAM)
        new = schema.integer(body, "max_new_tokens", served.max_new_tokens, 1, served.max_target_tokens)
        penalty = schema.number(body, "length_penalty", 1.0, 0.0)
        return texts, (beam, new, penalty), schema.boolean(body, "truncate", c.truncate), {}

    def respond_generate(results: list[str], items: list[Item], extra: dict) -> Response:
        return _json({"outputs": results, **_usage(items)})

    table = {"/v1/embeddings": (parse_openai, respond_openai), "/embed": (parse_tei, respond_tei),
             "/predict": (parse_predict, respond_predict), "/generate": (parse_generate, respond_generate)}

    def bind(path: str) -> Handler:
        parse, respond = table[path]

        async def handler(request: Request) -> Response:
            return await service.answer(request, path, parse, respond)
        return handler

    return {path: bind(path) for path in POST_PATHS}


def _usage(items: list[Item]) -> dict[str, Any]:
    tokens = sum(item.n for item in items)
    return {"usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "truncated_inputs": [i for i, item in enumerate(items) if item.truncated]}


def _vector(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # OpenAI's: the float32 values' little-endian bytes
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


def _json(value: Any) -> Response:
    return Response(json.dumps(value, ensure_ascii=False, separators=(",", ":")),
                    media_type="application/json")
