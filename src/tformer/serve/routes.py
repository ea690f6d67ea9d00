"""Which endpoints a server has: the protocols its run answers, and the plain GETs.

    openai.embeddings   POST /v1/embeddings (OpenAI)
    openai.completions  POST /v1/completions (OpenAI)
    tei.embed           POST /embed and / (TEI; / also Hugging Face's task API)
    tei.predict         POST /predict and / (TEI; / also Hugging Face's task API)
    tei.rerank          POST /rerank and / (TEI)
    tei.tokenize        POST /tokenize (TEI)
    tgi.generate        POST /generate and / (TGI)
    hf.fill_mask        POST / (Hugging Face's fill-mask task)
    hf.token_classification  POST / (Hugging Face's task API: InferenceClient.token_classification)
    always              GET /health, /info, /metrics, /v1/models, /v1/models/{id}

Each kind's Run class names the protocols it answers (``Run.protocols``, tformer.kinds) and
whose /info fields it gives (``Run.info_protocol``); nothing here asks which kind it is.

Each path answers with a trailing slash too (POST /embed/): Starlette's answer was a 307 redirect
to the bare path, which a client must follow by sending its body again, and one that does not
(curl without -L, a hand-written client) got an empty answer. Any other path is a 404 that
names this server's endpoints.

Each protocol module (openai_api, tei_api, tgi_api, hf_api) says, per path, how a body is read
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

from tformer.serve import hf_api, hf_tasks, openai_api, tei_api, tgi_api
from tformer.serve.endpoint import Endpoint, Service, error
from tformer.serve.schema import RequestError

# Every POST path of any kind: a path of another kind is a 404 that names this server's.
POST_PATHS = ("/v1/embeddings", "/v1/completions", "/embed", "/predict", "/rerank", "/generate", "/tokenize",
              "/")
GET_PATHS = ("/health", "/info", "/metrics", "/v1/models")  # and /v1/models/{id}


# The protocols a run may answer, by name (each builder gives its endpoints by path), and the
# /info fields of each family.
PROTOCOLS: dict[str, Callable[[Service], dict[str, Endpoint]]] = {
    "openai.embeddings": openai_api.embeddings, "openai.completions": openai_api.completions,
    "tei.embed": tei_api.embedding, "tei.predict": tei_api.classification, "tei.rerank": tei_api.rerank,
    "tei.tokenize": tei_api.tokenize,
    "tgi.generate": tgi_api.generation, "hf.fill_mask": hf_api.fill_mask,
    "hf.token_classification": hf_tasks.token_classification,
}
INFO: dict[str, Callable[[Service], dict[str, Any]]] = {"tei": tei_api.info, "tgi": tgi_api.info}


def endpoints(service: Service) -> dict[str, Endpoint]:
    """The model endpoints of this server's run, by path."""
    return {path: e for name in service.served.protocols for path, e in PROTOCOLS[name](service).items()}


def info(service: Service) -> dict[str, Any]:
    """The /info fields of the protocol family the run speaks (TEI's or TGI's)."""
    return INFO[service.served.info_protocol](service)


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
        name = request.path_params["name"].removesuffix("/")  # /v1/models/{id}/ as /v1/models/{id}
        if name != service.config.model_name:
            held = service.config.model_name
            return error(RequestError(404, "model", f"model: this server holds {held!r}, not {name!r}"))
        return JSONResponse(openai_api.model_card(service, started))

    gets = {"/health": lambda r: JSONResponse({"status": "ok"}),
            "/info": lambda r: JSONResponse(service.info()),
            "/metrics": lambda r: PlainTextResponse(service.metrics.render(),
                                                    media_type="text/plain; version=0.0.4"),
            "/v1/models": models}
    post = [Route(p, bind(p), methods=["POST"]) for p in POST_PATHS]
    get = [Route(p, gets[p]) for p in GET_PATHS]
    slashed = [Route(r.path + "/", r.endpoint, methods=r.methods) for r in post + get if r.path != "/"]
    # after the others: /v1/models/ is the list, not a model named ""
    return post + get + slashed + [Route("/v1/models/{name:path}", model)]


def known(service: Service) -> str:
    """This server's endpoints, for a 404: "POST /, /embed, ...; GET /health, ..."."""
    return f"POST {', '.join(sorted(endpoints(service)))}; GET {', '.join(GET_PATHS)}, /v1/models/{{id}}"
