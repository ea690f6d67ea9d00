"""Connections that cannot stay open forever: uvicorn's HTTP protocol with timeouts, a bound,
and a drain that drops stalled clients.

uvicorn closes a connection only after a keep-alive pause between requests
(``--keep-alive-timeout``). ``GuardedProtocol`` adds what an open network needs:

    --header-timeout   a request's headers must arrive within this many seconds of its first
                       byte (or of the connection, for its first request): 408, then closed
    --body-timeout     its body within this many seconds of its headers: 408, then closed;
                       and an answer the client stops reading (the write buffer full, nothing
                       taken for this many seconds) is dropped: a client that never read its
                       answers held each connection and megabytes of buffer for ever
    --max-connections  connections past this many (per worker) get 503 and are closed at once
    --max-connections-per-client
                       so do connections past this many from one client address (per worker):
                       512 slow connections from one address (headers sent a byte at a time)
                       took every place, and every other client got 503 until they timed out
    MAX_PIPELINED      requests waiting behind the one being answered, on one connection:
                       past them, those are answered, what else arrives is dropped and the
                       connection closed (a client must retry what was not answered, RFC 9112
                       §9.3.2); uvicorn parsed all it read, and 4 MB of pipelined GET /health
                       from a client that read nothing queued 48,000 requests (+150 MB)
    MAX_HEAD_BYTES     a request line and headers past 64 KiB get 431 and are closed: the parser
                       keeps them in memory, joining each piece to the last (a client streaming
                       headers for --header-timeout seconds held the event loop, and every other
                       client, for that long)
    malformed HTTP     400 with the JSON error every answer has (uvicorn's own is plain text);
                       uvicorn's warning for each ("Invalid HTTP request received.") is
                       summarised (``RepeatedWarnings``): a client sending garbage in a loop
                       wrote a log line a request
    half-close         a client that ends its side (FIN) after its requests still gets their
                       answers, then the connection is closed; a request it cut short gets none.
                       But a FIN while a request waits on the model (``FIN_MEANS_GONE`` in its
                       scope) is a client that gave up (its timeout closed the socket: the two
                       look the same), as nginx and hyper take it: closed, its jobs cancelled
    SIGTERM            connections still reading a request are closed at once (they hold no
                       work); requests in the model get up to --grace-period seconds, then
                       503 (``Limits.begin_drain``), so nothing waits on uvicorn's own cancel

The protocol finds its limits in the lifespan state the app yields (``STATE_KEY``), so the
same class serves one process and each --workers process alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tformer.serve.schema import RequestError

STATE_KEY = "tformer.connections"
# Set in a request's scope by the app once its work is queued: a FIN from now on means the client left.
FIN_MEANS_GONE = "tformer.fin_means_gone"
# Set in a request's scope here for an absolute-form target (GET http://host/path): its host, which
# uvicorn drops (it keeps the path) and which takes the Host header's place (RFC 9112 §3.2.2).
TARGET_HOST = "tformer.target_host"
# Most bytes of a request line and headers. nginx allows 32 KiB (4 x 8k buffers), Node.js 16 KiB,
# hyper (TEI's server) about 400 KiB; the clients here send well under 1 KiB.
MAX_HEAD_BYTES = 64 * 1024
MAX_PIPELINED = 128  # no client here pipelines at all; a test sends 100 in one write
# Seconds a refused connection keeps reading (and dropping) what its client still sends, after
# the answer and the end of our side (nginx's lingering close): closed at once, the kernel answers
# that unread data with a reset, and the client could lose the answer (http.client: 9 in 10
# times, for a 300 kB header).
LINGER_S = 2.0
# Of each uvicorn warning (one a malformed request: "Invalid HTTP request received."), this many
# are logged in each this many seconds; the rest are counted (RepeatedWarnings).
WARNING_BURST, WARNING_WINDOW_S = 5, 60.0
WARNING_KINDS = 256  # most kinds of warning counted at once (a message formatted in place is one each)


@dataclass(frozen=True)
class Limits:
    header_timeout: float
    body_timeout: float
    max_connections: int
    max_connections_per_client: int
    begin_drain: Callable[[], None]  # called on SIGTERM, before uvicorn waits for requests


def _reply(status: bytes, message: str, kind: str, extra: bytes = b"") -> bytes:
    """A whole response written on the socket: the JSON error every other answer has."""
    code = int(status.split()[0])
    body = json.dumps(RequestError(code, None, message, kind).body(), separators=(",", ":")).encode()
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n%s\r\n%s" % (status, len(body), extra, body))


TIMEOUT = _reply(b"408 Request Timeout", "request: its headers or body did not arrive in time "
                 "(--header-timeout / --body-timeout)", "invalid_request_error")
HEAD_TOO_LARGE = _reply(b"431 Request Header Fields Too Large", f"request: expected a request line and "
                        f"headers of at most {MAX_HEAD_BYTES} bytes, got more", "invalid_request_error")
MALFORMED = _reply(b"400 Bad Request", "request: expected HTTP/1.1 (its request line, headers, "
                   "Content-Length or chunks could not be parsed)", "invalid_request_error")
BUSY = _reply(b"503 Service Unavailable", "server: too many open connections (--max-connections), or "
              "shutting down; retry", "overloaded", b"retry-after: 1\r\n")
CLIENT_BUSY = _reply(b"503 Service Unavailable", "server: too many open connections from your address "
                     "(--max-connections-per-client); retry", "overloaded", b"retry-after: 1\r\n")


class RepeatedWarnings(logging.Filter):
    """Of each warning (by its format string), the first ``burst`` in a ``window`` of seconds
    pass; the rest are counted, and the first one after the window passes with that count."""

    def __init__(self, burst: int = WARNING_BURST, window: float = WARNING_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.window, self.clock = burst, window, clock
        self.seen: dict[str, list] = {}  # format string -> [window start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        now = self.clock()
        key = str(record.msg)
        if key not in self.seen and len(self.seen) >= WARNING_KINDS:  # messages formatted in place
            self._forget_quiet(now)  # each a kind of its own: the table stays bounded
            if len(self.seen) >= WARNING_KINDS:
                return True
        seen = self.seen.setdefault(key, [now, 0, 0])
        if now - seen[0] >= self.window:
            if seen[2]:
                record.msg = f"{record.msg} ({seen[2]} more like it in {now - seen[0]:.0f} s, not logged)"
            seen[:] = [now, 0, 0]
        if seen[1] < self.burst:
            seen[1] += 1
            return True
        seen[2] += 1
        return False

    def _forget_quiet(self, now: float) -> None:
        """Drop the kinds whose window has passed with nothing left untold."""
        for key in [k for k, (start, _, dropped) in self.seen.items()
                    if now - start >= self.window and not dropped]:
            del self.seen[key]

    def flush(self, logger: logging.Logger) -> None:
        """The counts not yet told (when the server stops)."""
        now = self.clock()
        for message, (start, _, dropped) in self.seen.items():
            if dropped:
                logger.warning("%s (%d more like it in %.0f s, not logged)", message, dropped, now - start)
        self.seen.clear()


@contextlib.contextmanager
def repeated_warnings_summarised(logger: logging.Logger) -> Iterator[RepeatedWarnings]:
    """``RepeatedWarnings`` on uvicorn's logger while the server runs."""
    repeated = RepeatedWarnings()
    logger.addFilter(repeated)
    try:
        yield repeated
    finally:
        logger.removeFilter(repeated)
        repeated.flush(logger)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus the header and body deadlines, the bound and the drain."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None  # the client takes nothing of the answer
        self._unsent = 0  # bytes waiting in the write buffer when that timer was armed
        self._reading = False  # between a request's first byte and its last
        self._received = False
        self._in_head = True  # the parser is reading a request line and headers (or waits for them)
        self._head_bytes = 0  # bytes received since then
        self._head_size = 0  # the parsed head's URL and headers, in bytes
        self._refusal = MALFORMED  # what a parser error answers
        self._lingering = False  # answered and refused: what still arrives is dropped
        self._dropping = False  # past MAX_PIPELINED: what still arrives is dropped
        self._received_whole: deque = deque()  # cycles of requests received whole, not yet answered
        limits = self._limits()
        if limits is None:
            return
        refusal = None
        if len(self.connections) > limits.max_connections:
            refusal = BUSY
        elif self._from_this_client() > limits.max_connections_per_client:
            refusal = CLIENT_BUSY
        if refusal is not None:
            self.connections.discard(self)
            transport.write(refusal)
            transport.close()
            return
        self._arm(limits.header_timeout)

    def _from_this_client(self) -> int:
        """Open connections from this one's address, itself included (a count, not kept: it
        cannot drift; a few hundred comparisons per new connection)."""
        if not self.client:  # a Unix socket: no address to share
            return 1
        host = self.client[0]
        return sum(1 for c in self.connections if c.client and c.client[0] == host)

    def data_received(self, data: bytes) -> None:
        if self._lingering or self._dropping:
            return
        self._received = True
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # A head still incomplete, counted after parsing: a piece that completed a request's
        # headers reset the count, so pipelined requests in one piece are not taken for one head.
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._refuse(HEAD_TOO_LARGE)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes its parser refuses (or a callback of ours stopped), in the
        JSON every answer has; past MAX_PIPELINED, none: the requests queued are answered, the
        last one closes the connection, and what else arrives is dropped."""
        if self._refusal is None:
            self._disarm()  # the deadline of the request refused would cut the answers
            self._dropping, self._reading, self._in_head = True, False, True
            self.cycle.keep_alive = False  # the last one queued
            return
        self._refuse(self._refusal)

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4  # ": " and CRLF
        super().on_header(name, value)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading = True
        self._in_head = True
        limits = self._limits()
        if limits is not None:
            self._arm(limits.header_timeout)

    def on_headers_complete(self) -> None:
        size, self._in_head, self._head_bytes, self._head_size = self._head_size, False, 0, 0
        if size > MAX_HEAD_BYTES:  # a whole head in one piece: stop the parser (send_400_response)
            self._refusal = HEAD_TOO_LARGE
            raise ValueError(f"request head: {size} bytes")
        if len(self.pipeline) >= MAX_PIPELINED:  # stop the parser too (send_400_response)
            self._refusal = None
            raise ValueError(f"pipelined requests: more than {MAX_PIPELINED}")
        if self.url[:1] not in (b"/", b"*"):  # absolute-form (what a client sends a proxy)
            self.scope[TARGET_HOST] = httptools.parse_url(self.url).host or b""  # no URL: a 400
        super().on_headers_complete()
        limits = self._limits()
        if limits is not None and self._reading:
            self._arm(limits.body_timeout)

    def on_message_complete(self) -> None:
        self._reading = False
        while self._received_whole and self._received_whole[0].response_complete:  # answered in order
            self._received_whole.popleft()
        self._received_whole.append(self.cycle)
        self._in_head, self._head_bytes = True, 0
        self._disarm()
        super().on_message_complete()

    def eof_received(self) -> bool | None:
        """The client ended its side (FIN). Returning None closes the connection at once (asyncio),
        as uvicorn did: a client that sent a request and shut its side (``nc -N``,
        ``shutdown(SHUT_WR)``) got nothing. Now the requests it sent whole are answered, then the
        connection is closed (True keeps our side open); unless one waits on the model, where
        the FIN means the client left (see the module's docstring)."""
        unanswered = [c for c in self._received_whole if not c.response_complete]
        if self._lingering or not unanswered or any(c.scope.get(FIN_MEANS_GONE) for c in unanswered):
            return None
        last = unanswered[-1]
        cut_short = self.pipeline[0] if self.pipeline else None
        if cut_short is not None and cut_short[0] is not last:  # a body cut by the FIN: never run
            self.pipeline.popleft()
        self._disarm()  # a deadline for the request cut short would cut the answers too
        last.keep_alive = False  # the cycle closes the connection after its answer
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_send_timer()
        # uvicorn tells only the newest request that its client left: one before it, still being
        # answered (pipelined), wrote on the closed transport (uvloop: RuntimeError, logged as
        # an exception in the application with its traceback)
        for cycle in self._received_whole:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The write buffer is full (the client reads slower than we write): from now on the
        client must take some of it every --body-timeout seconds."""
        super().pause_writing()
        limits = self._limits()
        if limits is not None:
            self._arm_send(limits.body_timeout)

    def resume_writing(self) -> None:
        self._stop_send_timer()
        super().resume_writing()

    def shutdown(self) -> None:
        limits = self._limits()
        if limits is not None:
            limits.begin_drain()
        if self._reading:  # a stalled or slow client: no work of its is in the model yet
            self._disarm()
            self.transport.close()
            return
        super().shutdown()

    # Deadlines -------------------------------------------------------------------------------------
    def _limits(self) -> Limits | None:
        return self.app_state.get(STATE_KEY)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        timer = getattr(self, "_timer", None)
        if timer is not None:
            timer.cancel()
            self._timer = None

    def _arm_send(self, seconds: float) -> None:
        self._stop_send_timer()
        self._unsent = self.transport.get_write_buffer_size()
        self._send_timer = self.loop.call_later(seconds, self._send_expired, seconds)

    def _stop_send_timer(self) -> None:
        timer = getattr(self, "_send_timer", None)
        if timer is not None:
            timer.cancel()
            self._send_timer = None

    def _send_expired(self, seconds: float) -> None:
        self._send_timer = None
        if self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size() < self._unsent:  # slow, but reading: wait again
            self._arm_send(seconds)
            return
        self.transport.abort()  # nothing can reach a client that reads nothing: drop the buffer too

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        # A client that sent nothing at all is just closed; so is one still sending a body that
        # was already answered (a 413 for its declared length): one request, one answer.
        answered = not self._in_head and self.cycle is not None and self.cycle.response_started
        if self._received and not answered:
            self.transport.write(TIMEOUT)
        self.transport.close()

    def _refuse(self, reply: bytes) -> None:
        """Answer, end our side, and close once the client closes its own (or after LINGER_S)."""
        self._disarm()
        if self.transport.is_closing():
            return
        self.transport.write(reply)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self._lingering = True
        self.transport.write_eof()  # the client reads the answer, then its end; eof_received closes
        self._timer = self.loop.call_later(LINGER_S, self.transport.close)
