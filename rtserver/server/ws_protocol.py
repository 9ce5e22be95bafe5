"""uvicorn's WebSocket protocol (websockets' sans-I/O ``ServerProtocol``) with
an input budget per connection, checked before anything is parsed.

uvicorn parses every byte a read returns (up to 256 KiB: thousands of small
frames in one callback) and, once the app closes, keeps reading and parsing
until the peer answers the close. A client that floods without reading thus
took the event loop for seconds. Here each connection's bytes pass
``admission.InputBudget`` first: only what the budget allows is handed to
the parser, the rest is held and the socket's reading paused (TCP pushes
back on the client) until the budget refills; the frames parsed are counted
against the message budget. A connection held over its budget for
``server.flood_after_s`` is cut off at once: counted (``on_flood``: a
``control_flood`` refusal), its queued messages dropped, the app's next
``receive`` a 1008 disconnect, a 1008 close frame written and the TCP
connection closed without waiting for the peer (dropped if it has unread
data).

The budget's time is the server's injected clock; the timers that resume a
held connection are the event loop's (relative delays computed from it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame

from rtserver.clock import Clock
from rtserver.config import ServerConfig
from rtserver.errors import ControlFlood
from rtserver.server import tcp
from rtserver.server.admission import InputBudget

log = logging.getLogger("rtserver.connection")

# Bytes parsed in one callback: one read (up to 256 KiB, thousands of small
# frames) is parsed in steps, with the loop's other work between them.
PARSE_STEP_BYTES = 4096


def budgeted_protocol(config: ServerConfig, clock: Clock,
                      on_flood: Callable[[], None]) -> type[WebSocketsSansIOProtocol]:
    """The protocol class uvicorn makes per WebSocket (``ws=``), with these
    limits; ``on_flood`` is called for each connection cut off (not for one
    the app was already closing, or had refused itself: it counted its own
    reason; ``claim_rejection``, which the app's ``AsgiWebSocket`` shares)."""

    class BudgetedWebSocketProtocol(WebSocketsSansIOProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._budget = InputBudget(config.input_bytes_per_s, config.input_byte_burst,
                                       config.messages_per_s, config.message_burst,
                                       config.flood_after_s, clock.now())
            self._held = bytearray()  # bytes received, not yet parsed
            self._holding = False  # reading paused by the budget
            self._timer: asyncio.Handle | None = None
            self._frames = 0
            self._cut = False
            self._first: float | None = None  # when its first message's bytes came
            self._rejection_claimed = False  # its refusal was counted (here or by the app)

        def claim_rejection(self) -> bool:
            """True the first time (``WsTransport.claim_rejection``)."""
            first = not self._rejection_claimed
            self._rejection_claimed = True
            return first

        # --- input: the budget first ------------------------------------------

        def data_received(self, data: bytes) -> None:
            if self._cut:
                return
            if not self.handshake_complete:  # the upgrade request: uvicorn's own limits
                super().data_received(data)
                return
            if self._first is None:
                self._first = clock.now()
            self._held += data
            if self._timer is None:
                self._pump()
            else:  # held: uvicorn resumed reading for its own reasons
                self.transport.pause_reading()

        def _pump(self) -> None:
            """Parse what the budget allows of the held bytes; hold the rest
            (reading paused) until it refills; cut off a flood."""
            now = clock.now()
            try:
                allowed = min(self._budget.allowed_bytes(now), PARSE_STEP_BYTES)
                if self._held and allowed > 0:
                    chunk = bytes(self._held[:allowed])
                    del self._held[:allowed]
                    before = self._frames
                    super().data_received(chunk)
                    self._budget.spend(len(chunk), self._frames - before, now)
                wait = self._budget.wait_s(now)
            except ControlFlood as err:
                self._cut_off(err.message)
                return
            if self._cut or self.transport.is_closing():
                return
            if wait > 0 or self._held:
                if not self._holding:
                    self._holding = True
                    self.transport.pause_reading()
                # within budget: the next step after the loop's other callbacks
                self._timer = (self.loop.call_later(wait, self._release) if wait > 0
                               else self.loop.call_soon(self._release))
            elif self._holding:
                self._holding = False
                if not self.read_paused:  # uvicorn's own pause: until the app reads
                    self.transport.resume_reading()

        def _release(self) -> None:
            self._timer = None
            if not self._cut and not self.transport.is_closing():
                self._pump()

        async def receive(self) -> Any:
            # uvicorn's, except that a connection the budget holds stays paused
            message = await self.queue.get()
            if self.read_paused and self.queue.empty():
                self.read_paused = False
                if not self._holding and not self._cut:
                    self.transport.resume_reading()
            return message

        def _cut_off(self, reason: str) -> None:
            since = clock.now() - (self._first if self._first is not None else clock.now())
            log.warning("flood cut off: %s:%s after %.3f s of input (%d messages)",
                        *(self.client or ("?", 0)), since, self._frames)
            if not self.close_sent and self.claim_rejection():
                on_flood()
            self._cut = True
            self._held.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            while not self.queue.empty():  # a flood's messages are not worth answering
                self.queue.get_nowait()
            self.queue.put_nowait({"type": "websocket.disconnect", "code": 1008,
                                   "reason": reason[:120]})
            self.close_sent = True
            if not self.transport.is_closing():
                self.conn.fail(1008, reason[:120])
                self.transport.write(b"".join(self.conn.data_to_send()))
                if self.transport.get_write_buffer_size() > 0:
                    tcp.reset(self.transport)  # it reads nothing: no waiting on it
                else:
                    self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

        # --- counting frames (every kind a client can send) -------------------

        def handle_text(self, event: Frame) -> None:
            self._frames += 1
            super().handle_text(event)

        def handle_bytes(self, event: Frame) -> None:
            self._frames += 1
            super().handle_bytes(event)

        def handle_cont(self, event: Frame) -> None:
            self._frames += 1
            super().handle_cont(event)

        def handle_ping(self) -> None:
            self._frames += 1
            super().handle_ping()

        def handle_pong(self, event: Frame) -> None:
            self._frames += 1
            super().handle_pong(event)

    return BudgetedWebSocketProtocol


__all__ = ["PARSE_STEP_BYTES", "budgeted_protocol"]
