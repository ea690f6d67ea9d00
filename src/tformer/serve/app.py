"""The ASGI application: routes by what the directory holds, each request through the batcher.

    app = create_app(ServeConfig(model="runs/my-run"))   # loads the model; uvicorn serves it

Embeddings: POST /v1/embeddings (OpenAI's shape) and POST /embed (text-embeddings-inference's);
classification: POST /predict; seq2seq: POST /generate; always GET /health, /info, /metrics.
A request's texts are tokenized here, in the event loop, queued as jobs (``Batcher``), and its
answer is sent when all its jobs are done. Errors are JSON naming the field (``schema``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Hashable
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

import tformer
from tformer.devices import resolve_device
from tformer.nn.precision import resolve_precision
from tformer.serve import routes, schema
from tformer.serve.batcher import Batcher, QueueFull
from tformer.serve.config import ServeConfig
from tformer.serve.metrics import Metrics
from tformer.serve.models import Item, Served, TooLong, load_served
from tformer.serve.schema import RequestError

log = logging.getLogger("tformer.serve")
MAX_BODY_BYTES = 16 * 1024 * 1024
# A status for the log and /metrics only: the client that would read it has gone (nginx's 499).
CLIENT_GONE = 499


class ClientGone(Exception):
    pass


class Service:
    """The model, its batcher and the metrics, shared by the routes of one worker."""

    def __init__(self, config: ServeConfig, served: Served) -> None:
        self.config, self.served, self.metrics = config, served, Metrics()
        self.batcher = Batcher(served.run, config.max_batch_tokens, config.max_wait_ms, config.max_queue,
                               self.metrics, thread_init=self._thread_init)

    def _thread_init(self) -> None:
        torch.set_num_threads(self.config.threads_per_worker)

    def warm_up(self) -> None:
        """One small batch before serving: the first request should not pay for kernel setup."""
        self._thread_init()
        self.served.warm_up()

    # One request ------------------------------------------------------------------------------
    async def answer(self, request: Request, endpoint: str,
                     parse: Callable[[dict], tuple[list, Hashable, bool, dict]],
                     respond: Callable[[list, list[Item], dict], Response]) -> Response:
        """Read, check, queue, wait (or notice the client leave), answer; and count it."""
        started = time.perf_counter()
        try:
            body = schema.parse_json(await _read_body(request))
            inputs, key, truncate, extra = parse(body)
            try:
                items = self.served.items(inputs, truncate)
            except TooLong as e:
                raise RequestError(413, schema_field(body), str(e)) from None
            futures = self.batcher.submit(items, key)
            results = await _wait_or_disconnect(request, futures)
            response = respond(results, items, extra)
            truncated = [i for i, item in enumerate(items) if item.truncated]
            if truncated:
                response.headers["X-Truncated-Inputs"] = ",".join(map(str, truncated))
                self.metrics.truncated.inc(len(truncated))
            self.metrics.inputs.inc(len(items), endpoint=endpoint)
        except RequestError as e:
            response = JSONResponse(e.body(), status_code=e.status)
        except QueueFull as e:
            response = JSONResponse(RequestError(503, None, str(e), "overloaded").body(), status_code=503,
                                    headers={"Retry-After": str(e.retry_after)})
        except ClientGone:
            self.metrics.disconnected.inc()
            response = Response(status_code=CLIENT_GONE)
        except Exception as e:  # a bug, or the model failed: logged with its traceback, answered as JSON
            log.exception("%s: internal error", endpoint)
            response = JSONResponse(RequestError(500, None, f"internal error: {type(e).__name__}: {e}",
                                                 "server_error").body(), status_code=500)
        self.metrics.requests.inc(endpoint=endpoint, code=str(response.status_code))
        self.metrics.latency.observe(time.perf_counter() - started, endpoint=endpoint)
        return response


def schema_field(body: dict) -> str:
    """The inputs' field name in this body (OpenAI says input, the others inputs)."""
    return "input" if "input" in body else "inputs"


async def _read_body(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RequestError(413, "body", f"body: expected at most {MAX_BODY_BYTES} bytes, got more")
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait_or_disconnect(request: Request, futures: list[asyncio.Future]) -> list[Any]:
    """The jobs' results; if the client disconnects first, cancel them (freeing their places)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    results = asyncio.gather(*futures)
    watcher = asyncio.ensure_future(disconnected())
    done, _ = await asyncio.wait({results, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if results in done:
        watcher.cancel()
        return results.result()
    results.cancel()  # cancels every job not yet answered
    with contextlib.suppress(asyncio.CancelledError):
        await results
    raise ClientGone


# Routes ---------------------------------------------------------------------------------------------
def create_app(config: ServeConfig, served: Served | None = None) -> Starlette:
    """The application for one worker; loads the model unless given one."""
    torch.set_num_threads(config.threads_per_worker)
    # "auto" becomes what runs here, so that /info names it.
    device = resolve_device(config.device, "--device")
    config = dataclasses.replace(config, device=str(device), dtype=resolve_precision(config.dtype, device)[0])
    served = served or load_served(config.model, config.dtype, config.max_input_tokens, device)
    service = Service(config, served)
    handlers = routes.handlers(service)
    endpoints = {path: handlers[path] for path in served.endpoints}

    def other_kind(path: str) -> Callable:
        async def refuse(request: Request) -> Response:
            return JSONResponse(RequestError(404, None, f"{path}: this server holds the {served.kind} model; "
                                             f"its endpoints are {', '.join(served.endpoints)}").body(),
                                status_code=404)
        return refuse

    post = [Route(p, endpoints.get(p, other_kind(p)), methods=["POST"]) for p in routes.POST_PATHS]
    get = [Route("/health", lambda r: JSONResponse({"status": "ok"})),
           Route("/info", lambda r: JSONResponse(info(service))),
           Route("/metrics", lambda r: PlainTextResponse(service.metrics.render(),
                                                         media_type="text/plain; version=0.0.4"))]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await service.batcher.call_in_model_thread(service.warm_up)
        service.batcher.start()
        yield
        await service.batcher.stop()  # uvicorn has answered its connections: nothing waits

    app = Starlette(routes=post + get, lifespan=lifespan)
    app.state.service = service
    return app


def app_from_env() -> Starlette:
    """uvicorn's factory for worker processes: settings from $TFORMER_SERVE_CONFIG."""
    return create_app(ServeConfig.from_env())


def info(service: Service) -> dict[str, Any]:
    c, served = service.config, service.served
    return {
        "model": c.model_name, "path": str(c.model), "kind": served.kind, "endpoints": list(served.endpoints),
        "dtype": c.dtype, "device": c.device, "version": tformer.__version__, "torch": torch.__version__,
        "threads": c.threads_per_worker, "workers": c.workers,
        "limits": {"max_batch_tokens": c.max_batch_tokens, "max_wait_ms": c.max_wait_ms,
                   "max_input_tokens": served.max_input_tokens, "max_queue": c.max_queue,
                   "max_client_batch": c.max_client_batch, "truncate": c.truncate,
                   "max_body_bytes": MAX_BODY_BYTES},
        **served.describe(),
    }
