"""A hostile client's requests, over raw sockets: each gets its one-line JSON answer, in order,
and the server keeps serving."""

from __future__ import annotations

import gzip
import json
import logging
import re
import socket
import time

from serve_fixtures import request, serve

from tformer.serve.connections import MAX_PIPELINED


def _post(body: bytes, content_type: bytes = b"application/json", extra: bytes = b"") -> bytes:
    return (b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n%s"
            % (content_type, len(body), extra, body))


def _until_closed(sock: socket.socket, limit: float = 30.0) -> bytes:
    sock.settimeout(limit)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _responses(data: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each response in a stream of them (each with a Content-Length)."""
    found = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
        found.append((int(head.split(b" ")[1]), rest[:length]))
        data = rest[length:]
    return found


def _one_response(sock: socket.socket, limit: float = 30.0) -> tuple[int, bytes]:
    """The first response on a connection the client has not finished sending on."""
    sock.settimeout(limit)
    data = b""
    while not (m := re.search(rb"(?is)^HTTP/1.1 (\d+) .*?content-length: *(\d+).*?\r\n\r\n", data)) \
            or len(data) < m.end() + int(m.group(2)):
        chunk = sock.recv(65536)
        assert chunk, data[:300]
        data += chunk
    return int(m.group(1)), data[m.end():m.end() + int(m.group(2))]


def test_pipelined_requests_get_their_answers_in_order(embedding_server):
    """Good, malformed, wrong-type, large and wrongly-typed requests in one write (and again a
    byte at a time): one answer each, in order, the errors one-line JSON."""
    sent = [_post(b'{"inputs": "a"}'), _post(b"{bad"), _post(b'{"inputs": "b"}', b"text/plain"),
            _post(json.dumps({"inputs": ["x y z " * 200] * 64}).encode()), _post(b'{"inputs": 5}'),
            _post(b'{"inputs": "last"}', extra=b"Connection: close\r\n")]
    for pieces in ([b"".join(sent)], [bytes([b]) for b in b"".join(sent[:2] + sent[-1:])]):
        with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
            for piece in pieces:
                sock.sendall(piece)
            answer = _until_closed(sock)
        answers = _responses(answer)
        expected = [200, 400, 415, 200, 422, 200] if len(pieces) == 1 else [200, 400, 200]
        assert [status for status, _ in answers] == expected, answer[:300]
        for status, body in answers:  # every error one line of JSON that names its code
            assert status == 200 or (b"\n" not in body and json.loads(body)["error"]["code"] == status)
    assert embedding_server.request("GET", "/health")[0] == 200


def test_a_compressed_body_is_refused_naming_content_encoding(embedding_server):
    """A gzip body was parsed as JSON and refused as malformed ("can't decode byte 0x8b")."""
    body = gzip.compress(b'{"inputs": "a"}')
    status, _, answer = request(embedding_server.port, "POST", "/embed", raw=body,
                                headers={"Content-Encoding": "gzip"})
    assert status == 415 and answer["error"]["param"] == "Content-Encoding", answer
    assert answer["error"]["message"] == "Content-Encoding: expected identity (an uncompressed body), got 'gzip'"
    status, _, _ = request(embedding_server.port, "POST", "/embed", {"inputs": "a"},
                           headers={"Content-Encoding": "identity"})
    assert status == 200


def test_two_host_headers_are_a_400(embedding_server):
    """RFC 9112 §3.2: the allow-list read the first Host header, a proxy in front may read the last."""
    for hosts in ([b"127.0.0.1", b"evil.example"], [b"127.0.0.1", b"127.0.0.1"]):
        head = b"GET /health HTTP/1.1\r\n" + b"".join(b"Host: %s\r\n" % h for h in hosts)
        with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
            sock.sendall(head + b"Connection: close\r\n\r\n")
            [(status, body)] = _responses(_until_closed(sock))
        assert status == 400 and json.loads(body)["error"]["message"] == "Host: expected one Host header, got 2"
    assert embedding_server.request("GET", "/health")[0] == 200


def test_a_target_that_names_a_host_is_checked_by_it(embedding_server):
    """`GET http://evil.example/v1/models` with `Host: 127.0.0.1` was answered: uvicorn kept the
    target's path, dropped its host, and the allow-list read the Host header. The target's host
    takes the header's place (RFC 9112 §3.2.2)."""

    def get(target: bytes, host: bytes) -> tuple[int, dict]:
        with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
            sock.sendall(b"GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (target, host))
            [(status, body)] = _responses(_until_closed(sock))
        return status, json.loads(body)

    status, answer = get(b"http://evil.example/v1/models", b"127.0.0.1")
    assert status == 400 and answer["error"]["param"] == "request target" and answer["error"]["message"] == (
        "request target: expected one of 127.0.0.1, localhost, ::1 (widen with --allowed-hosts), got 'evil.example'")
    for target, host, expected in ((b"HTTP://User@Evil.Example:8000/health", b"127.0.0.1", 400),
                                   (b"http://127.0.0.1:8000/health", b"127.0.0.1", 200),
                                   (b"http://[::1]/health", b"evil.example", 200),  # the header ignored
                                   (b"evil.example:443", b"127.0.0.1", 400)):  # authority-form: malformed here
        assert get(target, host)[0] == expected, target


def test_a_complete_request_is_answered_after_the_client_half_closes(embedding_server, monkeypatch):
    """A client that sends its requests and then shuts its side (FIN, shutdown(SHUT_WR): what
    `nc -N` does) got nothing: the FIN was taken for a disconnect. Each request received whole
    is answered, then the connection closed; a request cut short by the FIN gets no answer (it
    can never be complete). (A FIN once a request waits on the model still cancels it:
    test_errors.py::test_a_client_that_disconnects_frees_its_place.)"""
    served = embedding_server.app.state.service.served
    items = served.admit

    def slow_items(inputs, truncate, limit=None):  # the FIN surely arrives before the request is queued
        time.sleep(0.2)
        return items(inputs, truncate, limit)

    monkeypatch.setattr(served, "admit", slow_items)
    health = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for sent, expected in ([_post(b'{"inputs": "a"}'), [200]], [health, [200]],
                           [_post(b'{"inputs": "a"}') + health + _post(b"{bad"), [200, 200, 400]],
                           [health + _post(b'{"inputs": "a"}')[:-3], [200]]):
        with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
            sock.sendall(sent)
            sock.shutdown(socket.SHUT_WR)
            answer = _until_closed(sock)
        assert [status for status, _ in _responses(answer)] == expected, (sent[:60], answer[:300])
    assert embedding_server.request("GET", "/health")[0] == 200


def test_past_the_pipelined_bound_the_connection_is_answered_and_closed(embedding_server):
    """uvicorn parsed every request it read and queued them all: 4 MB of pipelined GET /health
    from clients that read nothing queued 48,000 requests (+150 MB). Past MAX_PIPELINED waiting
    requests, those are answered, the rest dropped, and the connection closed; the client
    retries the rest elsewhere (RFC 9112 §9.3.2)."""
    health = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
        sock.sendall(health * 1000)
        answers = _responses(_until_closed(sock))
    assert MAX_PIPELINED < len(answers) < 1000 and {status for status, _ in answers} == {200}, len(answers)
    assert embedding_server.request("GET", "/health")[0] == 200


def test_a_pipelining_client_that_stops_reading_is_dropped_without_an_error(embedding_dir):
    """When a client that pipelined requests and read nothing was dropped, the request being
    answered wrote on the closed connection: uvicorn tells only the newest request that its client
    left, and uvloop raised RuntimeError, logged as an exception in the application."""
    live = serve(embedding_dir, body_timeout=0.5)
    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel keeps little of it
    try:
        sock.connect(("127.0.0.1", live.port))
        sock.sendall(_post(json.dumps({"inputs": ["a " * 500] * 256}).encode()).replace(b"/embed", b"/tokenize") * 3)
        state = live.server.server_state
        deadline = time.monotonic() + 30
        while state.connections or state.tasks:  # dropped, and its requests done (or the deadline)
            assert time.monotonic() < deadline, "the unread answers' connection stayed open"
            time.sleep(0.1)
        assert live.request("GET", "/health")[0] == 200
    finally:
        sock.close()
        logger.removeHandler(handler)
        live.close()
    assert not errors, [e.getMessage() for e in errors]


def test_a_protocol_upgrade_on_a_request_with_a_body_is_a_400_naming_it(embedding_server):
    """`Connection: Upgrade` + `Upgrade: h2c` on a POST: the parser handed the body to the
    protocol it would switch to, and the request was refused as malformed JSON at char 0. The
    upgrade is ignored (RFC 9110 §7.8) where there is no body: /health answers."""
    body = b'{"inputs": "a"}'
    for upgrade in (b"h2c", b"websocket"):
        extra = b"Connection: Upgrade, close\r\nUpgrade: %s\r\n" % upgrade
        with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
            sock.sendall(_post(body, extra=extra))
            [(status, answer)] = _responses(_until_closed(sock))
        answer = json.loads(answer)["error"]
        assert status == 400 and answer["param"] == "Upgrade", answer
        assert answer["message"] == (f"Upgrade: expected none on a request with a body (the server answers "
                                     f"in HTTP/1.1), got {upgrade.decode()!r}")
        with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + b"\r\n")
            assert [status for status, _ in _responses(_until_closed(sock))] == [200]
    with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:  # no Connection token
        sock.sendall(_post(body, extra=b"Upgrade: h2c\r\nConnection: close\r\n"))
        assert [status for status, _ in _responses(_until_closed(sock))] == [200]


def test_a_transfer_coding_other_than_chunked_is_a_501_naming_it(embedding_server):
    """`Transfer-Encoding: gzip, chunked`: the chunks were joined, the gzip left, and the body
    refused as malformed JSON, which sent the client looking at its JSON (RFC 9112 §6.1: 501)."""
    head = (b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n")
    with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
        sock.sendall(head + b"f\r\n" + b'{"inputs": "a"}' + b"\r\n0\r\n\r\n")
        [(status, body)] = _responses(_until_closed(sock))
    answer = json.loads(body)["error"]
    assert status == 501 and answer["param"] == "Transfer-Encoding", answer
    assert answer["message"] == "Transfer-Encoding: expected chunked or none, got 'gzip, chunked'"
    chunked = head.replace(b"gzip, chunked", b"Chunked")  # the one coding there is, in any case
    with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
        sock.sendall(chunked + b"f\r\n" + b'{"inputs": "a"}' + b"\r\n0\r\n\r\n")
        assert [status for status, _ in _responses(_until_closed(sock))] == [200]


def test_an_http_1_0_request_without_host_is_answered(embedding_server):
    """HTTP/1.0 has no Host header: a load balancer's check (HAProxy's httpchk sends
    `OPTIONS / HTTP/1.0` or `GET /health HTTP/1.0`, no Host) got 400 from the Host allow-list.
    Browsers (what the allow-list is for) always send one; HTTP/1.1 without one is still a 400."""
    for request_line, expected in ((b"GET /health HTTP/1.0", 200), (b"GET /health HTTP/1.1", 400)):
        with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
            sock.sendall(request_line + b"\r\nConnection: close\r\n\r\n")
            [(status, _)] = _responses(_until_closed(sock))
        assert status == expected, request_line


def test_a_body_of_more_values_than_a_request_can_use_is_refused_as_it_arrives(embedding_dir, monkeypatch):
    """16 MB of [1,1,...] (8M token ids) was parsed in one C call that held the GIL, and with it
    /health and every other client, for 375 ms. A body's commas outside strings are counted as
    it arrives:
    past what a request can use (--max-client-batch x --max-input-tokens, and a few fields) it
    is refused with 413 before it is parsed, before the rest of it is even sent, while other
    clients are answered."""
    from tformer.serve import schema

    live = serve(embedding_dir, max_client_batch=4, body_timeout=5)
    max_commas = 4 * 16 + 64  # inputs x tokens (the directory's limit), and the other fields
    parsed: list[int] = []
    parse = schema.parse_json

    def spy(raw: bytes) -> dict:
        parsed.append(len(raw))
        return parse(raw)

    monkeypatch.setattr(schema, "parse_json", spy)
    dense = b'{"inputs": [' + b"1," * 4_000_000 + b"1]}"
    try:
        with socket.create_connection(("127.0.0.1", live.port)) as sock:
            sock.sendall(_post(dense)[: 1 << 20])  # 1 MB of the 8 MB: the answer comes first
            status, body = _one_response(sock)
            assert live.request("GET", "/health")[0] == 200
            assert live.post("/embed", {"inputs": "a dog"})[0] == 200
        assert status == 413 and b"\n" not in body, body
        assert json.loads(body)["error"] == {
            "message": f"body: expected at most {max_commas} commas (JSON values: --max-client-batch x "
                       "--max-input-tokens token ids, and a few fields), got more",
            "type": "invalid_request_error", "param": "body", "code": 413}
        assert max(parsed) < 100, parsed  # the small request's body only
        for inputs, expected in (([[1] * 30] * 4, 200), ([[1] * 200], 413), (["a"] * 200, 413),
                                 ("a, " * 200, 200), (['\\", ' * 200], 200)):  # commas in a text
            assert live.post("/embed", {"inputs": inputs})[0] == expected, inputs
    finally:
        live.close()
