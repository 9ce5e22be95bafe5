"""The seam between a WebSocket connection's logic and the server library.

``Connection`` talks to its socket only through ``WsTransport``; the ASGI
shell's ``AsgiWebSocket`` is the one in use. A peer that is gone raises
websockets' ``ConnectionClosed`` from ``recv`` and ``send``.
"""

from __future__ import annotations

from typing import Protocol


class WsTransport(Protocol):
    async def recv(self) -> str | bytes:
        """The next message (text or binary); raises when the peer is gone."""
        ...

    async def send(self, data: str | bytes) -> None:
        """Send one message; waits while the client does not read (backpressure)."""
        ...

    async def close(self, code: int = 1000, reason: str = "", last: str | None = None) -> None:
        """Close with ``code``, the text message ``last`` (if any) sent just
        before the close frame, both behind what is already sent; a peer that
        reads neither in a bounded time is cut off. A no-op once closed."""
        ...

    def claim_rejection(self) -> bool:
        """True the first time this connection's refusal is to be counted: a
        flood can be refused twice at once, by the app (its replies pile up
        unread) and by the server's input budget, and counts once."""
        ...
