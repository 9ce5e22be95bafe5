"""Helpers for integration tests: plain HTTP, /metrics values, and server
messages read off a raw WebSocket through ``rtserver.protocol``."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.error
import urllib.request
from typing import TypeVar

from websockets.asyncio.client import ClientConnection

from rtserver.protocol.messages import ServerMessage, parse_server_message
from rtserver.testing.server_thread import ServerThread

M = TypeVar("M")


def http(url: str, method: str = "GET", headers: dict[str, str] | None = None,
         body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=body)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def metric(srv: ServerThread, name: str, **labels: str) -> float:
    _, _, body = http(srv.http + "/metrics")
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" (\S+)"
    m = re.search("^" + pattern + "$", body.decode(), re.M)
    return float(m.group(1)) if m else 0.0


async def recv_message(ws: ClientConnection, limit_s: float = 20.0) -> ServerMessage:
    """The next text frame, parsed and validated by the protocol (binary
    frames are skipped); a malformed message fails the test."""
    while True:
        data = await asyncio.wait_for(ws.recv(), limit_s)
        if isinstance(data, str):
            return parse_server_message(data)


async def until(ws: ClientConnection, kind: type[M] | tuple[type[M], ...], *,
                context: str | None = None, limit_s: float = 30.0) -> M:
    """The next server message of ``kind`` (for ``context``, if given), skipping others."""
    deadline = time.monotonic() + limit_s
    while True:
        message = await recv_message(ws, max(0.1, deadline - time.monotonic()))
        if isinstance(message, kind) and (context is None or getattr(
                message, "context", None) == context):
            return message
