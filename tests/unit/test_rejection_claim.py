"""A flood refused twice at once (the app's replies pile up unread, and the
server's input budget cuts it off) is counted once: the app's socket and the
budgeted protocol share one claim (``WsTransport.claim_rejection``). The
integration test (test_hardening, the flood closed 1008) asserts one count;
it once saw two."""

from __future__ import annotations

import asyncio
from typing import Any

from rtserver.clock import SYSTEM_CLOCK
from rtserver.config import ServerConfig
from rtserver.server.asgi import AsgiWebSocket
from rtserver.server.http import HttpRequest
from rtserver.server.request_ids import RequestIdMiddleware
from rtserver.server.ws_protocol import budgeted_protocol

REQUEST = HttpRequest(method="GET", path="/v1/stream")


async def _receive() -> dict[str, Any]:
    return {"type": "websocket.disconnect", "code": 1000}


def test_the_app_and_the_protocol_claim_one_refusal_once() -> None:
    floods: list[int] = []
    cls = budgeted_protocol(ServerConfig(), SYSTEM_CLOCK, lambda: floods.append(1))
    proto = cls.__new__(cls)  # uvicorn makes it per connection; only the claim is used here
    proto._rejection_claimed = False
    ws = AsgiWebSocket(_receive, proto.send, REQUEST)
    assert ws.claim_rejection()  # the app counts its refusal first ...
    assert not proto.claim_rejection()  # ... so the budget's cut-off does not count again
    assert not ws.claim_rejection()


def test_the_claim_reaches_the_protocol_under_the_request_id_middleware() -> None:
    """The middleware wraps ``send``; the socket still finds uvicorn's protocol
    under it (for ``abort`` too). Before, it found none and counted twice."""
    cls = budgeted_protocol(ServerConfig(), SYSTEM_CLOCK, lambda: None)
    proto = cls.__new__(cls)
    proto._rejection_claimed = False
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(AsgiWebSocket(receive, send, REQUEST))

    scope = {"type": "websocket", "headers": [], "path": "/v1/stream"}
    asyncio.run(RequestIdMiddleware(app)(scope, _receive, proto.send))
    [ws] = seen
    assert ws.claim_rejection() and not proto.claim_rejection()


def test_another_server_s_socket_always_counts() -> None:
    async def send(message: dict[str, Any]) -> None:
        return None

    ws = AsgiWebSocket(_receive, send, REQUEST)
    assert ws.claim_rejection() and ws.claim_rejection()
