"""HTTP endpoints on the WebSocket port (websockets' ``process_request`` hook).

``/health``, ``/ready``, ``/metrics``, ``/v1/voices`` and static files of the
demo at ``/``. Requests for ``/v1/stream`` pass through to the WebSocket
handshake after the API-key check.
"""

from __future__ import annotations

import hmac
import json
import mimetypes
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from rtserver.server.state import AppState

STREAM_PATH = "/v1/stream"
PACKAGED_WEB_ROOT = Path(__file__).resolve().parents[2] / "web_demo"


def _response(status: HTTPStatus, body: bytes, content_type: str,
              extra: dict[str, str] | None = None) -> Response:
    headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(body))),
                       ("Cache-Control", "no-store")])
    for k, v in (extra or {}).items():
        headers[k] = v
    return Response(status.value, status.phrase, headers, body)


def _json(status: HTTPStatus, obj: object) -> Response:
    return _response(status, json.dumps(obj).encode(), "application/json")


def _text(status: HTTPStatus, text: str) -> Response:
    return _response(status, (text + "\n").encode(), "text/plain; charset=utf-8")


def authorized(app: AppState, request: Request) -> bool:
    keys = app.config.server.api_keys
    if not keys:
        return True
    supplied = ""
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        supplied = auth[len("Bearer "):].strip()
    else:
        supplied = parse_qs(urlsplit(request.path).query).get("token", [""])[0]
    return any(hmac.compare_digest(supplied.encode(), k.encode()) for k in keys)


class HttpRoutes:
    def __init__(self, app: AppState) -> None:
        self.app = app
        root = app.config.server.web_root
        self.web_root = (Path(root) if root else PACKAGED_WEB_ROOT).resolve()

    def __call__(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == STREAM_PATH:
            if not authorized(self.app, request):
                return _text(HTTPStatus.UNAUTHORIZED, "missing or wrong API key")
            if self.app.draining:
                return _text(HTTPStatus.SERVICE_UNAVAILABLE, "server is draining")
            if self.app.connections >= self.app.config.server.max_connections:
                return _text(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections")
            if request.headers.get("Upgrade", "").lower() != "websocket":
                return _text(HTTPStatus.UPGRADE_REQUIRED, "this endpoint is a WebSocket")
            return None
        if path == "/health":
            return _text(HTTPStatus.OK, "ok")
        if path == "/ready":
            if self.app.ready and not self.app.draining:
                return _text(HTTPStatus.OK, "ready")
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, "draining" if self.app.draining
                         else "warming up")
        if path == "/metrics":
            return _response(HTTPStatus.OK, self.app.metrics.render(),
                             "text/plain; version=0.0.4; charset=utf-8")
        if path == "/v1/voices":
            return _json(HTTPStatus.OK, {"voices": self.app.voices_json(),
                                         "default": self.app.default_voice})
        return self._static(path)

    def _static(self, path: str) -> Response:
        rel = unquote(path).lstrip("/") or "index.html"
        target = (self.web_root / rel).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(self.web_root) or not target.is_file():
            return _text(HTTPStatus.NOT_FOUND, "not found")
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype in ("application/javascript",):
            ctype += "; charset=utf-8"
        return _response(HTTPStatus.OK, target.read_bytes(), ctype)
