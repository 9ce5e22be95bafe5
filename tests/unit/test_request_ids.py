"""Request ids: the ASGI middleware around a bare ASGI app (as it would wrap a
Starlette one), the log lines that carry them, and ``start.request_id``."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from typing import Any

import pytest

from rtserver.logs import REQUEST_ID, handler, request_scope
from rtserver.protocol.messages import ErrorMessage, Start, parse_client_message
from rtserver.protocol.session import Reply, Session, SessionLimits
from rtserver.server.request_ids import RequestIdMiddleware

Message = dict[str, Any]


def run_app(app: Any, scope: dict[str, Any]) -> list[Message]:
    """Call the ASGI ``app`` once; the messages it sent."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(dict(message))

    asyncio.run(app(scope, receive, send))
    return sent


def http_scope(headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": "/", "headers": list(headers or [])}


def responder(status: int, body: bytes, content_type: bytes = b"application/json",
              seen: list[str | None] | None = None) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if seen is not None:
            seen.append(REQUEST_ID.get())
            seen.append(scope["state"]["request_id"])
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return app


def header(message: Message, name: bytes) -> str | None:
    values = [v.decode() for k, v in message["headers"] if k.lower() == name]
    assert len(values) <= 1
    return values[0] if values else None


def test_the_clients_id_is_echoed_and_seen_by_the_app_and_its_logs() -> None:
    seen: list[str | None] = []
    sent = run_app(RequestIdMiddleware(responder(200, b"{}", seen=seen)),
                   http_scope([(b"x-request-id", b"llm-call-42")]))
    assert header(sent[0], b"x-request-id") == "llm-call-42"
    assert seen == ["llm-call-42", "llm-call-42"]
    assert REQUEST_ID.get() is None  # reset after the request


@pytest.mark.parametrize("given", [None, b"has space", b"x" * 129, b"caf\xc3\xa9"])
def test_a_missing_or_invalid_id_is_replaced_by_a_new_one(given: bytes | None) -> None:
    headers = [(b"x-request-id", given)] if given is not None else []
    sent = run_app(RequestIdMiddleware(responder(200, b"{}")), http_scope(headers))
    rid = header(sent[0], b"x-request-id")
    assert rid is not None and len(rid) == 32 and rid.isalnum()
    assert given is None or rid != given.decode("latin-1")


def test_json_error_bodies_carry_the_id_and_their_length_is_fixed() -> None:
    body = json.dumps({"error": {"message": "bad", "code": "bad_message"}}).encode()
    sent = run_app(RequestIdMiddleware(responder(400, body)),
                   http_scope([(b"x-request-id", b"r-1")]))
    start, out = sent
    got = json.loads(out["body"])
    assert got["request_id"] == "r-1" and got["error"]["request_id"] == "r-1"
    assert got["error"]["message"] == "bad"
    assert header(start, b"content-length") == str(len(out["body"]))


def test_success_and_non_json_bodies_pass_unchanged() -> None:
    ok = run_app(RequestIdMiddleware(responder(200, b'{"a": 1}')), http_scope())
    assert ok[1]["body"] == b'{"a": 1}'
    text = run_app(RequestIdMiddleware(responder(503, b"not ready\n", b"text/plain")),
                   http_scope())
    assert text[1]["body"] == b"not ready\n"
    assert header(text[0], b"x-request-id") is not None


def test_the_websocket_handshake_echoes_the_id() -> None:
    async def ws_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "websocket.accept"})

    sent = run_app(RequestIdMiddleware(ws_app),
                   {"type": "websocket", "path": "/v1/stream",
                    "headers": [(b"x-request-id", b"ws-7")]})
    assert sent[0]["type"] == "websocket.accept"
    assert header(sent[0], b"x-request-id") == "ws-7"


def test_log_lines_carry_the_request_id_as_text_and_json() -> None:
    log = logging.getLogger("rtserver.test_request_ids")
    log.setLevel(logging.INFO)
    text, js = io.StringIO(), io.StringIO()
    handlers = [handler("text", text), handler("json", js)]
    for h in handlers:
        log.addHandler(h)
    try:
        with request_scope("abc-123"):
            log.info("inside %s", "a request")
        log.info("outside")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    finally:
        for h in handlers:
            log.removeHandler(h)
    lines = text.getvalue().splitlines()
    assert "[abc-123]: inside a request" in lines[0] and "[-]: outside" in lines[1]
    records = [json.loads(line) for line in js.getvalue().splitlines()]
    assert records[0]["request_id"] == "abc-123" and records[0]["message"] == "inside a request"
    assert records[0]["level"] == "INFO" and records[0]["logger"] == log.name
    assert records[1]["request_id"] == "-"
    assert "ValueError: boom" in records[2]["exc"]


def test_start_takes_a_valid_request_id_and_refuses_a_bad_one() -> None:
    start = parse_client_message(json.dumps({"type": "start", "context": "a",
                                             "request_id": "turn-9"}))
    assert isinstance(start, Start) and start.request_id == "turn-9"
    session = Session(SessionLimits(max_text_chars=100, max_contexts=1), voices=["v"],
                      default_voice="v")
    (reply,) = session.receive_text(json.dumps({"type": "start", "context": "a",
                                                "request_id": "bad id"}))
    assert isinstance(reply, Reply) and isinstance(reply.message, ErrorMessage)
    assert reply.message.code == "bad_message" and "request_id" in reply.message.message


def test_a_refused_start_echoes_its_request_id() -> None:
    session = Session(SessionLimits(max_text_chars=100, max_contexts=1), voices=["v"],
                      default_voice="v")
    (reply,) = session.receive_text(json.dumps({"type": "start", "context": "a",
                                                "voice": "nope", "request_id": "turn-1"}))
    assert isinstance(reply, Reply) and isinstance(reply.message, ErrorMessage)
    assert reply.message.code == "unknown_voice" and reply.message.request_id == "turn-1"


def test_the_log_format_is_text_or_json() -> None:
    from rtserver.config import load_config
    from rtserver.errors import ConfigError

    assert load_config(env={"RTSERVER_SERVER_LOG_FORMAT": "json"}).server.log_format == "json"
    with pytest.raises(ConfigError, match=r"server\.log_format"):
        load_config(env={}, flags={"server.log_format": "xml"})
