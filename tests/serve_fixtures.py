"""A live `tformer serve` for the tests: uvicorn in a thread, on 127.0.0.1 and a free port;
and a small HTTP client (the standard library's)."""

from __future__ import annotations

import http.client
import json
import threading
import time

TINY_RUN = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-layers", "1", "--vocab-size", "300",
            "--max-tokens", "512", "--eval-every", "4", "--log-every", "2", "--threads", "1", "--quiet",
            "--steps", "4"]


class Live:
    """uvicorn serving ``app`` in a background thread until ``close``, with the command's
    settings (its guarded connections, timeouts and grace period)."""

    def __init__(self, app, config) -> None:
        import uvicorn

        from tformer.serve.server import bind, uvicorn_config

        sock = bind("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.app = app
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def request(self, method: str, path: str, body=None, raw: bytes | None = None, timeout: float = 30):
        """(status, headers, parsed JSON or text)."""
        return request(self.port, method, path, body, raw, timeout)

    def post(self, path: str, body=None, raw: bytes | None = None):
        return self.request("POST", path, body, raw)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def request(port: int, method: str, path: str, body=None, raw: bytes | None = None, timeout: float = 30,
            headers: dict[str, str] | None = None):
    """(status, headers, parsed JSON or text); ``headers`` replace the defaults (JSON, and the
    Host that http.client sends: 127.0.0.1:port)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        sent = {"Content-Type": "application/json", **(headers or {})}
        conn.putrequest(method, path, skip_host="Host" in sent, skip_accept_encoding=True)
        for key, value in sent.items():
            if value is not None:
                conn.putheader(key, value)
        conn.putheader("Content-Length", str(len(data or b"")))
        conn.endheaders(data)
        response = conn.getresponse()
        text = response.read().decode()
        headers = {k.lower(): v for k, v in response.getheaders()}
        parsed = json.loads(text) if headers.get("content-type", "").startswith("application/json") else text
        return response.status, headers, parsed
    finally:
        conn.close()


def serve(model, **settings) -> Live:
    from tformer.serve.app import create_app
    from tformer.serve.config import ServeConfig

    config = ServeConfig(model=str(model), **{"threads": 1, **settings}).decide()
    return Live(create_app(config), config)
