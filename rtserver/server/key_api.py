"""What the API-key-only endpoints share (``POST /v1/tokens``,
``/v1/admin/voices``): they are off (404) without configured API keys, need
a valid ``Authorization: Bearer <API key>`` (401; a browser token is not a
key), and read a small JSON object body. Errors are ``{"code", "message"}``."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from rtserver.errors import ErrorCode
from rtserver.server.asgi import BodyTooLarge, Receive, read_body
from rtserver.server.guards import bearer
from rtserver.server.http import HttpRequest, HttpResponse, json_response
from rtserver.server.state import AppState
from rtserver.server.tokens import match_key


class Refused(Exception):
    """A request such an endpoint answers with an error: ``response()``."""

    def __init__(self, status: HTTPStatus, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def response(self) -> HttpResponse:
        return json_response(self.status, {"code": self.code, "message": self.message})


def bad_request(message: str) -> Refused:
    return Refused(HTTPStatus.BAD_REQUEST, ErrorCode.BAD_MESSAGE.value, message)


def api_key(app: AppState, request: HttpRequest, *, off: str, needed: str) -> str:
    """The request's API key; ``Refused`` 404 (``off``) when the server has no
    keys, 401 (``needed``, counted as an ``unauthorized`` refusal) without one."""
    keys = app.config.server.api_keys
    if not keys:
        raise Refused(HTTPStatus.NOT_FOUND, "not_found", off)
    key = match_key(bearer(request.header("authorization")), keys)
    if key is None:
        app.metrics.rejected.labels("unauthorized").inc()
        raise Refused(HTTPStatus.UNAUTHORIZED, "unauthorized", needed)
    return key


async def json_object(receive: Receive, limit: int, *, empty: bool = False) -> dict[str, Any]:
    """The body as a JSON object of at most ``limit`` bytes (``empty``: an
    empty body is ``{}``); ``Refused`` 400 ``bad_message`` otherwise."""
    try:
        raw = await read_body(receive, limit)
    except BodyTooLarge:
        raise bad_request(f"body over {limit} bytes") from None
    except ConnectionError:
        raise bad_request("client went away") from None
    if empty and not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_request("the body is not JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


__all__ = ["Refused", "api_key", "bad_request", "json_object"]
