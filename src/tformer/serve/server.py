"""Start uvicorn on one socket: one process, or ``--workers N`` processes sharing it.

The socket is bound here, before any worker starts, so a port in use is a one-line error and
``--port 0`` (any free port) is known and printed; the workers (uvicorn's supervisor spawns
them) inherit it and the kernel spreads the connections among them.

On SIGTERM uvicorn stops accepting; connections still reading a request are closed, the
requests in flight get --grace-period seconds to be answered (their jobs are already queued:
the batcher answers them; after that they get 503), the app's shutdown runs, and the command
returns. uvicorn then raises the signal again for the handler that was there before it; ours
ignores it, so the command ends with status 0 after a drain (connections.py). Ctrl-C (SIGINT)
drains the same way and ends the same way; a second Ctrl-C stops at once (uvicorn's force
exit): the requests still open get 503 (app.py) and the command ends with 130.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import Any

from tformer.errors import require
from tformer.serve.config import ENV, ServeConfig

# Seconds uvicorn itself waits past --grace-period before cancelling what is left (a backstop:
# the drain answers every request by the grace period's end).
BACKSTOP_S = 5


def serve(config: ServeConfig) -> int:
    """Serve until SIGTERM or Ctrl-C; return the exit status."""
    uvicorn = require("uvicorn", "serve", "tformer serve")
    require("starlette", "serve", "tformer serve")
    require("httptools", "serve", "tformer serve")
    from tformer.serve.app import create_app
    from tformer.serve.routes import endpoints

    # Loaded here once even with --workers: a bad directory is one line, before any worker starts.
    app = create_app(config)
    service = app.state.service
    sock = bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"tformer serve: {service.served.kind} model {config.model_name} ({config.dtype}, "
          f"{service.config.device}) on "
          f"http://{shown}:{port} with {config.workers} worker(s) x {config.threads_per_worker} "
          f"thread(s); endpoints {', '.join(sorted(endpoints(service)))}", file=sys.stderr, flush=True)
    # What uvicorn re-raises the signal into after the drain: nothing, so a drain ends with 0
    # (Ctrl-C's KeyboardInterrupt would make it 130, "interrupted", though every request was answered).
    drained = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if config.workers == 1:
            server = uvicorn.Server(uvicorn_config(app, config))
            server.run(sockets=[sock])
            if server.force_exit:  # a second Ctrl-C: the requests still open got 503
                print("tformer serve: interrupted (stopped at once, without the drain)", file=sys.stderr)
                return 130
            return 0
        del app, service  # each worker loads its own copy
        from uvicorn.supervisors import Multiprocess

        os.environ[ENV] = config.to_json()
        uv_config = uvicorn_config("tformer.serve.app:app_from_env", config, factory=True,
                                   workers=config.workers)
        Multiprocess(uv_config, sockets=[sock]).run()
        return 0
    finally:
        for sig, handler in drained.items():
            signal.signal(sig, handler)


def uvicorn_config(app: Any, config: ServeConfig, **options: Any):
    """uvicorn's settings for this server: its guarded protocol (timeouts, the connection bound,
    the drain), the keep-alive timeout, the grace period."""
    import uvicorn

    from tformer.serve.connections import GuardedProtocol

    return uvicorn.Config(app, http=GuardedProtocol, log_level="warning", access_log=False, lifespan="on",
                          timeout_keep_alive=config.keep_alive_timeout,
                          timeout_graceful_shutdown=round(config.grace_period) + BACKSTOP_S, **options)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free one), inheritable by workers."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ValueError(f"--host: cannot resolve {host!r} ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
