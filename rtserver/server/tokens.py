"""API keys and short-lived signed browser tokens, pure (``now`` is passed in).

A browser must not hold an API key. A backend that has one asks
``POST /v1/tokens`` for a token (HMAC-SHA256 over its claims: the key's id,
a scope, an expiry) and hands it to the page, which opens the WebSocket with
``?token=...``. The server verifies the signature and the expiry; the token
counts against the rate limits of the key that minted it.

Format: ``rt1.<base64url(claims JSON)>.<base64url(HMAC-SHA256(secret,
"rt1." + claims part))>``. Every comparison of secret material uses
``hmac.compare_digest``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

PREFIX = "rt1."
SCOPE_STREAM = "stream"  # the WebSocket /v1/stream
SCOPES = (SCOPE_STREAM, "speech")  # "speech": the HTTP speech endpoint
MAX_TOKEN_CHARS = 1024


class InvalidToken(Exception):
    """A token that is malformed, forged, expired or of another scope."""


@dataclass(frozen=True, slots=True)
class Claims:
    subject: str  # the id of the API key that minted it
    scopes: tuple[str, ...]
    expires_at: float  # seconds, the server clock's epoch (wall time)


def key_id(key: str) -> str:
    """A short, stable name for an API key (for rate limits and logs; the key
    itself is never logged or put in a token)."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:12]


def match_key(supplied: str, keys: Sequence[str]) -> str | None:
    """The API key ``supplied`` equals, compared in constant time against
    every key (no early exit), or None."""
    found: str | None = None
    given = supplied.encode()
    for key in keys:
        if hmac.compare_digest(given, key.encode()):
            found = key
    return found


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: bytes, body: str) -> str:
    return _b64(hmac.new(secret, (PREFIX + body).encode(), hashlib.sha256).digest())


def mint(secret: bytes, subject: str, scopes: Sequence[str], ttl_s: float,
         now: float) -> tuple[str, Claims]:
    """A token for ``subject`` valid for ``ttl_s`` from ``now``."""
    if not secret:
        raise ValueError("an empty secret signs nothing")
    for scope in scopes:
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}")
    claims = Claims(subject=subject, scopes=tuple(scopes), expires_at=math.floor(now + ttl_s))
    body = _b64(json.dumps({"sub": claims.subject, "scp": list(claims.scopes),
                            "exp": claims.expires_at}, separators=(",", ":")).encode())
    return f"{PREFIX}{body}.{_sign(secret, body)}", claims


def verify(secret: bytes, token: str, scope: str, now: float) -> Claims:
    """The token's claims, or ``InvalidToken`` saying why not."""
    if len(token) > MAX_TOKEN_CHARS or not token.startswith(PREFIX):
        raise InvalidToken("not a token")
    body, dot, signature = token[len(PREFIX):].partition(".")
    if not dot:
        raise InvalidToken("not a token")
    if not hmac.compare_digest(signature.encode(), _sign(secret, body).encode()):
        raise InvalidToken("bad signature")
    try:
        raw = json.loads(_unb64(body))
        claims = Claims(subject=str(raw["sub"]), scopes=tuple(str(s) for s in raw["scp"]),
                        expires_at=float(raw["exp"]))
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise InvalidToken("malformed claims") from None
    if not now < claims.expires_at:
        raise InvalidToken("expired")
    if scope not in claims.scopes:
        raise InvalidToken(f"not valid for {scope}")
    return claims


__all__ = ["SCOPES", "SCOPE_STREAM", "Claims", "InvalidToken", "key_id", "match_key", "mint",
           "verify"]
