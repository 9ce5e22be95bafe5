"""Handshake checks, pure: the transport calls them before it accepts a
WebSocket (or serves an authenticated HTTP request) and maps the answer to
a status: 401 ``Unauthorized``, 403 ``Forbidden`` (the connection count and
rate are ``http.admit_websocket``'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs

from rtserver.server.tokens import SCOPE_STREAM, InvalidToken, key_id, match_key, verify


class Unauthorized(Exception):
    """Missing or wrong credentials (HTTP 401)."""


class Forbidden(Exception):
    """An Origin that is not on the allow-list (HTTP 403)."""


def _origin_key(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def check_origin(origin: str | None, allowed: Sequence[str]) -> None:
    """Raise ``Forbidden`` unless ``origin`` is allowed. An empty allow-list
    allows every origin. With one, a request without an ``Origin`` header
    passes (not a browser: browsers always send it on a WebSocket handshake)
    and ``null`` (sandboxed frames, files) never does."""
    if not allowed or origin is None:
        return
    if origin.strip() == "null" or _origin_key(origin) not in {_origin_key(a) for a in allowed}:
        raise Forbidden("this Origin is not allowed")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is for rate limits: an API key's id or a client address."""

    key: str
    authenticated: bool


def bearer(authorization: str | None) -> str:
    """The credential of an ``Authorization: Bearer ...`` header ('' if none)."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return ""


def query_token(query: str) -> str:
    """The ``token`` parameter of a query string ('' if none)."""
    return parse_qs(query).get("token", [""])[0]


def authenticate(credential: str, keys: Sequence[str], secret: bytes, now: float,
                 client_address: str, scope: str = SCOPE_STREAM) -> Identity:
    """The identity behind ``credential`` (an API key or a signed token from
    ``POST /v1/tokens``). Without configured keys everyone is let in, known by
    address; with keys, anything else raises ``Unauthorized``."""
    if not keys:
        return Identity(key=f"addr:{client_address}", authenticated=False)
    if credential:
        key = match_key(credential, keys)
        if key is not None:
            return Identity(key=key_id(key), authenticated=True)
        try:
            claims = verify(secret, credential, scope, now)
        except InvalidToken as exc:
            raise Unauthorized(f"invalid token: {exc}") from None
        return Identity(key=claims.subject, authenticated=True)
    raise Unauthorized("missing API key or token")


__all__ = ["Forbidden", "Identity", "Unauthorized", "authenticate",
           "bearer", "check_origin", "query_token"]
