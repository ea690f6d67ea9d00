"""The ASGI application: routes by what the directory holds, each request through the batcher.

    app = create_app(ServeConfig(model="runs/my-run").decide())   # loads the model; uvicorn serves it

A request's body is read (within --body-timeout: connections.py) and checked (schema), its
texts tokenized in a small pool of tokenizer threads (never in the event loop: a 5 MB text must
not hold up /health; and bodies over ``SMALL_BODY_BYTES`` in a pool of their own, so that large
ones never hold up small ones), queued as jobs (``Batcher``), and its answer sent when all its
jobs are done. Errors are JSON naming the field; nothing a client sends reaches a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

import tformer
from tformer.kinds import load_served
from tformer.kinds.run import Run
from tformer.kinds.serving import InputRefused, Item
from tformer.serve import connections, exposure, routes, schema
from tformer.serve.batcher import Batcher, QueueFull, ShuttingDown
from tformer.serve.config import ServeConfig
from tformer.serve.endpoint import Endpoint, error
from tformer.serve.metrics import Metrics
from tformer.serve.schema import RequestError

log = logging.getLogger("tformer.serve")
MAX_BODY_BYTES = 16 * 1024 * 1024
# Bodies up to this size are tokenized in threads of their own, in ~50 ms at most (a 64 KiB
# word); larger ones can take a minute (tokenizing a long text's prefix), and
# two of them held both threads while every small request waited (56 s, all-MiniLM-L6-v2).
SMALL_BODY_BYTES = 64 * 1024
SMALL_ANSWER_ITEMS = 8  # answers of at most this many inputs are written on the event loop
# A body's commas outside strings are counted as it arrives (schema.ValueCounter): each JSON value
# past the first in a list or object takes one, and the parser holds the GIL (so the event loop,
# and /health) for all the values in one call, even in a tokenizer thread: 16 MB of [1,1,...] (8M
# ids) held /health for 375 ms, 5.6M empty lists for 390 ms. A request needs at most
# --max-client-batch x --max-input-tokens of them (token ids past the limit are cut), plus a few
# for its other fields. Commas in texts are not values: long texts to be cut are fine.
FIELD_COMMAS = 64
# A status for the log and /metrics only: the client that would read it has gone (nginx's 499).
CLIENT_GONE = 499


class ClientGone(Exception):
    pass


class Service:
    """The model, its batcher, the tokenizer threads and the metrics of one worker."""

    def __init__(self, config: ServeConfig, served: Run) -> None:
        self.config, self.served, self.metrics = config, served, Metrics()
        # The model-dir case cut its tokenizer at --max-input-tokens; a run refuses past it.
        self.input_limit = config.max_input_tokens or served.max_input_tokens
        self.batcher = Batcher(served.run_batch, config.max_batch_tokens, config.max_wait_ms,
                               config.max_queue, self.metrics, thread_init=self._thread_init)
        self.tokenizers = ThreadPoolExecutor(config.tokenization_workers,
                                             thread_name_prefix="tformer-tokenize")
        self.large_tokenizers = ThreadPoolExecutor(config.tokenization_workers,
                                                   thread_name_prefix="tformer-tokenize-large")
        self._drain: asyncio.TimerHandle | None = None
        # A model without a length limit: an input of more tokens than a batch holds is of no use.
        input_tokens = self.input_limit or config.max_batch_tokens
        self.max_commas = config.max_client_batch * input_tokens + FIELD_COMMAS

    def _thread_init(self) -> None:
        torch.set_num_threads(self.config.threads_per_worker)

    def warm_up(self) -> None:
        """One small batch before serving: the first request should not pay for kernel setup."""
        self._thread_init()
        self.served.warm_up()

    def begin_drain(self) -> None:
        """SIGTERM: what is in the model gets --grace-period seconds, the requests with the least
        work left first (as many as can finish), then the rest's clients get 503."""
        if self._drain is None:
            loop = asyncio.get_running_loop()
            self.batcher.drain()
            self._drain = loop.call_later(self.config.grace_period, self.batcher.abandon)

    # One request ---------------------------------------------------------------------------------
    async def answer(self, request: Request, path: str, endpoint: Endpoint) -> Response:
        """Read, check, tokenize, queue, wait (or notice the client leave), answer; and count it."""
        started = time.perf_counter()
        try:
            _check_content_type(request)
            raw = await _read_body(request, self.max_commas)
            loop = asyncio.get_running_loop()
            tokenizers = self.tokenizers if len(raw) <= SMALL_BODY_BYTES else self.large_tokenizers
            # Parsing and checking run in the tokenizer threads too: on the event loop, a 14 MB
            # body of empty lists held /health for 12 s.
            read = await loop.run_in_executor(tokenizers, self._read, raw, endpoint)
            if isinstance(read, Response):  # /tokenize: answered in the thread
                response = read
            else:
                items, key, extra = read
                request.scope[connections.FIN_MEANS_GONE] = True  # the client's FIN now cancels
                results = await _wait_or_disconnect(request, self.batcher.submit(items, key))
                # A long answer is written in the thread too (256 vectors of JSON must not hold
                # up /health); a short one here, without a second hand-off to a thread.
                if len(items) <= SMALL_ANSWER_ITEMS:
                    response = endpoint.respond(results, items, extra)
                else:
                    response = await loop.run_in_executor(tokenizers, endpoint.respond, results, items, extra)
                truncated = [i for i, item in enumerate(items) if item.truncated]
                if truncated:
                    response.headers["X-Truncated-Inputs"] = ",".join(map(str, truncated))
                    self.metrics.truncated.inc(len(truncated))
                self.metrics.inputs.inc(len(items), endpoint=path)
        except RequestError as e:
            response = error(e)
        except QueueFull as e:
            response = error(RequestError(503, None, str(e), "overloaded"),
                             {"Retry-After": str(e.retry_after)})
        except ShuttingDown as e:
            response = error(RequestError(503, None, str(e), "overloaded"), {"Retry-After": "1"})
        except (ClientGone, ClientDisconnect):
            self.metrics.disconnected.inc()
            response = Response(status_code=CLIENT_GONE)
        except asyncio.CancelledError:  # uvicorn's forced exit (a second Ctrl-C) cancels what is open
            response = error(RequestError(503, None, "server: stopped at once (forced exit); retry on "
                                          "another server", "overloaded"), {"Retry-After": "1"})
        except Exception as e:  # a bug, or the model failed: logged with its traceback; no detail leaks
            log.exception("%s: internal error", path)
            response = error(RequestError(500, None, f"internal error ({type(e).__name__}); the server's "
                                          "log has the details", "server_error"))
        self.metrics.requests.inc(endpoint=path, code=str(response.status_code))
        self.metrics.latency.observe(time.perf_counter() - started, endpoint=path)
        return response

    def _read(self, raw: bytes, endpoint: Endpoint) -> tuple[list[Item], Any, dict] | Response:
        """In a tokenizer thread: the body parsed and checked, its inputs tokenized (items, the
        batch key, the endpoint's extra); or, for /tokenize, the answer itself."""
        body = schema.parse_json(raw)
        inputs, key, truncate, extra = endpoint.parse(body)
        try:
            if endpoint.tokenize_only:
                return endpoint.respond(self.served.tokenize(inputs, key), [], extra)
            return self.served.admit(inputs, truncate, self.input_limit), key, extra
        except InputRefused as e:
            field = "inputs" if endpoint.tokenize_only or "input" not in body else "input"
            raise RequestError(e.status, field, str(e)) from None

    def info(self) -> dict[str, Any]:
        """GET /info: TEI's (or TGI's) fields, then tformer's; no filesystem paths."""
        c, served = self.config, self.served
        return {
            **routes.info(self),
            "version": tformer.__version__, "sha": None, "docker_label": None,
            "model": c.model_name, "kind": served.kind, "endpoints": sorted(routes.endpoints(self)),
            "dtype": c.dtype, "device": c.device, "torch": torch.__version__, "threads": c.threads_per_worker,
            "workers": c.workers,
            "limits": {"max_batch_tokens": c.max_batch_tokens, "max_wait_ms": c.max_wait_ms,
                       "max_input_tokens": self.input_limit, "max_queue": c.max_queue,
                       "max_client_batch": c.max_client_batch, "truncate": c.truncate,
                       "max_body_bytes": MAX_BODY_BYTES, "max_body_commas": self.max_commas,
                       "header_timeout": c.header_timeout,
                       "body_timeout": c.body_timeout, "keep_alive_timeout": c.keep_alive_timeout,
                       "max_connections": c.max_connections,
                       "max_connections_per_client": c.connections_per_client,
                       "grace_period": c.grace_period},
            **served.describe(),
        }


