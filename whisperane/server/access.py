"""Who may use the server: the Host a request names, the web page it comes from, and the API key.

Any web page a user visits can send requests to a server on the user's machine (a simple POST needs no CORS
preflight, a WebSocket none at all) and, by DNS rebinding, read the answers. So, as Jupyter and Ollama do for
their local servers, every HTTP request and WebSocket handshake is checked before the app sees it:

- ``Host`` must name the address the server is bound to (any loopback address or ``localhost`` when that is a
  loopback address; any IP address when it is a wildcard such as 0.0.0.0) or a name given with ``--allow-host``
  (``*``: any). A rebinding page reaches the server under its own domain name, which is none of these.
- ``Origin``, which browsers send and other clients do not, must be the server's own (its page at ``/``) or one
  given with ``--allow-origin`` (``*``: any); those get CORS headers, and their preflight requests an answer.
- The API key, when one is set, on everything but ``/health`` and the page: ``Authorization: Bearer KEY``, or
  the WebSocket subprotocol ``bearer.KEY`` (a browser cannot set headers on a WebSocket).

A refused HTTP request gets OpenAI's error object (400 for a bad Host, 403 for a foreign Origin, 401 for the
key); a refused WebSocket handshake is closed before it is accepted (HTTP 403), with the reason.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable

from starlette.datastructures import Headers, MutableHeaders

from .config import ServerConfig
from .openai_api import ApiError

# Open without the key: /health, and the page's static files (the page asks for the key and sends it itself).
OPEN_PATHS = ("/health", "/")
PAGE_PREFIX = "/page/"
BEARER_PREFIX = "bearer."  # the key as a WebSocket subprotocol
CORS_METHODS = "GET, POST, OPTIONS"
CORS_MAX_AGE_S = "600"
WS_POLICY_VIOLATION = 1008


def host_name(host: str) -> str:
    """A Host header's name without its port (``[::1]:8000`` -> ``::1``), lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def host_allowed(host: str | None, config: ServerConfig) -> bool:
    if host is None or "*" in config.allow_hosts:  # a client without Host (HTTP/1.0) is no browser
        return True
    name = host_name(host)
    if name in config.allow_hosts:
        return True
    ip, bound = _ip(name), _ip(config.host)
    if bound is None:  # bound to a name: that name
        return name == config.host.lower()
    if bound.is_unspecified:  # 0.0.0.0 or ::, reachable at any of the machine's addresses
        return ip is not None or name == "localhost"
    if bound.is_loopback:
        return name == "localhost" or (ip is not None and ip.is_loopback)
    return ip == bound


def same_origin(origin: str, host: str | None) -> bool:
    """The page the server itself serves: its origin names the Host the request was sent to (already checked)."""
    return host is not None and origin.lower() in (f"http://{host.lower()}", f"https://{host.lower()}")


class Access:
    """The checks of one server's config; ``refusal`` says why a request may not go on (None: it may)."""

    def __init__(self, config: ServerConfig):
        self.config = config

    def listed_origin(self, origin: str | None) -> bool:
        return origin is not None and ("*" in self.config.allow_origins or origin in self.config.allow_origins)

    def authorized(self, header: str | None) -> bool:
        key = self.config.api_key
        if not key:
            return True
        scheme, _, token = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())

    def refusal(self, scope: dict, headers: Headers) -> ApiError | None:
        host, origin = headers.get("host"), headers.get("origin")
        if not host_allowed(host, self.config):
            return ApiError(400 if scope["type"] == "http" else 403, f"the Host '{host}' is not this server's; "
                            "serve --allow-host NAME to reach it by that name", code="host_not_allowed")
        if origin is not None and not (same_origin(origin, host) or self.listed_origin(origin)):
            return ApiError(403, f"requests from the web page at {origin} are not allowed; "
                            "serve --allow-origin ORIGIN to allow them", code="origin_not_allowed")
        path = scope["path"]
        if path in OPEN_PATHS or path.startswith(PAGE_PREFIX) or self.authorized(_key(scope, headers)):
            return None
        return ApiError(401, "a valid API key is needed: Authorization: Bearer KEY", code="invalid_api_key")


def _key(scope: dict, headers: Headers) -> str | None:
    if header := headers.get("authorization"):
        return header
    for protocol in scope.get("subprotocols", []) if scope["type"] == "websocket" else []:
        if protocol.startswith(BEARER_PREFIX):
            return "Bearer " + protocol[len(BEARER_PREFIX) :]
    return None


Send = Callable[[dict], Awaitable[None]]


class AccessMiddleware:
    """The ASGI middleware in front of the app: HTTP and WebSocket alike."""

    def __init__(self, app, config: ServerConfig):
        self.app, self.access = app, Access(config)

    async def __call__(self, scope: dict, receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        preflight = scope["type"] == "http" and scope["method"] == "OPTIONS" and \
            "access-control-request-method" in headers
        refusal = self.access.refusal({**scope, "path": "/"} if preflight else scope, headers)
        if refusal is not None:
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION, "reason": refusal.message})
            return await refusal.response()(scope, receive, send)
        if preflight:
            return await _preflight(headers, send)
        if scope["type"] == "http" and self.access.listed_origin(origin):
            send = _with_cors(send, origin)
        await self.app(scope, receive, send)


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


async def _preflight(headers: Headers, send: Send) -> None:
    """A listed origin's preflight (the browser asks before a request with the Authorization header, say)."""
    allow = [*_cors_headers(headers["origin"]), (b"access-control-allow-methods", CORS_METHODS.encode()),
             (b"access-control-max-age", CORS_MAX_AGE_S.encode())]
    if requested := headers.get("access-control-request-headers"):
        allow.append((b"access-control-allow-headers", requested.encode("latin-1")))
    await send({"type": "http.response.start", "status": 204, "headers": allow})
    await send({"type": "http.response.body", "body": b""})


def _with_cors(send: Send, origin: str) -> Send:
    async def send_with_cors(message: dict) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in _cors_headers(origin):
                headers.append(name.decode(), value.decode("latin-1"))
        await send(message)

    return send_with_cors
