"""What a web page may do with the server: nothing, unless the command says so.

A page in a browser can send requests to a server on localhost, and by DNS rebinding (its own
name made to resolve to 127.0.0.1) even read the answers. Three defences, in the order a request
meets them:

    HostGuard   the Host header must name this server: the bind address or localhost's names,
                plus --allowed-hosts (example.com, *.example.com, or * for any); else 400.
                A rebinding page's requests carry its own name, so they stop here. An
                absolute-form target (GET http://example.com/health, what a client sends a
                proxy) names the host in place of the header (RFC 9112 §3.2.2). (HTTP/1.0
                has no Host header: a request without one is let through, as a browser
                always sends one; a load balancer's check often has none.)
    CORS        off unless --cors-origin names the origins whose pages may read answers
                (Starlette's CORSMiddleware); without it browsers keep other origins out.
    JSON only   POST bodies must say Content-Type: application/json (app.py, 415): a page
                can send a form or text/plain without asking the server first, never JSON.
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from tformer.serve.config import ServeConfig
from tformer.serve.connections import TARGET_HOST
from tformer.serve.endpoint import error
from tformer.serve.schema import RequestError

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def middleware(config: ServeConfig) -> list[Middleware]:
    allowed = allowed_hosts(config)
    stack = [Middleware(HostGuard, allowed=allowed)]
    if config.cors_origins:
        stack.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                allow_methods=["GET", "POST"],
                                allow_headers=["authorization", "content-type"], max_age=600))
    return stack


def allowed_hosts(config: ServeConfig) -> tuple[str, ...]:
    return tuple(dict.fromkeys([_bare(config.host.lower()), *LOCAL_NAMES,
                                *(h.lower() for h in config.allowed_hosts)]))


class HostGuard:
    """Pure ASGI: requests whose Host header is not allowed get a JSON 400 naming it."""

    def __init__(self, app, allowed: tuple[str, ...]) -> None:
        self.app, self.allowed = app, allowed
        self.any = "*" in allowed
        self.suffixes = tuple(h[1:] for h in allowed if h.startswith("*."))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            hosts = [v for k, v in scope["headers"] if k == b"host"]
            target = scope.get(TARGET_HOST)  # an absolute-form target's host: it replaces Host's
            field, refusal = "Host", None
            if len(hosts) > 1:  # RFC 9112 §3.2: a 400; the check below read the first, others the last
                refusal = f"Host: expected one Host header, got {len(hosts)}"
            elif not self.any and (hosts or target is not None or scope["http_version"] != "1.0"):
                if target is not None:
                    field, raw = "request target", target
                else:
                    raw = hosts[0] if hosts else b""
                host = _bare(_hostname(raw.decode("latin-1").lower()))
                if not (host in self.allowed or (self.suffixes and host.endswith(self.suffixes))):
                    refusal = (f"{field}: expected one of {', '.join(self.allowed)} (widen with "
                               f"--allowed-hosts), got {raw.decode('latin-1')[:100]!r}")
            if refusal is not None:
                await error(RequestError(400, field, refusal))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _hostname(host: str) -> str:
    """'example.com:8000' -> 'example.com'; '[::1]:8000' -> '[::1]'."""
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _bare(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
