"""Bad input is a 4xx JSON error naming the field; a full queue is 503 + Retry-After; a client
that leaves frees its place; and the command's own mistakes are one line."""

from __future__ import annotations

import socket
import sys
import threading
import time

import pytest
from hf_bert_fixtures import WORDS
from serve_fixtures import request, serve

from tformer.commands.cli import main

LONG = " ".join(WORDS[:30])  # over the 16 tokens of the test directory


@pytest.mark.parametrize("path, body, status, field, message", [
    ("/embed", b"{bad", 400, "body", "body: expected a JSON object, got malformed JSON"),
    ("/embed", b"[1, 2]", 422, "body", "body: expected a JSON object, got a list"),
    ("/embed", {}, 422, "inputs", "inputs: required"),
    ("/embed", {"inputs": 3}, 422, "inputs", "inputs: expected a string, a list of strings, token ids or a list of token-id lists, got an integer"),
    ("/embed", {"inputs": ["a", None]}, 422, "inputs[1]", "inputs[1]: expected a string, got null"),
    ("/embed", {"inputs": []}, 422, "inputs", "inputs: expected at least one input, got an empty list"),
    ("/embed", {"inputs": ["  "]}, 422, "inputs[0]", "inputs[0]: expected a non-empty text"),
    ("/embed", {"inputs": "a", "normalise": True}, 422, "normalise", "normalise: unknown field"),
    ("/embed", {"inputs": "a", "normalize": "yes"}, 422, "normalize", "normalize: expected true or false"),
    ("/embed", {"inputs": ["a"] * 5}, 413, "inputs", "inputs: expected at most 4 inputs per request"),
    ("/embed", {"inputs": LONG, "truncate": False}, 413, "inputs", "input[0]: expected at most 16 tokens, got"),
    ("/embed", {"inputs": ["a", "a" * 40_000 + " hello world"], "truncate": False}, 413, "inputs",
     "input[1]: read only to its first 16,384 characters of 40,012 (tokenizing stops there when no cut to 16 "
     "tokens is in sight), so the rest would be lost (send truncate: true, or shorten it)"),  # (3 tokens: under 16)
    ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, 422, "encoding_format",
     "encoding_format: expected one of float, base64"),
    ("/v1/embeddings", {"input": [["a"]]}, 422, "input[0][0]", "input[0][0]: expected a token id, got a string"),
    ("/v1/embeddings", {"input": "a", "dimensions": 8}, 422, "dimensions", "dimensions: expected 32..32"),
    ("/v1/embeddings", {"input": [[1, 2, 999]]}, 422, "input[0][2]", "input[0][2]: expected a token id in 0..99"),
    ("/embed", {"inputs": "a", "truncation_direction": "left"}, 422, "truncation_direction",
     'truncation_direction: expected one of right, Right, got "left"'),  # as JSON spells it, not 'left'
    ("/embed", {"inputs": "a", "truncation_direction": True}, 422, "truncation_direction",
     "truncation_direction: expected one of right, Right, got true"),  # not Python's True
    ("/predict", {"inputs": "a"}, 404, None, "/predict: this server holds the embedding model"),
    ("/embed", {"inputs": "a", "x": {"y": {"z": {"w": {"v": {"u": {"t": {"s": {"r": 1}}}}}}}}}, 400, "body",
     "body: expected JSON nested at most 8 deep"),
    ("/embed", b'{"inputs": "a", "normalize": NaN}', 400, "body", "body: expected JSON numbers, got NaN"),
    ("/embed", b'{"inputs": "a", "normalize": 1e999}', 400, "body", "body: expected finite numbers"),
    ("/embed", b'{"inputs": ["a", "b\\ud800c"]}', 422, "inputs[1]", "inputs[1]: expected valid Unicode text"),
    ("/embed", b'{"inputs": "a", "\\udfff": 1}', 422, "body.<key>", "body.<key>: expected valid Unicode text"),
    ("/embed", b'\xff\xfe{}', 400, "body", "body: expected a JSON object, got malformed JSON"),
    ("/embed", b'{"inputs": "a", "normalize": -1234567890123456789012345678901234}', 400, "body",
     "body: expected numbers of at most 32 characters, got an integer of 35"),
    ("/embed", b'{"inputs": ["a", {"t": ["\\ud800"]}]}', 422, "inputs[1].t[0]", "inputs[1].t[0]: expected valid"),
    ("/", b'{"inputs": {"source_sentence": "a", "\\udfff": 1}}', 422, "inputs.<key>", "inputs.<key>: expected"),
])
def test_bad_input_is_a_json_error_naming_the_field(small_server, path, body, status, field, message):
    raw = body if isinstance(body, bytes) else None
    got, headers, answer = request(small_server.port, "POST", path, None if raw else body, raw)
    assert got == status and headers["content-type"] == "application/json"
    assert answer["error"]["param"] == field
    assert answer["error"]["message"].startswith(message), answer