def _check_content_type(request: Request) -> None:
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise RequestError(415, "Content-Type", f"Content-Type: expected application/json, got "
                           f"{media_type[:60] or 'nothing'!r}")
    # A compressed body was read as JSON and refused as malformed ("can't decode byte 0x8b"),
    # which sent the client looking at its JSON; nothing here decompresses (RFC 9110 §15.5.16).
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", ""):
        raise RequestError(415, "Content-Encoding", f"Content-Encoding: expected identity (an "
                           f"uncompressed body), got {encoding[:60]!r}")
    # The same for a transfer coding before the chunks ("gzip, chunked": the parser joins the
    # chunks and leaves the gzip); RFC 9112 §6.1 answers a coding the server lacks with 501.
    transfer = request.headers.get("transfer-encoding", "chunked")
    if any(coding.strip().lower() != "chunked" for coding in transfer.split(",")):
        raise RequestError(501, "Transfer-Encoding", f"Transfer-Encoding: expected chunked or none, "
                           f"got {transfer[:60]!r}")
    # A protocol upgrade the server does not speak (h2c, or websocket) is ignored, as RFC 9110
    # §7.8 allows, but the HTTP parser has handed the bytes after the headers, the body, to the
    # protocol it would switch to: the body read empty, "malformed JSON (char 0)".
    connection = {token.strip().lower() for token in request.headers.get("connection", "").split(",")}
    if "upgrade" in connection and "upgrade" in request.headers:
        raise RequestError(400, "Upgrade", f"Upgrade: expected none on a request with a body (the server "
                           f"answers in HTTP/1.1), got {request.headers['upgrade'][:60]!r}")


