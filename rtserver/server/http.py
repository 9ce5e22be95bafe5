"""HTTP endpoints on the WebSocket port, independent of the server library.

``/health``, ``/ready``, ``/metrics``, ``/v1/voices`` and static files of the
demo at ``/``; ``/v1/stream`` without an upgrade is 426. ``admit_websocket``
is the handshake's check (Origin, API key or token, draining, connection
limit, connection rate; rtserver.server.guards and gate): the one place to add
admission rules that answer before a WebSocket exists.

Requests and responses are plain values (``HttpRequest``, ``HttpResponse``);
``rtserver.server.asgi`` carries them over the wire.
"""

from __future__ import annotations

import json
import math
import mimetypes
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, unquote

from rtserver.errors import RateLimited
from rtserver.server.guards import (
    Forbidden,
    Identity,
    Unauthorized,
    authenticate,
    bearer,
    check_origin,
)
from rtserver.server.state import AppState
from rtserver.server.tokens import SCOPE_STREAM

STREAM_PATH = "/v1/stream"
# the demo ships inside the package (package data), so a pip-installed server serves it
PACKAGED_WEB_ROOT = Path(__file__).resolve().parents[1] / "web_demo"


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """``path`` without the query; ``headers`` by lower-case name."""

    method: str
    path: str
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    client: str = ""  # "host:port" of the peer, when known

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    def query_param(self, name: str) -> str:
        return parse_qs(self.query).get(name, [""])[0]


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()

    def all_headers(self) -> list[tuple[str, str]]:
        return [("content-type", self.content_type), ("content-length", str(len(self.body))),
                ("cache-control", "no-store"), *self.headers]


def json_response(status: HTTPStatus | int, obj: object,
                  headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    return HttpResponse(int(status), json.dumps(obj).encode(), "application/json", headers)


def text_response(status: HTTPStatus | int, text: str) -> HttpResponse:
    return HttpResponse(int(status), (text + "\n").encode(), "text/plain; charset=utf-8")


def supplied_key(request: HttpRequest) -> str:
    """The credential a request carries: ``Authorization: Bearer`` or ``?token=``
    (an API key, or a token from ``POST /v1/tokens``)."""
    return bearer(request.header("authorization")) or request.query_param("token")


def identify(app: AppState, request: HttpRequest, scope: str = SCOPE_STREAM) -> Identity:
    """Who the request is (an API key's id, or its address without keys);
    ``Unauthorized`` when keys are set and it carries no valid key or token."""
    return authenticate(supplied_key(request), app.config.server.api_keys, app.gate.secret,
                        time.time(), request.client.rpartition(":")[0], scope)


def authorized(app: AppState, request: HttpRequest, scope: str = SCOPE_STREAM) -> bool:
    try:
        identify(app, request, scope)
    except Unauthorized:
        return False
    return True


def rate_limited_response(err: RateLimited) -> HttpResponse:
    """429 with ``Retry-After`` (seconds), ``retry-after-ms`` and the
    protocol's code and ``retry_after_ms`` in the JSON body."""
    retry_ms = err.retry_after_ms or 1000
    return json_response(HTTPStatus.TOO_MANY_REQUESTS,
                         {"code": err.code.value, "message": err.message,
                          "retry_after_ms": retry_ms},
                         (("retry-after", str(math.ceil(retry_ms / 1000))),
                          ("retry-after-ms", str(retry_ms))))


def admit_websocket(app: AppState, request: HttpRequest) -> HttpResponse | None:
    """Why a WebSocket handshake is refused (an HTTP answer), or None: admitted,
    and one of ``max_connections`` is now held (counted here, before any await,
    so concurrent handshakes cannot overshoot); the transport gives it back
    with ``release_websocket`` when the connection ends, however it ends."""
    rejected = app.metrics.rejected
    if request.path != STREAM_PATH:
        return text_response(HTTPStatus.NOT_FOUND, "not found")
    try:
        check_origin(request.headers.get("origin"), app.config.server.origins)
    except Forbidden as exc:
        rejected.labels("origin").inc()
        return text_response(HTTPStatus.FORBIDDEN, str(exc))
    try:
        who = identify(app, request)
    except Unauthorized as exc:
        rejected.labels("unauthorized").inc()
        return text_response(HTTPStatus.UNAUTHORIZED, str(exc))
    if app.draining:
        rejected.labels("draining").inc()
        return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "server is draining")
    if app.connections >= app.config.server.max_connections:
        rejected.labels("max_connections").inc()
        return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections")
    try:
        app.gate.connection(who.key, app.clock.now())
    except RateLimited as err:
        rejected.labels("rate_limited").inc()
        return rate_limited_response(err)
    app.connections += 1
    return None


def release_websocket(app: AppState) -> None:
    """The connection ``admit_websocket`` admitted has ended."""
    app.connections -= 1


class HttpRoutes:
    """The GET endpoints: ``routes(request)`` -> ``HttpResponse``."""

    def __init__(self, app: AppState) -> None:
        self.app = app
        root = app.config.server.web_root
        self.web_root = (Path(root) if root else PACKAGED_WEB_ROOT).resolve()

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        if request.method not in ("GET", "HEAD"):
            return HttpResponse(HTTPStatus.METHOD_NOT_ALLOWED, b"method not allowed\n",
                                "text/plain; charset=utf-8", (("allow", "GET, HEAD"),))
        if path == STREAM_PATH:
            return text_response(HTTPStatus.UPGRADE_REQUIRED, "this endpoint is a WebSocket")
        if path == "/health":
            return text_response(HTTPStatus.OK, "ok")
        if path == "/ready":
            ready, why = self.app.is_ready()
            return text_response(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE,
                                 why)
        if path == "/metrics":
            if self.app.config.admission.metrics_need_key and self.app.config.server.api_keys \
                    and not authorized(self.app, request, scope="metrics"):
                return text_response(HTTPStatus.UNAUTHORIZED, "missing or wrong API key")
            return HttpResponse(HTTPStatus.OK, self.app.metrics.render(),
                                "text/plain; version=0.0.4; charset=utf-8")
        if path == "/v1/voices":
            return json_response(HTTPStatus.OK, {"voices": self.app.voices_json(),
                                                 "default": self.app.default_voice})
        return self._static(path)

    def _static(self, path: str) -> HttpResponse:
        rel = unquote(path).lstrip("/") or "index.html"
        target = (self.web_root / rel).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(self.web_root) or not target.is_file():
            return text_response(HTTPStatus.NOT_FOUND, "not found")
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype in ("application/javascript",):
            ctype += "; charset=utf-8"
        return HttpResponse(HTTPStatus.OK, target.read_bytes(), ctype)
