"""Limits and failure modes against a real server: rate limits and admission
answers with retry_after_ms, the circuit breaker, a voice that fails or whose
engine dies mid-stream, prompt cancel, drain, Origin and tokens, control
floods, idle connections."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rtserver.client import HandshakeRejected, RtClient
from rtserver.protocol.messages import Cancelled, Done, ErrorMessage, Started
from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import scaled, wait_until_async

from .fault_voice import LEDGER
from .util import http, metric, recv_message, until

FAULTY = "faulty:ok,faulty:die,faulty:dead,faulty:hang"


async def send(ws: ClientConnection, **body: Any) -> None:
    await ws.send(json.dumps(body))


def faulty_server() -> ServerThread:
    return ServerThread.with_settings(
        server={"max_contexts": 8},
        voice={"extra": FAULTY},
        admission={"breaker_failures": 2, "breaker_cooldown_s": 30.0,
                   "breaker_max_cooldown_s": 60.0,
                   # the test voices' rates are odd, and a hanging one never starts
                   "first_heard_target_ms": 0, "starting_per_core": 0}).start()


@pytest.fixture(scope="module")
def faulty() -> Any:
    srv = faulty_server()
    yield srv
    srv.stop()


@pytest.fixture
def broken() -> Any:
    """A server of its own for a test that opens a breaker or kills an engine:
    that state outlives the test (and would meet its own repeat, --count)."""
    srv = faulty_server()
    yield srv
    srv.stop()


# --- rate limits and admission -------------------------------------------------------

async def test_contexts_and_characters_are_rate_limited_with_retry_after() -> None:
    srv = ServerThread.with_settings(
        voice={"extra": "faulty:ok"},
        admission={"contexts_per_minute": 3, "chars_per_minute": 100,
                   "first_heard_target_ms": 0}).start()
    try:
        async with connect(srv.url, compression=None) as ws:
            await recv_message(ws)
            for name in ("a", "b", "c"):
                await send(ws, type="start", context=name, voice="faulty:ok")
                assert isinstance(await until(ws, (Started, ErrorMessage)), Started)
            await send(ws, type="start", context="d", voice="faulty:ok")
            err = await until(ws, ErrorMessage)
            assert err.code == "rate_limited" and err.context == "d"
            assert 0 < err.retry_after_ms <= 20_000  # a context every 20 s
            await send(ws, type="text", context="a", text="x" * 80)
            await send(ws, type="text", context="a", text="y" * 50)
            err = await until(ws, ErrorMessage)
            assert err.code == "rate_limited" and err.context == "a"
            assert 0 < err.retry_after_ms <= 30_000  # 30 short at 100 a minute
            await send(ws, type="cancel", context="a")  # the context goes on
            assert (await until(ws, Cancelled)).context == "a"
        assert metric(srv, "rtserver_rejected_total", reason="rate_limited") >= 2
    finally:
        srv.stop()


async def test_admission_refuses_when_first_heard_audio_would_miss_the_target() -> None:
    srv = ServerThread.with_settings(admission={"first_heard_target_ms": 1.0}).start()
    try:
        async with connect(srv.url, compression=None) as ws:
            await recv_message(ws)
            # nothing measured yet: admitted (no ground to refuse on)
            await send(ws, type="start", context="first")
            await send(ws, type="text", context="first", text="Measure me first.")
            await send(ws, type="end", context="first")
            assert isinstance(await until(ws, (Done, ErrorMessage)), Done)
            # measured now: no context can be heard within 1 ms
            await send(ws, type="start", context="a")
            err = await until(ws, ErrorMessage)
            assert err.code == "overloaded" and err.context == "a"
            assert err.retry_after_ms >= 250
            await send(ws, type="end", context="a")  # it was never opened
            assert (await until(ws, ErrorMessage)).code == "unknown_context"
        assert metric(srv, "rtserver_rejected_total", reason="overloaded") >= 1
    finally:
        srv.stop()


# --- faults, the breaker, engine death ------------------------------------------------

async def test_a_voice_fault_fails_only_its_context_and_opens_the_breaker(
        broken: ServerThread) -> None:
    async with connect(broken.url, compression=None) as ws:
        await recv_message(ws)
        await send(ws, type="start", context="good", voice="faulty:ok")
        await send(ws, type="text", context="good", text="Speak a while please.")
        for i in range(2):
            await send(ws, type="start", context=f"bad{i}", voice="faulty:die")
            await send(ws, type="text", context=f"bad{i}", text="This one fails.")
            await send(ws, type="end", context=f"bad{i}")
            err = await until(ws, ErrorMessage)
            assert err.code == "engine_failed" and err.context == f"bad{i}"
        # two failures in a row: the breaker is open, the next start fails fast
        await send(ws, type="start", context="bad2", voice="faulty:die")
        err = await until(ws, (ErrorMessage, Started))
        assert isinstance(err, ErrorMessage) and err.code == "engine_failed"
        assert 0 < err.retry_after_ms <= 30_000
        assert metric(broken, "rtserver_engine_up", voice="faulty:die") == 0
        assert metric(broken, "rtserver_engine_up", voice="faulty:ok") == 1
        assert http(broken.http + "/ready")[0] == 503
        # the good context on the same connection was never touched
        await send(ws, type="end", context="good")
        done = await until(ws, (Done, ErrorMessage), context="good")
        assert isinstance(done, Done) and done.frames > 0


async def test_an_engine_that_dies_fails_its_contexts_and_ready_goes_503(
        broken: ServerThread) -> None:
    async with connect(broken.url, compression=None) as ws:
        await recv_message(ws)
        await send(ws, type="start", context="ok", voice="faulty:ok")
        await send(ws, type="start", context="dies", voice="faulty:dead")
        await send(ws, type="text", context="dies", text="Going down.")
        await send(ws, type="end", context="dies")
        err = await until(ws, ErrorMessage)
        assert err.code == "engine_failed" and err.context == "dies"
        await send(ws, type="start", context="again", voice="faulty:dead")
        err = await until(ws, ErrorMessage)
        assert err.code == "engine_failed" and "down" in err.message
        assert metric(broken, "rtserver_engine_up", voice="faulty:dead") == 0
        assert http(broken.http + "/ready")[0] == 503
        await send(ws, type="text", context="ok", text="Still here.")
        await send(ws, type="end", context="ok")
        done = await until(ws, (Done, ErrorMessage), context="ok")
        assert isinstance(done, Done)


async def test_cancel_closes_the_voice_at_once(faulty: ServerThread) -> None:
    async with connect(faulty.url, compression=None) as ws:
        await recv_message(ws)
        for i in range(10):
            name = f"c{i}"
            voice = "faulty:hang" if i % 2 else "faulty:ok"
            await send(ws, type="start", context=name, voice=voice)
            await send(ws, type="text", context=name, text="Cancel me soon.")
            await send(ws, type="flush", context=name)
            while not isinstance(await asyncio.wait_for(ws.recv(), 10), bytes):
                pass  # until its first frame
            await asyncio.sleep(0.01 * i)
            await send(ws, type="cancel", context=name)
            await until(ws, Cancelled)
            # the voice's generator was closed before `cancelled` was sent
            assert faulty.call(lambda: LEDGER.open) == 0


async def test_abrupt_disconnects_leave_nothing_behind(faulty: ServerThread) -> None:
    for _ in range(20):
        ws = await connect(faulty.url, compression=None)
        await recv_message(ws)
        await send(ws, type="start", context="x", voice="faulty:hang")
        await send(ws, type="text", context="x", text="Drop me.")
        await send(ws, type="flush", context="x")
        while not isinstance(await asyncio.wait_for(ws.recv(), 10), bytes):
            pass
        ws.transport.abort()  # no close frame: a TCP reset
    # the server notices the resets: every voice generator closed, nothing counted
    await wait_until_async(lambda: faulty.call(lambda: LEDGER.open) == 0
                           and metric(faulty, "rtserver_active_contexts") == 0
                           and metric(faulty, "rtserver_active_connections") == 0,
                           "the 20 dropped connections are gone from the server")


async def test_a_burst_of_starts_is_let_in_a_few_at_a_time_the_rest_told_when() -> None:
    # one context may be starting at a time (0.9 per core rounds up to 1 on any machine)
    srv = ServerThread.with_settings(
        admission={"starting_per_core": 0.9 / (os.cpu_count() or 1)}).start()
    try:
        async with connect(srv.url, compression=None) as ws:
            await recv_message(ws)
            for name in ("a", "b", "c"):  # a burst: three starts at once
                await send(ws, type="start", context=name)
            assert (await until(ws, Started)).context == "a"
            refused = [await until(ws, ErrorMessage, context=name) for name in ("b", "c")]
            assert all(e.code == "overloaded" and e.retry_after_ms and e.retry_after_ms > 0
                       for e in refused), refused
            await send(ws, type="text", context="a", text="First in.")
            await send(ws, type="end", context="a")
            assert isinstance(await until(ws, Done, context="a"), Done)
            # its first audio is out: the next start is let in
            await send(ws, type="start", context="b")
            assert (await until(ws, (Started, ErrorMessage), context="b")).type == "started"
        assert metric(srv, "rtserver_rejected_total", reason="overloaded") == 2
    finally:
        srv.stop()


# --- connection limits ----------------------------------------------------------------

async def test_a_client_that_floods_without_reading_is_closed_1008() -> None:
    srv = ServerThread.with_settings(server={"max_queued_messages": 32,
                                             "socket_send_buffer": 4096}).start()
    try:
        async with connect(srv.url, compression=None, max_queue=1) as ws:
            await recv_message(ws)
            try:
                for _ in range(200_000):  # never reads its errors
                    await asyncio.wait_for(ws.send("not json"), 5)
            except (ConnectionClosed, TimeoutError):
                pass
            with pytest.raises(ConnectionClosed):
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code in (1008, 1006)
        assert metric(srv, "rtserver_rejected_total", reason="control_flood") == 1
        async with RtClient.connect(srv.url) as other:  # the server serves on
            assert (await other.say("Fine.")).ok
    finally:
        srv.stop()


async def test_an_idle_connection_is_closed() -> None:
    srv = ServerThread.with_settings(server={"idle_timeout_s": 0.5}).start()
    try:
        async with connect(srv.url, compression=None) as ws:
            await recv_message(ws)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code == 1000 and ws.close_reason == "idle"
    finally:
        srv.stop()


async def test_drain_refuses_starts_finishes_contexts_and_closes_1001() -> None:
    srv = ServerThread.with_settings(voice={"extra": "faulty:ok"},
                                     server={"drain_timeout_s": 20.0},
                                     admission={"first_heard_target_ms": 0}).start()
    stopped = False
    try:
        async with connect(srv.url, compression=None) as ws:
            await recv_message(ws)
            await send(ws, type="start", context="a", voice="faulty:ok")
            await send(ws, type="text", context="a", text="Finish me during the drain.")
            assert (await until(ws, Started)).context == "a"
            assert srv.server is not None
            # "a" stays open (no end yet): the drain cannot finish before "b" is refused
            draining = srv.submit(srv.server.drain())
            await wait_until_async(lambda: http(srv.http + "/ready")[0] != 200,
                                   "/ready no longer 200 once draining")
            assert http(srv.http + "/ready")[0] == 503
            await send(ws, type="start", context="b", voice="faulty:ok")
            err = await until(ws, ErrorMessage)
            assert err.code == "overloaded" and err.context == "b"
            await send(ws, type="end", context="a")
            done = await until(ws, Done)
            assert done.context == "a" and done.frames > 0
            with pytest.raises(ConnectionClosed):
                while True:
                    await asyncio.wait_for(ws.recv(), scaled(10))
            assert ws.close_code == 1001
        await asyncio.wrap_future(draining)
        with pytest.raises((HandshakeRejected, OSError, InvalidStatus)):
            async with connect(srv.url, compression=None, open_timeout=2):
                pass
        stopped = True
    finally:
        if not stopped:
            srv.stop()
