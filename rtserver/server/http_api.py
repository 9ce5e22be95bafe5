"""The HTTP API on FastAPI: every ``http`` request of the port.

``RtAsgi`` (rtserver.server.asgi) hands ``http`` scopes here and keeps the
WebSocket on its own path, so a stream's handshake and frames never pass a
framework layer. Here:

- the OpenAI speech API (``SpeechApi.router``: ``/v1/audio/speech``,
  ``/v1/audio/voices``, ``/v1/models``), ``POST /v1/tokens`` and
  ``/v1/admin/voices`` (their own handlers and error bodies, carried as they were);
- ``/health``, ``/ready``, ``/metrics``, ``/v1/voices``, ``/v1/stream``
  (426 without an upgrade) and the demo's files: ``HttpRoutes`` answers them,
  as before; this only carries its answers;
- ``/openapi.json`` (FastAPI's), ``/docs`` (Swagger UI) and ``/redoc``, their
  scripts served from ``/docs-assets`` by ``fastapi-offline`` (FastAPI's
  own pages load them from a CDN, which an offline deployment cannot reach);
- CORS through Starlette's ``CORSMiddleware`` when ``server.cors_origins`` is
  set (preflights answered, ``Access-Control-*`` headers on answers);
- every error in OpenAI's shape ``{"error": {"message", "type", "param",
  "code"}}``: 404, 405 (with ``Allow``), a body that does not validate (400,
  ``param`` the field; OpenAI answers invalid fields 400 where FastAPI would
  say 422), a body over the limit (413), 401, 429/503 (``Retry-After`` and
  ``retry-after-ms``), 500. ``/ready``'s 503 and ``/metrics``' 401 stay plain
  text (probes and scrapers read them).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import PlainTextResponse, Response
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException

from rtserver import __version__
from rtserver.errors import ErrorCode, RtError
from rtserver.server.admin_api import AdminApi
from rtserver.server.asgi import Receive, Scope, Send, request_of, send_response
from rtserver.server.http import STREAM_PATH, HttpResponse, HttpRoutes
from rtserver.server.openai_speech import (
    ApiAuthError,
    ApiError,
    SpeechApi,
    error_response,
    openai_error,
)
from rtserver.server.state import AppState
from rtserver.server.token_api import TokenApi

log = logging.getLogger("rtserver.http")

# Headers a page on another origin may read from an answer (CORS)
EXPOSED_HEADERS = ("retry-after", "retry-after-ms", "x-request-id", "x-rtserver-ignored")
DOCS_ASSETS = "/docs-assets"  # the scripts of /docs and /redoc (fastapi-offline's files)
_CODES = {404: "not_found", 405: "method_not_allowed", 413: "text_too_long"}


def to_response(r: HttpResponse) -> Response:
    """An ``HttpResponse`` (the framework-free answers) as Starlette's."""
    out = Response(r.body, status_code=r.status)
    out.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                       for k, v in r.all_headers()]
    return out


