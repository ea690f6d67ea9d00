"""Nothing stays open forever and nothing stalls the event loop: header and body deadlines,
a bound on connections and on a request's head, malformed HTTP answered in JSON, tokenization
in the tokenizer threads, long texts windowed exactly."""

from __future__ import annotations

import http.client
import json
import logging
import selectors
import socket
import threading
import time

import numpy as np
import pytest
from helpers import SpyBackend
from hf_bert_fixtures import WORDS
from serve_fixtures import serve

from tformer.serve.connections import MAX_HEAD_BYTES, WARNING_BURST, RepeatedWarnings
from tformer.text.prefix import AtLeast


@pytest.fixture(scope="module")
def quick_server(embedding_dir):
    live = serve(embedding_dir, header_timeout=0.5, body_timeout=0.5, max_connections=4,
                 max_connections_per_client=4)
    yield live
    live.close()


def _closed_after(sock: socket.socket, limit: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection (bounded by ``limit``)."""
    sock.settimeout(limit)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


@pytest.mark.parametrize("sent, expected", [
    (b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty", b"HTTP/1.1 408 "),  # mid-headers
    (b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
     b"Content-Length: 100\r\n\r\n{\"inputs\"", b"HTTP/1.1 408 "),  # mid-body
    (b"", b""),  # nothing at all: closed without a word
])
def test_a_stalled_connection_is_closed(quick_server, sent, expected):
    with socket.create_connection(("127.0.0.1", quick_server.port)) as sock:
        sock.sendall(sent)
        answer = _closed_after(sock)
        assert answer.startswith(expected)
    if expected:  # the JSON error every answer has
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"content-type: application/json" in head and json.loads(body)["error"]["code"] == 408
    assert quick_server.request("GET", "/health")[0] == 200


def test_connections_past_the_bound_get_503(quick_server):
    held = [socket.create_connection(("127.0.0.1", quick_server.port)) for _ in range(4)]
    try:
        time.sleep(0.1)  # a bound, not a timing: let the server accept the four
        with socket.create_connection(("127.0.0.1", quick_server.port)) as extra:
            assert _closed_after(extra).startswith(b"HTTP/1.1 503 ")
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the four closed: the bound frees up
        try:
            if quick_server.request("GET", "/health")[0] == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the server did not take connections again"
        time.sleep(0.05)


def _json_error(answer: bytes) -> dict:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head, answer[:300]
    return json.loads(body)["error"]


@pytest.mark.parametrize("head", [
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Many: a\r\n" * (MAX_HEAD_BYTES // 10) + b"\r\n",
    b"GET /health?" + b"q" * MAX_HEAD_BYTES + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
])
def test_a_request_head_past_the_limit_gets_431(quick_server, head):
    """Without a bound the parser joined the pieces of an endless header for --header-timeout
    seconds, holding the event loop (and every other client) that long."""
    with socket.create_connection(("127.0.0.1", quick_server.port)) as sock:
        try:
            sock.sendall(head)
        except OSError:  # closed while still sending: the answer was written first
            pass
        answer = _closed_after(sock)
    assert answer.startswith(b"HTTP/1.1 431 ") and _json_error(answer)["code"] == 431
    # a real client's request with a long (but allowed) head, and many pipelined in one write
    conn = http.client.HTTPConnection("127.0.0.1", quick_server.port, timeout=10)
    conn.request("GET", "/health", headers={"X-Long": "a" * (MAX_HEAD_BYTES // 2)})
    assert conn.getresponse().status == 200
    conn.close()
    one = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"p" * 1000 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", quick_server.port)) as sock:
        sock.sendall(one * 99 + one.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        assert _closed_after(sock).count(b"HTTP/1.1 200 ") == 100


def test_a_client_still_sending_a_refused_head_reads_the_431(quick_server):
    """The connection is closed after the client's own end, not at once: the kernel answered a
    close with unread data by a reset, and http.client lost the 431 (9 times in 10, 300 kB)."""
    for _ in range(5):
        conn = http.client.HTTPConnection("127.0.0.1", quick_server.port, timeout=10)
        conn.request("POST", "/embed", body=b'{"inputs": "a"}',
                     headers={"Content-Type": "application/json", "X-Big": "a" * 300_000})
        response = conn.getresponse()
        assert response.status == 431 and json.loads(response.read())["error"]["code"] == 431
        conn.close()


@pytest.mark.parametrize("sent", [
    b"GARBAGE\r\n\r\n",
    b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
    b"GET /health?\xff HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_malformed_http_gets_the_json_400(quick_server, sent):
    with socket.create_connection(("127.0.0.1", quick_server.port)) as sock:
        sock.sendall(sent)
        answer = _closed_after(sock)
    assert answer.startswith(b"HTTP/1.1 400 ") and _json_error(answer)["code"] == 400
    assert quick_server.request("GET", "/health")[0] == 200


def test_garbage_in_a_loop_does_not_flood_the_log(quick_server):
    """uvicorn logs "Invalid HTTP request received." for each request that does not parse: a
    client sending garbage in a loop wrote a line a request. Past a few, they are counted."""
    seen: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = seen.append
    logger = logging.getLogger("uvicorn.error")
    for repeated in logger.filters:  # a new window: earlier tests' garbage is not counted in it
        if isinstance(repeated, RepeatedWarnings):
            repeated.seen.clear()
    logger.addHandler(handler)
    try:
        for _ in range(30):
            with socket.create_connection(("127.0.0.1", quick_server.port)) as sock:
                sock.sendall(b"GARBAGE\r\n\r\n")
                assert _closed_after(sock).startswith(b"HTTP/1.1 400 ")
    finally:
        logger.removeHandler(handler)
    assert len(seen) == WARNING_BURST, [r.getMessage() for r in seen]
    assert quick_server.request("GET", "/health")[0] == 200


def test_repeated_warnings_pass_a_few_then_a_count_once_a_window():
    now = [0.0]
    repeated = RepeatedWarnings(burst=2, window=60.0, clock=lambda: now[0])

    def passed(msg: str, level: int = logging.WARNING) -> str | None:
        record = logging.LogRecord("uvicorn.error", level, __file__, 1, msg, (), None)
        return record.getMessage() if repeated.filter(record) else None

    garbage = "Invalid HTTP request received."
    assert [passed(garbage) for _ in range(5)] == [garbage, garbage, None, None, None]
    assert passed("Unsupported upgrade request.") == "Unsupported upgrade request."  # counted apart
    assert passed("boom", logging.ERROR) == passed("boom", logging.ERROR) == passed("boom", logging.ERROR) == "boom"
    now[0] = 59.0
    assert passed(garbage) is None
    now[0] = 61.5
    assert passed(garbage) == f"{garbage} (4 more like it in 62 s, not logged)"
    assert [passed(garbage) for _ in range(3)] == [garbage, None, None]
    seen: list[str] = []
    logger = logging.getLogger("test_repeated_warnings")
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    now[0] = 70.0
    repeated.flush(logger)  # what the server tells of them as it stops
    logger.removeHandler(handler)
    assert seen == [f"{garbage} (2 more like it in 8 s, not logged)"]


def test_repeated_warnings_count_a_bounded_number_of_kinds():
    """A warning formatted in place (f"... {client}") is a kind of its own: the table of kinds
    stays at WARNING_KINDS (quiet kinds forgotten once their window is over; past that, a new
    kind passes uncounted) instead of growing with every message."""
    from tformer.serve.connections import WARNING_KINDS

    now = [0.0]
    repeated = RepeatedWarnings(burst=1, window=60.0, clock=lambda: now[0])

    def passes(msg: str) -> bool:
        return repeated.filter(logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, msg, (), None))

    assert all(passes(f"client {i} misbehaved") for i in range(WARNING_KINDS + 50))
    assert len(repeated.seen) == WARNING_KINDS
    assert not passes("client 0 misbehaved")  # still counted: its window is not over
    now[0] = 61.0
    assert passes("a new kind") and len(repeated.seen) == 2  # the quiet ones forgotten, one kept with its count


def test_a_body_refused_by_its_length_gets_one_answer(quick_server):
    """413 for the declared length; the client sends on and stops: closed after --body-timeout
    without a second (408) answer to the same request."""
    with socket.create_connection(("127.0.0.1", quick_server.port)) as sock:
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 99999999999\r\n\r\n{")
        sock.settimeout(10)
        first = sock.recv(4096)
        sock.sendall(b"x" * 1000)  # more of the body, after the answer
        answer = first + _closed_after(sock)
    assert answer.startswith(b"HTTP/1.1 413 ") and answer.count(b"HTTP/1.1 ") == 1, answer


def test_tokenizing_runs_off_the_event_loop(embedding_dir, monkeypatch):
    """A request's tokenization blocks until /health has been answered: on the event loop that
    could never happen (the loop would be the one blocked)."""
    live = serve(embedding_dir)
    served = live.app.state.service.served
    tokenizing, answered, threads = threading.Event(), threading.Event(), []
    items = served.admit

    def slow_items(inputs, truncate, limit=None):
        threads.append(threading.current_thread().name)
        tokenizing.set()
        assert answered.wait(20), "/health was not answered while a request was being tokenized"
        return items(inputs, truncate, limit)

    monkeypatch.setattr(served, "admit", slow_items)
    try:
        result = []
        worker = threading.Thread(target=lambda: result.append(live.post("/embed", {"inputs": "a dog"})))
        worker.start()
        assert tokenizing.wait(20)
        assert live.request("GET", "/health")[0] == 200
        answered.set()
        worker.join(30)
    finally:
        live.close()
    assert result[0][0] == 200 and threads[0].startswith("tformer-tokenize")


def test_parsing_runs_off_the_event_loop(embedding_dir, monkeypatch):
    """A body's parsing blocks until /health has been answered: on the event loop (where it
    ran: a 14 MB body of empty lists held /health for 12 s) that could never happen."""
    from tformer.serve import schema

    live = serve(embedding_dir)
    parsing, answered, threads = threading.Event(), threading.Event(), []
    parse = schema.parse_json

    def slow_parse(raw):
        threads.append(threading.current_thread().name)
        parsing.set()
        answered.wait(10)
        return parse(raw)

    monkeypatch.setattr(schema, "parse_json", slow_parse)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(live.post("/embed", {"inputs": "a dog"})))
    try:
        worker.start()
        assert parsing.wait(20)
        health = live.request("GET", "/health", timeout=5)[0]
    finally:
        answered.set()
        worker.join(30)
        live.close()
    assert health == 200 and result[0][0] == 200 and threads[0].startswith("tformer-tokenize")


def test_a_large_body_being_tokenized_does_not_hold_up_small_ones(embedding_dir, monkeypatch):
    """While large bodies hold every tokenizer thread (a text of one 15 MB word takes about a
    minute), a small request is still tokenized and answered: it has threads of its own."""
    from tformer.serve.app import SMALL_BODY_BYTES

    live = serve(embedding_dir, tokenization_workers=1)
    served = live.app.state.service.served
    large_started, release = threading.Event(), threading.Event()
    items = served.admit

    def held_items(inputs, truncate, limit=None):
        if sum(map(len, inputs)) > SMALL_BODY_BYTES:
            large_started.set()
            assert release.wait(20), "the test did not release the large request"
        return items(inputs, truncate, limit)

    monkeypatch.setattr(served, "admit", held_items)
    large: list = []
    worker = threading.Thread(target=lambda: large.append(live.post("/embed", {"inputs": "x" * 2 * SMALL_BODY_BYTES})))
    try:
        worker.start()
        assert large_started.wait(20)
        small = live.request("POST", "/embed", {"inputs": "a dog"}, timeout=10)  # the large one still held
    finally:
        release.set()
        worker.join(30)
        live.close()
    assert small[0] == 200 and large[0][0] == 200


def _whole_then_cut(tokenizer, text: str) -> list[int]:
    """The independent cut: the backend's own truncation over the whole text."""
    backend = type(tokenizer.backend).from_str(tokenizer.backend.to_str())
    backend.enable_truncation(max_length=tokenizer.max_length)
    return backend.encode(text.lower() if tokenizer.lowercase else text).ids


