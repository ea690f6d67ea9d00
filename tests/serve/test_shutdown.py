"""A real `tformer serve` process: SIGTERM (or Ctrl-C) with requests in flight answers them all,
then the process exits 0; a stalled client is dropped at once; requests still waiting when the grace
period ends get 503; no traceback in any case; --workers 2 serves behind one port."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from serve_fixtures import request

from tformer.serve.connections import TIMEOUT


def _start(directory, *flags: str) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "tformer", "serve", str(directory), "--port", "0",
                             "--threads", "1", *flags],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    line = proc.stderr.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if not match:
        proc.kill()
        pytest.fail(f"no address in the first line: {line!r}{proc.stderr.read()}")
    port = int(match.group(1))
    deadline = time.monotonic() + 30
    while True:  # the socket is bound before startup: wait until it answers
        try:
            if request(port, "GET", "/health", timeout=2)[0] == 200:
                return proc, port
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.1)


def _terminate_with_queued(proc: subprocess.Popen, port: int, texts: list[str], within: float,
                           sig: int = signal.SIGTERM, twice: bool = False, copies: int = 1) -> list:
    """Send one /embed request per text (``copies`` of it) from its own thread, wait (at most
    `within` s) until all are queued, signal the server (SIGTERM; `twice`: again once it stopped
    listening), then collect the answers: (status, headers, body) each."""
    answers: list = []
    threads = [threading.Thread(target=lambda t=t: answers.append(
        request(port, "POST", "/embed", {"inputs": t if copies == 1 else [t] * copies}))) for t in texts]
    for t in threads:
        t.start()
    deadline = time.monotonic() + within
    while f"tformer_serve_queue_depth {len(texts) * copies}" not in request(port, "GET", "/metrics")[2]:
        assert time.monotonic() < deadline, f"the {len(texts)} requests were not queued in time"
        time.sleep(0.02)
    assert not answers  # all queued, none answered yet
    proc.send_signal(sig)
    while twice:  # the first signal was seen once the port refuses connections
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        except OSError:
            proc.send_signal(sig)
            break
        assert time.monotonic() < deadline + 10, "the server kept listening after the first signal"
        time.sleep(0.02)
    for t in threads:
        t.join(timeout=20)
    return answers


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])  # Ctrl-C ended with 130
def test_sigterm_drains_requests_in_flight_then_exits_0(embedding_dir, sig):
    proc, port = _start(embedding_dir, "--max-wait-ms", "3000")  # the requests wait for company
    try:
        answers = _terminate_with_queued(proc, port, ["a dog", "the cat sat on the mat", "one two three", "stars"],
                                         2.5, sig)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sorted(a[0] for a in answers) == [200] * 4, answers
    assert code == 0, proc.stderr.read()
    with pytest.raises(OSError):  # nobody listens any more
        request(port, "GET", "/health", timeout=2)


def test_two_workers_behind_one_port(embedding_dir):
    proc, port = _start(embedding_dir, "--workers", "2", "--threads", "2")
    try:
        status, _, info = request(port, "GET", "/info")
        answers = [request(port, "POST", "/embed", {"inputs": "a dog"}) for _ in range(4)]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert status == 200 and info["workers"] == 2 and info["threads"] == 1
    assert [a[0] for a in answers] == [200] * 4 and answers[0][2] == answers[3][2]
    assert code == 0


def test_sigterm_drops_a_stalled_client_and_exits_cleanly(embedding_dir):
    proc, port = _start(embedding_dir)
    try:
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")  # and nothing more
        assert request(port, "GET", "/health")[0] == 200
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)  # well before --header-timeout's 10 s and the grace period
        stalled.settimeout(5)
        got = stalled.recv(len(TIMEOUT))
        assert got == b"" or TIMEOUT.startswith(got)  # closed
        stalled.close()
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert code == 0 and "Traceback" not in err and "CancelledError" not in err, err


def test_requests_still_waiting_after_the_grace_period_get_503(embedding_dir):
    # (A drain starts batches at once: a grace period of 0 ends before any is answered.)
    proc, port = _start(embedding_dir, "--max-wait-ms", "60000", "--grace-period", "0")
    try:
        answers = _terminate_with_queued(proc, port, ["a dog", "the cat"], within=10)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert sorted(a[0] for a in answers) == [503, 503] and answers[0][2]["error"]["type"] == "overloaded"
    assert code == 0 and "Traceback" not in err and "CancelledError" not in err, err


def test_a_second_ctrl_c_stops_at_once_and_open_requests_get_503(embedding_dir):
    """uvicorn's force exit cancels the requests still open: they got its plain-text 500."""
    # Two requests of 256 texts, one text a batch: the drain that the first Ctrl-C starts is still
    # answering them when the second comes.
    proc, port = _start(embedding_dir, "--max-wait-ms", "60000", "--max-batch-tokens", "16")
    try:
        answers = _terminate_with_queued(proc, port, ["a dog " * 20, "the cat " * 20], 10, signal.SIGINT,
                                         twice=True, copies=256)  # (cut at the model's 16 tokens)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert sorted(a[0] for a in answers) == [503, 503], answers
    assert answers[0][2]["error"]["message"].startswith("server: stopped at once"), answers
    assert code == 130 and "interrupted (stopped at once" in err, err


def test_sigterm_under_load_answers_the_requests_nearest_to_done_first(embedding_dir):
    """A loaded server (16 requests of 8 texts queued, the model 50 ms a batch of 4 texts: 1.6 s of
    work) told to stop with a 1 s grace period. Served in fair order, every request advanced
    together and nearly all got 503 when the grace period ended, the ones almost done too;
    draining, the batches finish the requests with the least work left first, so about half of
    them are answered whole and only the rest get 503. Over real HTTP, uvicorn's own shutdown
    (what SIGTERM starts) beginning the drain."""
    from serve_fixtures import Live

    from tformer.kinds import load_served
    from tformer.serve.app import create_app
    from tformer.serve.config import ServeConfig

    config = ServeConfig(model=str(embedding_dir), threads=1, grace_period=1.0, max_batch_tokens=64,
                         max_wait_ms=0).decide()
    served = load_served(embedding_dir, config.device, config.dtype)
    run, armed, go = served.run_batch, threading.Event(), threading.Event()

    def loaded(payloads, key):  # (past the warm-up) the first batch waits until every request is queued
        if armed.is_set():
            assert go.wait(30)
            time.sleep(0.05)
        return run(payloads, key)

    served.run_batch = loaded  # (the server's batcher takes it when the app is made)
    live = Live(create_app(config, served), config)
    armed.set()
    text = " ".join(["word"] * 40)  # cut at the model's 16 tokens
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(live.post("/embed", {"inputs": [text] * 8})))
               for _ in range(16)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while "tformer_serve_queue_depth 128" not in live.request("GET", "/metrics")[2]:
            assert time.monotonic() < deadline, "the 16 requests were not queued in time"
            time.sleep(0.02)
        live.server.should_exit = True  # what SIGTERM does
        go.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        go.set()
        live.close()
    statuses = sorted(a[0] for a in answers)
    assert len(statuses) == 16 and set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= 4 and statuses.count(503) >= 1, statuses  # fair order: 0 or 1 whole
    assert all(len(a[2]) == 8 for a in answers if a[0] == 200)