class BodyLimit:
    """ASGI middleware: a POST body over ``limit`` bytes is 413, from its
    ``Content-Length`` before it is read, else once that much has arrived."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await send_response(send, too_large(limit))
                return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:  # FastAPI re-raises an HTTPException from the body's read
                    raise HTTPException(413, f"request body over {limit} bytes")
            return msg

        await self.app(scope, limited, send)


def too_large(limit: int) -> HttpResponse:
    return openai_error(413, f"request body over {limit} bytes", "text_too_long", "input")


def build_http_app(app: AppState, speech: SpeechApi, tokens: TokenApi, admin: AdminApi) -> Any:
    """The ASGI app of every HTTP request: FastAPI, with the body limit and,
    when configured, CORS (outermost)."""
    api: FastAPI = FastAPIOffline(
        title="rtserver", version=__version__, static_url=DOCS_ASSETS,
        description="Real-time streaming text-to-speech. The streaming protocol is a WebSocket "
        f"at `{STREAM_PATH}` (docs/PROTOCOL.md); this is its HTTP side: OpenAI's speech API, "
        "browser tokens, health and metrics.")
    routes = HttpRoutes(app)

    def errors_counted(code: str) -> None:
        app.metrics.errors.labels(code).inc()

    @api.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        errors_counted(exc.err.code.value)
        return to_response(exc.response())

    @api.exception_handler(ApiAuthError)
    async def auth_error(request: Request, exc: ApiAuthError) -> Response:
        return to_response(openai_error(401, "missing or wrong API key", "invalid_api_key"))

    @api.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ())[1:] if isinstance(p, str)]
        param = loc[0] if loc else None
        code = (ErrorCode.UNSUPPORTED_FORMAT if param == "response_format"
                else ErrorCode.BAD_MESSAGE)
        message = first.get("msg", "invalid request")
        if param == "voice":  # a union: pydantic names the first branch that failed
            message = "'voice' must be a voice name or an object {\"id\": <name>}"
        elif param:
            message = f"'{'.'.join(loc)}': {message}"
        else:
            message = (f"the body must be a JSON object ({message}); send it with "
                       "Content-Type: application/json")
        errors_counted(code.value)
        return to_response(openai_error(400, message, code.value, param))

    @api.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        status = exc.status_code
        message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(status).phrase
        headers = tuple((exc.headers or {}).items())
        return to_response(openai_error(status, message, _CODES.get(status),
                                        "input" if status == 413 else None, headers=headers))

    @api.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> Response:
        """A handler's exception. Once the status is sent nothing more can be
        said: Starlette re-raises it and uvicorn drops the connection (an audio
        body that fails mid-stream ends short; speech logged and counted it)."""
        if isinstance(exc, RtError):
            return to_response(error_response(exc))
        log.exception("HTTP %s %s failed", request.method, request.url.path)
        errors_counted(ErrorCode.INTERNAL.value)
        return to_response(openai_error(500, "internal error", ErrorCode.INTERNAL.value))

    api.include_router(speech.router())
    api.include_router(tokens.router())
    api.include_router(admin.router())

    async def passthrough(request: Request) -> Response:  # async: no thread hop
        return to_response(routes(request_of(request.scope)))

    for path, summary in (("/health", "200 while the process runs"),
                          ("/ready", "200 once the voices are warm, else 503 (text says why)"),
                          ("/metrics", "Prometheus text format"),
                          ("/v1/voices", "the voices and the default"),
                          (STREAM_PATH, "the WebSocket; without an upgrade: 426")):
        name = path.strip("/").replace("/", "_")
        api.add_api_route(path, passthrough, methods=["GET"], summary=summary,
                          tags=["server"], operation_id=name, response_class=PlainTextResponse
                          if path in ("/health", "/ready", "/metrics") else Response)
        api.add_api_route(path, passthrough, methods=["HEAD"], include_in_schema=False,
                          operation_id=f"{name}_head")

    async def static(scope: Scope, receive: Receive, send: Send) -> None:
        """Paths no route has: the demo's files (GET, HEAD), else 404."""
        request = request_of(scope)
        if request.method in ("GET", "HEAD"):
            answer = routes(request)
            if answer.status != HTTPStatus.NOT_FOUND:
                await send_response(send, answer, head=request.method == "HEAD")
                return
        raise HTTPException(404, f"no route {request.path}")

    api.router.default = static
    api.add_middleware(BodyLimit, limit=speech.body_limit)
    if app.config.server.cors_origins:  # outermost: its headers are on every answer
        api.add_middleware(CORSMiddleware, allow_origins=list(app.config.server.cors_origins),
                           allow_methods=["GET", "POST", "HEAD", "OPTIONS"],
                           allow_headers=["*"], expose_headers=list(EXPOSED_HEADERS),
                           max_age=600)
    return api


__all__ = ["BodyLimit", "build_http_app", "to_response"]
