"""HTTP endpoints on the WebSocket port, independent of the server library.

``/health``, ``/ready``, ``/metrics``, ``/v1/voices`` and static files of the
demo at ``/``; ``/v1/stream`` without an upgrade is 426. ``websocket_refusal``
is the handshake's check (API key, draining, connection limit): the one place
to add admission rules that answer before a WebSocket exists.

Requests and responses are plain values (``HttpRequest``, ``HttpResponse``);
``rtserver.server.asgi`` carries them over the wire.
"""

from __future__ import annotations

import hmac
import json
import mimetypes
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, unquote

from rtserver.server.state import AppState

STREAM_PATH = "/v1/stream"
PACKAGED_WEB_ROOT = Path(__file__).resolve().parents[2] / "web_demo"


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
    """The API key a request carries: ``Authorization: Bearer`` or ``?token=``."""
    auth = request.header("authorization")
    if auth.startswith("Bearer "):
        return auth[len("Bearer "):].strip()
    return request.query_param("token")


def authorized(app: AppState, request: HttpRequest) -> bool:
    keys = app.config.server.api_keys
    if not keys:
        return True
    supplied = supplied_key(request)
    return any(hmac.compare_digest(supplied.encode(), k.encode()) for k in keys)


def websocket_refusal(app: AppState, request: HttpRequest) -> HttpResponse | None:
    """Why a WebSocket handshake is refused (an HTTP answer), or None to accept."""
    if request.path != STREAM_PATH:
        return text_response(HTTPStatus.NOT_FOUND, "not found")
    if not authorized(app, request):
        return text_response(HTTPStatus.UNAUTHORIZED, "missing or wrong API key")
    if app.draining:
        return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "server is draining")
    if app.connections >= app.config.server.max_connections:
        return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections")
    return None


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
            if self.app.ready and not self.app.draining:
                return text_response(HTTPStatus.OK, "ready")
            return text_response(HTTPStatus.SERVICE_UNAVAILABLE,
                                 "draining" if self.app.draining else "warming up")
        if path == "/metrics":
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
