"""The ASGI shell: HTTP and the WebSocket on one port, served by uvicorn.

uvicorn runs this app with ``ws="websockets-sansio"`` (the ``websockets``
package's protocol): its ``send`` waits while the socket's write buffer is
above the high-water mark, so a connection's writer blocks when its client
does not read (the backpressure ``Outbox`` and ``overload_after_s`` rely on).

- ``websocket`` scopes: ``admit_websocket`` may answer with HTTP (401, 403,
  429, 503, 404) before any WebSocket exists; else the handshake is accepted and
  ``on_websocket`` gets an ``AsgiWebSocket`` (``recv``/``send``/``close``).
- ``http`` scopes: the HTTP app (FastAPI, rtserver.server.http_api). The
  WebSocket stays on this path of its own: its handshake and frames pass no
  framework layer (the same code, and cost, as before FastAPI came in).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from starlette.responses import Response
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK
from websockets.frames import Close

from rtserver.config import ServerConfig
from rtserver.server import tcp
from rtserver.server.http import (
    HttpRequest,
    HttpResponse,
    admit_websocket,
    release_websocket,
)
from rtserver.server.state import AppState

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class AsgiWebSocket:
    """One accepted WebSocket: ``recv``, ``send`` (waits while the client does
    not read), ``close``. A gone peer raises ``ConnectionClosed`` (websockets'
    exception: what ``Connection`` catches)."""

    def __init__(self, receive: Receive, send: Send, request: HttpRequest, *,
                 close_timeout_s: float = ServerConfig().close_timeout_s) -> None:
        self._receive = receive
        self._send = send
        self.request = request
        self.close_code: int | None = None
        self.close_timeout_s = close_timeout_s

    async def recv(self) -> str | bytes:
        if self.close_code is not None:
            raise _closed(self.close_code)
        msg = await self._receive()
        if msg["type"] == "websocket.receive":
            text = msg.get("text")
            return text if text is not None else bytes(msg.get("bytes") or b"")
        self.close_code = int(msg.get("code", 1005))
        raise _closed(self.close_code)

    async def send(self, data: str | bytes) -> None:
        if self.close_code is not None:
            raise _closed(self.close_code)
        key = "text" if isinstance(data, str) else "bytes"
        try:
            await self._send({"type": "websocket.send", key: data})
        except (OSError, RuntimeError):  # uvicorn's ClientDisconnected is an OSError
            self.close_code = self.close_code or 1006
            raise _closed(self.close_code) from None

    async def close(self, code: int = 1000, reason: str = "", last: str | None = None) -> None:
        """Send ``last`` (if any), then the close frame. uvicorn's ``send``
        writes only once the client has read the socket's buffer down, so both
        wait behind unread data; a client that reads neither within
        ``close_timeout_s`` (one deadline for both) is cut off (``abort``)."""
        if self.close_code is not None:
            return
        self.close_code = code
        try:
            async with asyncio.timeout(self.close_timeout_s):
                with contextlib.suppress(OSError, RuntimeError):
                    if last is not None:
                        await self._send({"type": "websocket.send", "text": last})
                    await self._send({"type": "websocket.close", "code": code,
                                      "reason": reason})
        except TimeoutError:
            self.abort()

    def claim_rejection(self) -> bool:
        """``WsTransport.claim_rejection``: shared with the budgeted protocol
        (``ws_protocol``), the owner of ``send``; other servers: always True."""
        claim = getattr(self._owner(), "claim_rejection", None)
        return True if claim is None else bool(claim())

    def _owner(self) -> object | None:
        """The object whose method ``send`` is, under any middleware's wrapper
        that names it (``__wrapped__``): uvicorn's protocol, or None."""
        return getattr(inspect.unwrap(self._send), "__self__", None)

    def abort(self) -> None:
        """Reset the TCP connection now, unsent data included (uvicorn's
        protocol object is the owner of ``send``; other servers: no-op)."""
        transport = getattr(self._owner(), "transport", None)
        if transport is not None:
            tcp.reset(transport)