@pytest.fixture(scope="module")
def small_server(embedding_dir):
    live = serve(embedding_dir, max_client_batch=4)
    yield live
    live.close()


def test_a_full_queue_answers_503_with_retry_after(embedding_dir):
    live = serve(embedding_dir, max_queue=2, max_client_batch=2, max_wait_ms=1500)  # the first two wait 1.5 s for company
    try:
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(live.post("/embed", {"inputs": "a dog"})))
                   for _ in range(2)]
        for t in threads:
            t.start()
        _wait_for_depth(live, 2)
        status, headers, body = live.post("/embed", {"inputs": "the cat"})
        for t in threads:
            t.join()
    finally:
        live.close()
    assert status == 503 and int(headers["retry-after"]) >= 1 and body["error"]["type"] == "overloaded"
    assert [a[0] for a in answers] == [200, 200]


def test_a_client_that_disconnects_frees_its_place(embedding_dir):
    live = serve(embedding_dir, max_queue=1, max_client_batch=1, max_wait_ms=1500)
    try:
        with socket.create_connection(("127.0.0.1", live.port)) as sock:
            body = b'{"inputs": "a dog"}'
            sock.sendall(b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            _wait_for_depth(live, 1)
        _wait_for_depth(live, 0, timeout=1.0)  # before the batch window ends: cancelled, not answered
        status, _, _ = live.post("/embed", {"inputs": "the cat"})
        metrics = live.request("GET", "/metrics")[2]
    finally:
        live.close()
    assert status == 200 and "tformer_serve_client_disconnects_total 1" in metrics


def _wait_for_depth(live, depth: int, timeout: float = 10) -> None:
    service = live.app.state.service
    deadline = time.monotonic() + timeout
    while service.batcher.depth != depth:
        assert time.monotonic() < deadline, f"queue depth {service.batcher.depth}, expected {depth}"
        time.sleep(0.01)


@pytest.mark.parametrize("argv, message", [
    (["serve", "{dir}", "--max-input-tokens", "9000", "--max-batch-tokens", "100"],
     "--max-input-tokens: expected at most --max-batch-tokens (100), got 9000"),
    (["serve", "{dir}", "--workers", "0"], "--workers: expected a positive number, got 0"),
    (["serve", "{dir}", "--max-client-batch", "2000"],
     "--max-client-batch: expected at most --max-queue (1024): a request that large could never be queued, got 2000"),
    (["serve", "{dir}", "--header-timeout", "0"], "--header-timeout: expected a positive number, got 0"),
    (["serve", "{dir}", "--max-connections-per-client", "600"],
     "--max-connections-per-client: expected at most --max-connections (512), got 600"),
    (["serve", "{dir}", "--allowed-hosts", "http://x.org"], "--allowed-hosts: expected host names"),
    (["serve", "{dir}", "--cors-origin", "https://a.org/page"], "--cors-origin: expected an origin"),
    (["serve", "{dir}/nope"], "MODEL_DIR_OR_RUN: no such directory"),
    (["serve", "{dir}", "--max-input-tokens", "100"],
     "--max-input-tokens: expected at most 16 (the model's maximum length), got 100"),
])
def test_command_mistakes_are_one_line(embedding_dir, capsys, argv, message):
    argv = [a.replace("{dir}", str(embedding_dir)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tformer serve: error: {message}") and err.count("\n") == 1


def test_without_the_extra_the_error_names_it(embedding_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    assert main(["serve", str(embedding_dir)]) == 2
    assert "pip install 'tformer[serve]'" in capsys.readouterr().err


CRASH_BODIES = {  # what reached a 500 before issue 31
    "deep": b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "huge integer": b'{"inputs": "a", "truncate": ' + b"7" * 5000 + b"}",
    "lone surrogate": b'{"inputs": "\\ud800", "input": "\\ud800", "prompt": "\\ud800"}',
}


@pytest.mark.parametrize("name", CRASH_BODIES)
def test_no_body_reaches_a_5xx_on_any_endpoint(embedding_server, classification_server, seq2seq_server, name):
    from tformer.serve.routes import POST_PATHS

    for live in (embedding_server, classification_server, seq2seq_server):
        for path in POST_PATHS:
            status, headers, answer = request(live.port, "POST", path, raw=CRASH_BODIES[name])
            assert 400 <= status < 500 and headers["content-type"] == "application/json", (path, status)
            if status != 404:
                assert answer["error"]["param"] in ("body", "inputs", "input", "prompt"), (path, answer)


def test_long_digit_runs_in_texts_and_token_ids_past_the_limit_are_fine(small_server):
    """Integers are checked one by one only where the body has a run of 33+ digits, which a
    text may hold; token ids past the limit are cut, up to the commas a body may hold
    (test_hostile.py: 4 inputs x 16 tokens + 64 here)."""
    digits = "call 12345678901234567890123456789012345678901234567890 now"
    assert request(small_server.port, "POST", "/embed", {"inputs": digits})[0] == 200
    ids = request(small_server.port, "POST", "/embed", {"inputs": [[1] * 30] * 4})  # 119 commas
    assert ids[0] == 200 and ids[1]["x-truncated-inputs"] == "0,1,2,3"
    status, _, answer = request(small_server.port, "POST", "/embed", {"inputs": "a", "x": [[]] * 100})
    assert status == 422 and answer["error"]["param"] == "x"


def test_a_path_or_method_the_server_lacks_is_a_json_error(small_server):
    for method, path, status in (("GET", "/nope", 404), ("GET", "/embed", 405), ("POST", "/health", 405)):
        got, headers, answer = request(small_server.port, method, path)
        assert got == status and headers["content-type"] == "application/json", (method, path)
        assert answer["error"]["message"].startswith(f"{method} {path}: "), answer
    _, headers, answer = request(small_server.port, "GET", "/embed")
    assert headers["allow"] == "POST" and "(allowed: POST)" in answer["error"]["message"]
    _, _, answer = request(small_server.port, "POST", "/embedd", {"inputs": "a"})
    assert answer["error"]["message"] == ("POST /embedd: no such endpoint; this server's are POST /, /embed, "
                                          "/tokenize, /v1/embeddings; GET /health, /info, /metrics, /v1/models, "
                                          "/v1/models/{id}")


def test_a_path_with_a_trailing_slash_is_the_same_endpoint(small_server):
    """POST /embed/ was a 307 to /embed with an empty body: a client that does not follow it
    (curl without -L) got nothing, one that does sent its body twice. Now each path answers
    with its slash too, and no path is ever redirected (a Location built from the Host header)."""
    name = small_server.app.state.service.config.model_name
    for method, path, body in (("POST", "/embed", {"inputs": "a dog"}), ("POST", "/v1/embeddings", {"input": "a"}),
                               ("POST", "/tokenize", {"inputs": "a dog"}), ("GET", "/health", None),
                               ("GET", "/v1/models", None), ("GET", f"/v1/models/{name}", None)):
        bare = request(small_server.port, method, path, body)
        slashed = request(small_server.port, method, path + "/", body)
        assert bare[0] == slashed[0] == 200 and slashed[2] == bare[2], (method, path, slashed)
    for method, path, status in (("POST", "/embed//", 404), ("GET", "/health//", 404), ("GET", "/embed/", 405),
                                 ("POST", "/predict/", 404), ("GET", "/v1/models/other/", 404)):
        got, headers, answer = request(small_server.port, method, path, {"inputs": "a"})
        assert got == status and "location" not in headers and answer["error"]["code"] == status, (path, answer)


def test_tokenize_lists_a_bounded_number_of_tokens(small_server, monkeypatch):
    from tformer.kinds import serving as models

    monkeypatch.setattr(models, "TOKENIZE_MAX_TOKENS", 50)
    status, _, answer = small_server.post("/tokenize", {"inputs": ["a dog"] * 4})
    assert status == 200 and len(answer) == 4
    status, _, answer = small_server.post("/tokenize", {"inputs": "a " * 60})
    assert status == 413 and answer["error"]["param"] == "inputs"
    assert answer["error"]["message"].startswith("inputs: expected at most 50 tokens to list in all, got 62")


def test_a_length_penalty_no_length_can_take_is_refused(seq2seq_server):
    for penalty in (500, 1e308):
        status, _, answer = seq2seq_server.post(
            "/generate", {"inputs": "a b c", "parameters": {"beam_size": 2, "length_penalty": penalty}})
        assert status == 422 and answer["error"]["param"] == "parameters.length_penalty", answer
    status, _, _ = seq2seq_server.post("/generate", {"inputs": "a b c", "parameters": {"beam_size": 2,
                                                                                       "length_penalty": 2.0}})
    assert status == 200


def test_early_stopping_is_a_beam_search_rule_refused_with_greedy(seq2seq_server):
    for parameters, param in (({"early_stopping": True}, "parameters.early_stopping"),
                              ({"beam_size": 2, "early_stopping": "yes"}, "parameters.early_stopping")):
        status, _, answer = seq2seq_server.post("/generate", {"inputs": "a b c", "parameters": parameters})
        assert status == 422 and answer["error"]["param"] == param, answer
    status, _, _ = seq2seq_server.post("/generate", {"inputs": "a b c", "parameters": {"beam_size": 2,
                                                                                       "early_stopping": True}})
    assert status == 200


def test_only_json_is_answered(small_server):
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        status, _, answer = request(small_server.port, "POST", "/embed", raw=b'{"inputs": "a"}',
                                    headers={"Content-Type": kind})
        assert status == 415 and answer["error"]["param"] == "Content-Type", kind
    status, _, _ = request(small_server.port, "POST", "/embed", {"inputs": "a"},
                           headers={"Content-Type": "application/json; charset=utf-8"})
    assert status == 200


def test_a_foreign_host_header_is_refused(small_server, embedding_dir):
    for host in ("evil.example.com", "127.0.0.1.evil.com:80", ""):
        status, _, answer = request(small_server.port, "GET", "/info", headers={"Host": host})
        assert status == 400 and answer["error"]["param"] == "Host", host
    for host in ("localhost", "127.0.0.1:8000", "LOCALHOST:1"):
        assert request(small_server.port, "GET", "/health", headers={"Host": host})[0] == 200
    live = serve(embedding_dir, allowed_hosts=("*.example.com", "10.0.0.5"))
    try:
        assert request(live.port, "GET", "/health", headers={"Host": "api.example.com:443"})[0] == 200
        assert request(live.port, "GET", "/health", headers={"Host": "10.0.0.5"})[0] == 200
        assert request(live.port, "GET", "/health", headers={"Host": "example.org"})[0] == 400
    finally:
        live.close()


def test_cors_only_with_an_origin_given(small_server, embedding_dir):
    preflight = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}
    status, headers, _ = request(small_server.port, "OPTIONS", "/embed", headers=preflight)
    assert status >= 400 and "access-control-allow-origin" not in headers
    live = serve(embedding_dir, cors_origins=("https://app.example.com",))
    try:
        status, headers, _ = request(live.port, "OPTIONS", "/embed", headers=preflight)
        assert status == 200 and headers["access-control-allow-origin"] == "https://app.example.com"
        _, headers, _ = request(live.port, "POST", "/embed", {"inputs": "a"},
                                headers={"Origin": "https://other.example.com"})
        assert "access-control-allow-origin" not in headers
    finally:
        live.close()