@pytest.mark.parametrize("text", [
    " ".join(np.random.default_rng(0).choice(WORDS, 200_000)),  # about 1 MB of words
    "日本語" * 100_000,  # no whitespace (CJK: each character a word to BERT's pre-tokenizer)
    "a-" * 100_000,
    "word " + " " * 5000 + " ".join(["w"] * 20_000),  # a long run of spaces first
], ids=["words", "cjk", "punctuation", "spaces"])
def test_a_long_text_is_tokenized_only_as_far_as_the_limit_needs(embedding_server, monkeypatch, text):
    """The server counts and cuts at admission as `tformer embed` does (Tokenizer.encode,
    tformer.text.prefix), tokenizing a few kB of a 1 MB text: the same ids as the whole text
    cut, its count a lower bound, named as one when refused."""
    served = embedding_server.app.state.service.served
    tokenizer = served.tokenizer
    spy = SpyBackend(tokenizer.backend)
    monkeypatch.setattr(tokenizer, "backend", spy)
    long, short = served.admit([text, "a dog"], True)
    monkeypatch.undo()
    assert max(spy.seen) < 20_000 < len(text)
    assert long.payload.ids == _whole_then_cut(tokenizer, text) and len(long.payload.ids) == 16
    assert isinstance(long.full, AtLeast) and long.full > 16 and long.truncated
    assert short.full == len(short.payload.ids) and not short.truncated
    status, headers, _ = embedding_server.post("/embed", {"inputs": text})
    assert status == 200 and headers["x-truncated-inputs"] == "0"
    status, _, refused = embedding_server.post("/embed", {"inputs": text, "truncate": False})
    assert status == 413 and refused["error"]["message"].startswith(
        f"input[0]: expected at most 16 tokens, got {int(long.full)} or more")


