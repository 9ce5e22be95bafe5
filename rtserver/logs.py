"""Logging: the request id of every line, and text or JSON lines.

``REQUEST_ID`` is a context variable: the HTTP request or WebSocket
connection sets it (``rtserver.server.request_ids``), a WebSocket context
sets its own for the tasks it starts (asyncio tasks copy the variables of
the task that creates them, ``asyncio.to_thread`` too), and
``RequestIdFilter``, on the handler ``setup_logging`` installs, writes it
into every record as ``request_id`` ("-" outside any request). Nothing here
configures logging at import: ``setup_logging`` is called once by the
command line.

Formats (``[server] log_format``): ``text``, one line per record with
``[request_id]`` after the logger's name; ``json``, one JSON object per line
(``ts``, ``level``, ``logger``, ``message``, ``request_id``, and ``exc``
with the traceback when there is one), for log collectors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TextIO

REQUEST_ID: ContextVar[str | None] = ContextVar("rtserver_request_id", default=None)
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def new_request_id() -> str:
    """A fresh id (32 hex digits) for a request that came without one."""
    return uuid.uuid4().hex


def current_request_id() -> str | None:
    return REQUEST_ID.get()


@contextlib.contextmanager
def request_scope(request_id: str | None) -> Iterator[None]:
    """``REQUEST_ID`` is ``request_id`` inside the block (and in the tasks
    created in it), what it was after."""
    token = REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        REQUEST_ID.reset(token)


class RequestIdFilter(logging.Filter):
    """Puts the current request id on every record (``record.request_id``);
    an id already on the record (``extra={"request_id": ...}``) is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get() or "-"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record (UTF-8 text, one line)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or REQUEST_ID.get() or "-",
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


def handler(fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """A stream handler in ``fmt`` (``text`` or ``json``) with the request id filter."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(LOG_FORMATS)}")
    out = logging.StreamHandler(stream or sys.stderr)
    out.addFilter(RequestIdFilter())
    out.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    return out


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """The root logger at ``level``, writing to stderr in ``fmt`` (replaces
    the root's handlers: the command line calls it once per process)."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler(fmt))
    root.setLevel(level.upper())


__all__ = ["LOG_FORMATS", "REQUEST_ID", "JsonFormatter", "RequestIdFilter",
           "current_request_id", "handler", "new_request_id", "request_scope",
           "setup_logging"]
