"""SIGTERM to a real server process: a drain with contexts in flight, and
during start-up; both exit 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from rtserver.testing.wait import scaled, wait_until, wait_until_async
from rtserver.tools.bench.server_proc import free_port, http_get, rtserver_command, spawn

pytestmark = pytest.mark.slow


async def test_sigterm_drains_contexts_in_flight_then_exits_0(tmp_path: Path) -> None:
    port = free_port()
    ready = f"http://127.0.0.1:{port}/ready"
    server = spawn(rtserver_command(port, None), port, tmp_path / "server.log",
                   env={**os.environ, "RTSERVER_SERVER_DRAIN_TIMEOUT_S": "20"})
    try:
        async with connect(server.url, compression=None) as ws:
            json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "start", "context": "a"}))
            await ws.send(json.dumps({"type": "text", "context": "a", "text":
                                      "This sentence is spoken to the end while the "
                                      "server drains, "}))
            await ws.send(json.dumps({"type": "flush", "context": "a"}))
            while True:  # the first audio is out: a context in flight
                if isinstance(await asyncio.wait_for(ws.recv(), scaled(30)), bytes):
                    break
            # "a" stays open (no end yet), so the drain cannot finish before the
            # test has seen it refuse a new context
            os.kill(server.pid, signal.SIGTERM)
            await wait_until_async(lambda: http_get(ready)[0] != 200,
                                   "the server takes itself out: /ready no longer 200")
            assert http_get(ready)[0] == 503
            await ws.send(json.dumps({"type": "start", "context": "b"}))
            seen: list[dict[str, object]] = []
            while not any(m["type"] == "error" and m.get("context") == "b" for m in seen):
                msg = await asyncio.wait_for(ws.recv(), scaled(30))
                if isinstance(msg, str):
                    seen.append(json.loads(msg))
            await ws.send(json.dumps({"type": "text", "context": "a",
                                      "text": "and then the server goes away."}))
            await ws.send(json.dumps({"type": "end", "context": "a"}))
            with pytest.raises(ConnectionClosed):
                while True:
                    msg = await asyncio.wait_for(ws.recv(), scaled(30))
                    if isinstance(msg, str):
                        seen.append(json.loads(msg))
            assert ws.close_code == 1001
        assert any(m["type"] == "done" and m["context"] == "a" for m in seen)
        assert any(m["type"] == "error" and m["code"] == "overloaded" and m["context"] == "b"
                   for m in seen)
        assert server.process.wait(scaled(30)) == 0
    finally:
        server.stop()


def test_sigterm_during_start_up_exits_0(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(rtserver_command(port, None), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_until(lambda: b"loading" in log_path.read_bytes() or proc.poll() is not None,
                       "the server logs that it is loading its voices")
            assert proc.poll() is None, log_path.read_text()
            assert http_get(f"http://127.0.0.1:{port}/ready")[0] != 200
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(scaled(60)) == 0
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
    log_text = log_path.read_bytes()
    assert b"stopping during start-up" in log_text  # start-up was cut short, not finished
    assert b"ready on" not in log_text
