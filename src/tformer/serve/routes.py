"""Which endpoints a server has: the protocols its model kind speaks, and the plain GETs.

    embedding       POST /v1/embeddings (OpenAI), /embed, / and /tokenize (TEI)
    classification  POST /predict, / and /tokenize (TEI; / also Hugging Face's task API)
    seq2seq         POST /generate and / (TGI), /v1/completions (OpenAI), /tokenize
    always          GET /health, /info, /metrics, /v1/models, /v1/models/{id}

Each protocol module (openai_api, tei_api, tgi_api) says, per path, how a body is read
(``parse``) and how results are written (``respond``); ``Service.answer`` (app.py) does the rest.
A model path of another kind answers 404 naming this server's endpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tformer.serve import openai_api, tei_api, tgi_api
from tformer.serve.endpoint import Endpoint, Service, error
from tformer.serve.schema import RequestError

# Every POST path of any kind: a path of another kind is a 404 that names this server's.
POST_PATHS = ("/v1/embeddings", "/v1/completions", "/embed", "/predict", "/generate", "/tokenize", "/")


# Each model kind's protocols (each builder gives its endpoints by path), and its /info fields.
PROTOCOLS: dict[str, tuple[Callable[[Service], dict[str, Endpoint]], ...]] = {
    "embedding": (openai_api.embeddings, tei_api.embedding, tei_api.tokenize),
    "classification": (tei_api.classification, tei_api.tokenize),
    "seq2seq": (tgi_api.generation, openai_api.completions, tei_api.tokenize),
}
INFO: dict[str, Callable[[Service], dict[str, Any]]] = {
    "embedding": tei_api.info, "classification": tei_api.info, "seq2seq": tgi_api.info}


def endpoints(service: Service) -> dict[str, Endpoint]:
    """The model endpoints of this server's kind, by path."""
    return {path: e for build in PROTOCOLS[service.served.kind] for path, e in build(service).items()}


def routes(service: Service) -> list[Route]:
    served, started = service.served, int(time.time())
    by_path = endpoints(service)

    def bind(path: str) -> Callable:
        if path in by_path:
            async def handler(request: Request) -> Response:
                return await service.answer(request, path, by_path[path])
            return handler

        async def refuse(request: Request) -> Response:
            return error(RequestError(404, None, f"{path}: this server holds the {served.kind} model; its "
                                      f"endpoints are {', '.join(sorted(by_path))}"))
        return refuse

    def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [openai_api.model_card(service, started)]})

    def model(request: Request) -> Response:
        name = request.path_params["name"]
        if name != service.config.model_name:
            held = service.config.model_name
            return error(RequestError(404, "model", f"model: this server holds {held!r}, not {name!r}"))
        return JSONResponse(openai_api.model_card(service, started))

    post = [Route(p, bind(p), methods=["POST"]) for p in POST_PATHS]
    get = [Route("/health", lambda r: JSONResponse({"status": "ok"})),
           Route("/info", lambda r: JSONResponse(service.info())),
           Route("/metrics", lambda r: PlainTextResponse(service.metrics.render(),
                                                         media_type="text/plain; version=0.0.4")),
           Route("/v1/models", models), Route("/v1/models/{name:path}", model)]
    return post + get