def test_one_client_with_many_slow_connections_does_not_lock_others_out(embedding_dir):
    """512 connections from one address (127.0.0.2), each sending its headers a byte at a time,
    with the default limits: a real client (the openai package) on another address is still
    answered. Before the per-client bound the 512 took every place (--max-connections) and it
    got 503 until they timed out."""
    openai = pytest.importorskip("openai")
    live = serve(embedding_dir)  # the default limits: 512 connections, 128 per client
    head = b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    slow: list[socket.socket] = []
    try:
        for _ in range(512):
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))
            sock.connect(("127.0.0.1", live.port))
            slow.append(sock)
        for i in range(8):  # the headers, a byte at a time on every connection
            for sock in slow:
                try:
                    sock.send(head[i:i + 1])
                except OSError:  # refused and closed: past its share
                    pass
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=30)
        answer = client.embeddings.create(input="a dog", model="any")
        assert len(answer.data) == 1
        refused, pending = 0, selectors.DefaultSelector()
        for sock in slow:
            pending.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + 10
        while refused < 512 - 128 and time.monotonic() < deadline:  # bounded: the 503s are already sent
            for key, _ in pending.select(0.5):
                refused += key.fileobj.recv(64).startswith(b"HTTP/1.1 503 ")
                pending.unregister(key.fileobj)
        pending.close()
        assert refused == 512 - 128
    finally:
        for sock in slow:
            sock.close()
        live.close()


def test_a_client_that_never_reads_its_answer_is_dropped(embedding_dir):
    """An answer the client leaves unread (/tokenize's ~70 bytes a token: megabytes) filled the
    server's write buffer and stayed there, the connection open, for ever; now it is dropped
    once the client has taken nothing for --body-timeout seconds."""
    live = serve(embedding_dir, body_timeout=0.5)
    body = json.dumps({"inputs": ["a " * 500] * 256}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel keeps little of it
    try:
        sock.connect(("127.0.0.1", live.port))
        sock.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        connections = live.server.server_state.connections
        deadline = time.monotonic() + 30
        while connections:  # bounded: the server drops it, or the test fails at the deadline
            assert time.monotonic() < deadline, "the unread answer's connection stayed open"
            time.sleep(0.1)
        assert live.request("GET", "/health")[0] == 200
    finally:
        sock.close()
        live.close()