def _closed(code: int) -> ConnectionClosedOK | ConnectionClosedError:
    frame = Close(code, "")
    if code in (1000, 1001):
        return ConnectionClosedOK(frame, None)
    return ConnectionClosedError(frame, None)


def request_of(scope: Scope) -> HttpRequest:
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        key = name.decode("latin-1").lower()
        val = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {val}" if key in headers else val
    client = scope.get("client")
    return HttpRequest(
        method=scope.get("method", "GET"), path=scope.get("path", "/"),
        query=scope.get("query_string", b"").decode("latin-1"), headers=headers,
        client=f"{client[0]}:{client[1]}" if client else "")


def _encode_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def send_response(send: Send, response: HttpResponse, *, head: bool = False) -> None:
    await send({"type": "http.response.start", "status": response.status,
                "headers": _encode_headers(response.all_headers())})
    await send({"type": "http.response.body", "body": b"" if head else response.body})


class BodyTooLarge(Exception):
    """The request body is over the limit given to ``read_body``."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; ``BodyTooLarge`` past ``limit`` bytes,
    ``ConnectionError`` when the client leaves first."""
    parts: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionError("client went away")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
        parts.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(parts)


class HttpStream:
    """A response body sent as it is made (chunked): ``start``, ``write``...,
    ``end``. ``disconnected`` is set when the client goes away; ``write``
    then raises ``ConnectionError``."""

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self.started = False
        self.disconnected = asyncio.Event()

    async def watch(self) -> None:
        """Wait for the client's disconnect (run as a task once the body is read)."""
        while True:
            msg = await self._receive()
            if msg["type"] == "http.disconnect":
                self.disconnected.set()
                return

    async def start(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        self.started = True
        await self._send({"type": "http.response.start", "status": status,
                          "headers": _encode_headers(headers)})

    async def write(self, data: bytes) -> None:
        if self.disconnected.is_set():
            raise ConnectionError("client went away")
        try:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})
        except OSError as exc:
            self.disconnected.set()
            raise ConnectionError("client went away") from exc

    async def end(self) -> None:
        with contextlib.suppress(OSError):
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})


class RawResponse(Response):
    """A framework response that its handler writes on the ASGI connection
    itself (a body streamed as it is made, that watches for the client leaving)."""

    def __init__(self, handler: Callable[[Receive, Send], Awaitable[None]]) -> None:
        super().__init__()
        self._handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._handler(receive, send)


AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]
WebSocketHandler = Callable[[AsgiWebSocket], Awaitable[None]]


class RtAsgi:
    """The ASGI application of one server: ``http`` scopes to ``http_app``,
    ``websocket`` scopes to the handshake's admission and ``on_websocket``."""

    def __init__(self, app: AppState, on_websocket: WebSocketHandler, http_app: AsgiApp) -> None:
        self.app = app
        self.on_websocket = on_websocket
        self.http_app = http_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http_app(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":  # uvicorn runs with lifespan="off"; answer anyway
            while (msg := await receive())["type"] != "lifespan.shutdown":
                await send({"type": msg["type"] + ".complete"})
            await send({"type": "lifespan.shutdown.complete"})

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        request = request_of(scope)
        refusal = admit_websocket(self.app, request)
        if refusal is not None:
            await send({"type": "websocket.http.response.start", "status": refusal.status,
                        "headers": _encode_headers(refusal.all_headers())})
            await send({"type": "websocket.http.response.body", "body": refusal.body})
            return
        try:  # admitted: one connection slot is held until this ends
            await send({"type": "websocket.accept"})
            ws = AsgiWebSocket(receive, send, request,
                               close_timeout_s=self.app.config.server.close_timeout_s)
            try:
                await self.on_websocket(ws)
            finally:
                await ws.close(1000, "")  # no-op when it was closed already
        finally:
            release_websocket(self.app)