async def _read_body(request: Request, max_commas: int) -> bytes:
    """The body, refused (413) as soon as it passes MAX_BODY_BYTES or ``max_commas`` (see
    FIELD_COMMAS): before it is parsed, and before the rest of it is read."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise RequestError(413, "body", f"body: expected at most {MAX_BODY_BYTES} bytes, got {int(length)}")
    chunks, size, values = [], 0, schema.ValueCounter()
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RequestError(413, "body", f"body: expected at most {MAX_BODY_BYTES} bytes, got more")
        if values.feed(chunk) > max_commas:
            raise RequestError(413, "body", f"body: expected at most {max_commas} commas (JSON values: "
                               "--max-client-batch x --max-input-tokens token ids, and a few fields), "
                               "got more")
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait_or_disconnect(request: Request, futures: list[asyncio.Future]) -> list[Any]:
    """The jobs' results; if the client disconnects first, cancel them (freeing their places)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    results = asyncio.gather(*futures)
    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({results, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server stops at once: the jobs' places are freed too
        results.cancel()
        results.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: not logged
        watcher.cancel()
        raise
    if results in done:
        watcher.cancel()
        return results.result()
    results.cancel()  # cancels every job not yet answered
    with contextlib.suppress(asyncio.CancelledError):
        await results
    raise ClientGone


async def _starlette_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (a path no route has, a method its route does not take) in the
    JSON every other error has; the 405's Allow header kept."""
    where = f"{request.method} {request.url.path[:200]}"
    # Starlette spells the header "Allow"
    allow = next((v for k, v in (exc.headers or {}).items() if k.lower() == "allow"), "?")
    if exc.status_code == 404:
        message = f"{where}: no such endpoint; this server's are {routes.known(request.app.state.service)}"
    elif exc.status_code == 405:
        message = f"{where}: method not allowed (allowed: {allow})"
    else:
        message = f"{where}: {exc.detail}"
    return error(RequestError(exc.status_code, None, message), exc.headers)


# The application -------------------------------------------------------------------------------------
def create_app(config: ServeConfig, served: Run | None = None) -> Starlette:
    """The application for one worker of a decided config (``ServeConfig.decide``: its device
    and precision are what runs); loads the model unless given one."""
    if not config.decided:
        raise ValueError(f"config: expected a decided ServeConfig (ServeConfig.decide()), got dtype "
                         f"{config.dtype!r} on device {config.device!r}")
    torch.set_num_threads(config.threads_per_worker)
    served = served or load_served(config.model, config.device, config.dtype, config.max_input_tokens)
    service = Service(config, served)
    limits = connections.Limits(config.header_timeout, config.body_timeout, config.max_connections,
                                config.connections_per_client, service.begin_drain)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await service.batcher.call_in_model_thread(service.warm_up)
        service.batcher.start()
        with connections.repeated_warnings_summarised(logging.getLogger("uvicorn.error")):
            yield {connections.STATE_KEY: limits}  # the lifespan state: uvicorn hands it to each connection
        await service.batcher.stop()  # uvicorn has answered its connections: nothing waits
        for pool in (service.tokenizers, service.large_tokenizers):
            pool.shutdown(wait=False, cancel_futures=True)

    app = Starlette(routes=routes.routes(service), lifespan=lifespan, middleware=exposure.middleware(config),
                    exception_handlers={HTTPException: _starlette_error})
    app.state.service = service
    app.router.redirect_slashes = False  # each path is served with its slash too (routes.py)
    return app


def app_from_env() -> Starlette:
    """uvicorn's factory for worker processes: settings from $TFORMER_SERVE_CONFIG."""
    return create_app(ServeConfig.from_env())
