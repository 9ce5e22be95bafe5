"""Request ids over HTTP: a pure ASGI middleware (no framework: it wraps the
raw app as it would a Starlette or FastAPI one).

For every ``http`` and ``websocket`` scope it takes the client's
``X-Request-Id`` when it is a valid id (1-128 letters, digits or
``._:/+=@-``; anything else is replaced) or makes one, and

- sets ``rtserver.logs.REQUEST_ID`` for the whole request, so every log line
  written while serving it (in the tasks it starts too) carries it;
- puts it in ``scope["state"]["request_id"]`` (Starlette's
  ``request.state.request_id``);
- echoes it as ``X-Request-Id`` in the response, the WebSocket handshake's
  101 and its refusals (401, 403, 429, 503) included;
- adds ``"request_id"`` to every JSON error body (status >= 400, a JSON
  object, not streamed), at the top level and, in the OpenAI shape
  ``{"error": {...}}``, inside ``error`` too; the body's length is fixed up.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from rtserver.logs import new_request_id, request_scope
from rtserver.protocol.messages import valid_request_id

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

HEADER = b"x-request-id"
_STARTS = ("http.response.start", "websocket.http.response.start")
_BODIES = ("http.response.body", "websocket.http.response.body")
# An error body longer than this is passed on as it is (not held to be rewritten).
MAX_REWRITE_BYTES = 65_536


def request_id_of(scope: Scope) -> str:
    """The client's valid ``X-Request-Id``, else a new id."""
    for name, value in scope.get("headers", ()):
        if name.lower() == HEADER:
            text = value.decode("latin-1").strip()
            if valid_request_id(text):
                return text
            break
    return new_request_id()


def _with_header(headers: Any, rid: str) -> list[tuple[bytes, bytes]]:
    out = [(bytes(k), bytes(v)) for k, v in (headers or ()) if bytes(k).lower() != HEADER]
    out.append((HEADER, rid.encode("latin-1")))
    return out


def with_request_id(body: bytes, rid: str) -> bytes | None:
    """``body`` (a JSON object) with ``request_id`` added, or None when it is
    not a JSON object."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    obj.setdefault("request_id", rid)
    inner = obj.get("error")
    if isinstance(inner, dict):
        inner.setdefault("request_id", rid)
    return json.dumps(obj).encode()


class RequestIdMiddleware:
    """``RequestIdMiddleware(app)``: see the module docstring."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope)
        state = scope.setdefault("state", {})
        if isinstance(state, MutableMapping):
            state["request_id"] = rid
        held: Message | None = None  # an error's start, until its body is known
        parts: list[bytes] = []

        async def send_with_id(message: Message) -> None:
            nonlocal held
            kind = message["type"]
            if kind in _STARTS:
                message = {**message, "headers": _with_header(message.get("headers"), rid)}
                if int(message.get("status", 200)) >= 400 and _is_json(message["headers"]):
                    held = message
                    return
            elif kind == "websocket.accept":
                message = {**message, "headers": _with_header(message.get("headers"), rid)}
            elif kind in _BODIES and held is not None:
                parts.append(bytes(message.get("body", b"")))
                more = bool(message.get("more_body", False))
                if more and sum(map(len, parts)) <= MAX_REWRITE_BYTES:
                    return
                start, held = held, None
                body = b"".join(parts)
                if more:  # too long to hold: on as it came
                    await send(start)
                    await send({"type": kind, "body": body, "more_body": True})
                    return
                body = with_request_id(body, rid) or body
                start["headers"] = [(k, v) for k, v in start["headers"]
                                    if k.lower() != b"content-length"]
                start["headers"].append((b"content-length", str(len(body)).encode()))
                await send(start)
                message = {"type": kind, "body": body}
            await send(message)

        # the server's own send under it (inspect.unwrap): AsgiWebSocket reaches
        # uvicorn's protocol object through it (abort, claim_rejection)
        send_with_id.__wrapped__ = send  # type: ignore[attr-defined]
        with request_scope(rid):
            await self.app(scope, receive, send_with_id)


def _is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k.lower() == b"content-type" and v.split(b";")[0].strip().lower()
               == b"application/json" for k, v in headers)


__all__ = ["HEADER", "RequestIdMiddleware", "request_id_of", "with_request_id"]
