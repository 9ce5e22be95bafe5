"""Sending on zmq.asyncio sockets without waiting (both sides of the link)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, cast


def sent_now(sent: Awaitable[Any]) -> None:
    """Raise what a ``DONTWAIT`` send of a zmq.asyncio socket raised
    (``zmq.Again``, ``ZMQError``), or return: pyzmq tries such a send at once
    and hands back a finished future (``zmq/_future.py``, ``_add_send_event``)."""
    cast("asyncio.Future[Any]", sent).result()


__all__ = ["sent_now"]
