"""The client's own errors; ``ProtocolViolation`` and its kin come from
``rtserver.errors`` (the protocol parser raises them too)."""

from __future__ import annotations

from rtserver.errors import RtClientError
from rtserver.protocol.messages import ErrorMessage


class ServerError(RtClientError):
    """The server answered a request with `error`."""

    def __init__(self, error: ErrorMessage) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error


class ConnectionLost(RtClientError):
    """The connection closed while a context was still open."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"connection closed (code {code}{': ' + reason if reason else ''})")
        self.code = code
        self.reason = reason


class HandshakeRejected(RtClientError):
    """The server refused the WebSocket handshake (401 for a wrong API key)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"handshake rejected with HTTP {status}")
        self.status = status


__all__ = [
    "ConnectionLost",
    "HandshakeRejected",
    "ServerError",
]
