"""Request ids end to end on a real server: ``X-Request-Id`` over HTTP (echoed,
in error bodies, in the log lines of the speech it makes) and over the
WebSocket (the connection's in ``ready``, each context's in its ``started``,
``done`` and errors, and in its log lines)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from rtserver.logs import handler
from rtserver.protocol.messages import (
    Cancelled,
    Done,
    ErrorMessage,
    Ready,
    Started,
    parse_server_message,
)
from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import wait_until
from tests.integration.util import http, until


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The server's log lines as JSON (the server runs in this process)."""
    out = io.StringIO()
    h = handler("json", out)
    log = logging.getLogger("rtserver")
    level = log.level
    log.addHandler(h)
    log.setLevel(logging.INFO)
    yield out
    log.removeHandler(h)
    log.setLevel(level)


def records(out: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_http_echoes_the_id_and_puts_it_in_error_bodies(server: ServerThread) -> None:
    status, headers, _ = http(server.http + "/ready", headers={"X-Request-Id": "probe-1"})
    assert status == 200 and headers["x-request-id"] == "probe-1"
    status, headers, _ = http(server.http + "/health")
    made = headers["x-request-id"]
    assert status == 200 and len(made) == 32  # made when the client sent none
    status, headers, body = http(server.http + "/v1/audio/speech", method="POST",
                                 headers={"X-Request-Id": "bad-call-7",
                                          "Content-Type": "application/json"},
                                 body=b"{not json")
    assert status == 400 and headers["x-request-id"] == "bad-call-7"
    err = json.loads(body)
    assert err["request_id"] == "bad-call-7" and err["error"]["request_id"] == "bad-call-7"
    assert int(headers["content-length"]) == len(body)


def test_an_http_speech_requests_log_lines_carry_its_id(
        server: ServerThread, json_log: io.StringIO) -> None:
    status, headers, body = http(server.http + "/v1/audio/speech", method="POST",
                                 headers={"X-Request-Id": "speech-3",
                                          "Content-Type": "application/json"},
                                 body=json.dumps({"model": "tts-1", "voice": "default",
                                                  "input": "Hello there.",
                                                  "response_format": "pcm"}).encode())
    assert status == 200 and headers["x-request-id"] == "speech-3" and body
    wait_until(lambda: any(r["request_id"] == "speech-3" and r["message"].startswith("context")
                           for r in records(json_log)),
               "the context's summary line, with the request's id")


async def test_websocket_ids_in_messages_and_log_lines(
        server: ServerThread, json_log: io.StringIO) -> None:
    async with connect(server.url, compression=None,
                       additional_headers={"X-Request-Id": "conn-5"}) as ws:
        assert ws.response is not None
        assert ws.response.headers["X-Request-Id"] == "conn-5"
        ready = parse_server_message(await ws.recv())
        assert isinstance(ready, Ready) and ready.request_id == "conn-5"
        # the client's id for a context, e.g. its LLM call's
        await ws.send(json.dumps({"type": "start", "context": "a", "request_id": "llm-91"}))
        await ws.send(json.dumps({"type": "text", "context": "a", "text": "Hi there."}))
        await ws.send(json.dumps({"type": "end", "context": "a"}))
        started = await until(ws, Started, context="a")
        done = await until(ws, Done, context="a")
        assert started.request_id == done.request_id == "llm-91"
        await ws.send(json.dumps({"type": "cancel", "context": "a"}))  # late: after done
        assert (await until(ws, Cancelled, context="a")).request_id == "llm-91"
        # none given: one made from the connection's
        await ws.send(json.dumps({"type": "start", "context": "b"}))
        made = (await until(ws, Started, context="b")).request_id
        assert made == "conn-5-2"
        await ws.send(json.dumps({"type": "cancel", "context": "b"}))
        assert (await until(ws, Cancelled, context="b")).request_id == "conn-5-2"
        # errors: a refused start echoes its id; a bad message the connection's
        await ws.send(json.dumps({"type": "start", "context": "c", "voice": "nope",
                                  "request_id": "llm-92"}))
        refused = await until(ws, ErrorMessage, context="c")
        assert refused.code == "unknown_voice" and refused.request_id == "llm-92"
        await ws.send("not json")
        bad = await until(ws, ErrorMessage)
        assert bad.code == "bad_message" and bad.request_id == "conn-5"
    wait_until(lambda: any(r["request_id"] == "llm-91" and r["message"].startswith("context done")
                           for r in records(json_log)),
               "context a's summary line, with its id")


async def test_serve_log_format_json_writes_json_lines_with_ids(tmp_path: Path) -> None:
    """``rtserver serve --log-format json``: its log lines are JSON objects,
    and a context's summary line carries the context's request id."""
    from rtserver.tools.bench.server_proc import free_port, rtserver_command, spawn

    port = free_port()
    log_path = tmp_path / "server.log"
    server = spawn(rtserver_command(port, None, ["--log-format", "json"]), port, log_path)
    try:
        async with connect(server.url, compression=None) as ws:
            await ws.recv()  # ready
            await ws.send(json.dumps({"type": "start", "context": "a", "request_id": "j-1"}))
            await ws.send(json.dumps({"type": "text", "context": "a", "text": "Hi."}))
            await ws.send(json.dumps({"type": "end", "context": "a"}))
            await until(ws, Done, context="a")

        def summary() -> dict[str, str] | None:
            lines = [json.loads(line) for line in log_path.read_text().splitlines()
                     if line.startswith("{")]
            return next((r for r in lines if r["message"].startswith("context done")), None)

        line = wait_until(summary, "the context's summary line in the log")
        assert line["request_id"] == "j-1" and line["logger"] == "rtserver.context"
        assert line["level"] == "INFO" and line["ts"].endswith("+00:00")
    finally:
        server.stop()
