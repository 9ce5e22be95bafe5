"""Listeners' ``played`` over the WebSocket (real Piper voice) feed the
server's time-to-first-heard histogram, also when they come after ``done``."""

from __future__ import annotations

import time
import urllib.request

import pytest

from rtserver.client import AudioFrames, RtClient, ServerError
from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import wait_until_async

METRIC = "rtserver_time_to_first_heard_seconds"
VOICE = "piper:en_US-joe-medium"


def heard_metric(server: ServerThread) -> tuple[float, float]:
    """(count, sum) of the histogram for the embedded voice."""
    with urllib.request.urlopen(server.http + "/metrics", timeout=10) as resp:
        body = resp.read().decode()
    values = {"count": 0.0, "sum": 0.0}
    for line in body.splitlines():
        for part in values:
            if line.startswith(f'{METRIC}_{part}{{voice="{VOICE}"}}'):
                values[part] = float(line.split()[-1])
    return values["count"], values["sum"]


async def test_a_listeners_first_played_is_its_time_to_first_heard_audio(
        server: ServerThread) -> None:
    count0, sum0 = heard_metric(server)
    async with RtClient.connect(server.url) as client:
        ctx = await client.start("heard-live")
        sent_at = time.monotonic()
        await ctx.send_text("Hello there, this is what the listener hears first.")
        await ctx.end()
        async for event in ctx.events():
            if isinstance(event, AudioFrames):
                break
        began = time.monotonic()  # the player starts on the first frame
        await ctx.played(1.0)  # and reports the first ms heard at once
        await ctx.played(500.0)  # later reports do not count again
        await ctx.collect()
        heard_s = began - sent_at
    count, total = await wait_until_async(
        lambda: (got := heard_metric(server))[0] >= count0 + 1 and got, "first heard observed")
    assert count == count0 + 1
    # the server's figure is the client's, within the loopback trips and the ms reported
    assert abs((total - sum0) - heard_s) < 0.05, (total - sum0, heard_s)


async def test_a_played_after_done_still_counts(server: ServerThread) -> None:
    """A short reply is all sent before its listener's first report arrives."""
    count0, _ = heard_metric(server)
    async with RtClient.connect(server.url) as client:
        ctx = await client.start("short")
        await ctx.send_text("Short.")
        await ctx.end()
        result = await ctx.collect()
        assert result.ok and result.done is not None
        await ctx.played(20.0)
        await wait_until_async(lambda: heard_metric(server)[0] >= count0 + 1,
                               "a report after done observed")


async def test_admission_refuses_when_listeners_hear_later_than_predicted() -> None:
    """The voice's listeners have been hearing first audio a second later than
    the model predicts (as their `played` would show): a start the plain
    prediction admits is refused."""
    srv = ServerThread.with_settings(admission={"first_heard_target_ms": 1000}).start()
    try:
        app = srv.server.app if srv.server is not None else None
        assert app is not None
        async with RtClient.connect(srv.url) as client:
            assert (await client.say("Warm the rates up.")).ok
            ctx = await client.start("admitted")
            await ctx.send_text("Fine.")
            await ctx.end()
            assert (await ctx.collect()).ok
            heard = app.voice_stats[VOICE].heard

            def late_listeners() -> None:  # the correction saturates at +1 s
                for _ in range(100):
                    heard.observe(100.0, 100.0 + 1000.0)

            srv.call(late_listeners)
            with pytest.raises(ServerError) as info:
                await client.start("refused")
            assert info.value.error.code == "overloaded"
            assert info.value.error.retry_after_ms is not None
    finally:
        srv.stop()
