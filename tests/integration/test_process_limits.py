"""Memory, descriptors and fairness of a real server process (slow): idle
connections, 300 abrupt disconnects mid-audio, and a flooding client and a
trickle reader beside a normal one."""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from rtserver.client import RtClient
from rtserver.tools.bench.server_proc import (
    SpawnedServer,
    free_port,
    http_get,
    rtserver_command,
    spawn,
)
from rtserver.tools.bench.soak import proc_stats

pytestmark = pytest.mark.slow


@pytest.fixture
def proc(tmp_path: Path) -> Iterator[SpawnedServer]:
    port = free_port()
    server = spawn(rtserver_command(port, None), port, tmp_path / "server.log",
                   env={**os.environ, "RTSERVER_SERVER_MAX_QUEUED_MESSAGES": "64"})
    yield server
    server.stop()


def metric(server: SpawnedServer, name: str) -> float:
    base = server.url.replace("ws://", "http://").rsplit("/v1/", 1)[0]
    _, body = http_get(base + "/metrics")
    m = re.search(f"^{re.escape(name)} (\\S+)$", body.decode(), re.M)
    return float(m.group(1)) if m else -1.0


async def test_idle_connections_cost_at_most_64_kib(proc: SpawnedServer) -> None:
    rss0, fds0, _ = proc_stats(proc.pid)
    conns = []
    for _ in range(300):
        ws = await connect(proc.url, compression=None)
        await ws.recv()  # ready
        conns.append(ws)
    await asyncio.sleep(1.0)
    rss1, fds1, _ = proc_stats(proc.pid)
    per_kib = (rss1 - rss0) * 1024 / 300
    assert fds1 - fds0 >= 300
    assert per_kib <= 64, f"{per_kib:.1f} KiB per idle connection"
    for ws in conns:
        await ws.close()


async def test_300_abrupt_disconnects_mid_audio_leave_nothing(proc: SpawnedServer) -> None:
    async with RtClient.connect(proc.url) as warm:  # warm the voice and the pools
        assert (await warm.say("Warm up first.")).ok
    await asyncio.sleep(0.5)
    rss0, fds0, _ = proc_stats(proc.pid)

    async def drop() -> None:
        ws = await connect(proc.url, compression=None)
        await ws.recv()
        await ws.send(json.dumps({"type": "start", "context": "x"}))
        await ws.send(json.dumps({"type": "text", "context": "x", "text":
                                  "Hello there, this reply is cut off in the middle of its "
                                  "audio by a client that simply goes away."}))
        await ws.send(json.dumps({"type": "end", "context": "x"}))
        while not isinstance(await asyncio.wait_for(ws.recv(), 60), bytes):
            pass  # mid-audio: its first frame is here
        ws.transport.abort()

    for _ in range(30):
        await asyncio.gather(*(drop() for _ in range(10)))
    for _ in range(100):  # the server notices the resets within moments
        if metric(proc, "rtserver_active_contexts") == 0 \
                and metric(proc, "rtserver_active_connections") == 0:
            break
        await asyncio.sleep(0.2)
    assert metric(proc, "rtserver_active_contexts") == 0
    assert metric(proc, "rtserver_active_connections") == 0
    await asyncio.sleep(1.0)
    rss1, fds1, _ = proc_stats(proc.pid)
    assert fds1 <= fds0 + 2, (fds0, fds1)
    assert rss1 - rss0 < 40, f"RSS {rss0:.0f} -> {rss1:.0f} MB"


async def _ttfa_ms(url: str, n: int) -> float:
    values = []
    async with RtClient.connect(url) as client:
        for i in range(n):
            ctx = await client.start()
            t0 = time.monotonic()
            await ctx.send_text(f"Number {i} is fine.")
            await ctx.end()
            result = await ctx.collect(decode=False)
            assert result.ok and result.times.first_frame_at is not None
            values.append(1000 * (result.times.first_frame_at - t0))
    return statistics.median(values)


# A flooding client in its own process (in this one it would slow the normal
# client's own event loop, not the server), at the lowest priority (an
# attacker's CPU is not the server's on a real network; on this 2-core box it
# would be): sends invalid messages as fast as it can, reads one message every
# argv[2] seconds (never when 0), prints its close code.
FLOOD = """
import asyncio, os, sys, time
os.nice(19)
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
async def main(url, read_every):
    async with connect(url, compression=None, max_queue=1) as ws:
        await ws.recv()
        last = time.monotonic()
        try:
            for _ in range(400_000):
                await asyncio.wait_for(ws.send('{"type":"text","context":"no"}'), 5)
                if read_every and time.monotonic() - last > read_every:
                    await asyncio.wait_for(ws.recv(), 5)
                    last = time.monotonic()
        except (ConnectionClosed, TimeoutError):
            pass
        try:
            while True:
                await asyncio.wait_for(ws.recv(), 10)
        except (ConnectionClosed, TimeoutError):
            pass
        print(ws.close_code)
asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


async def test_a_flood_and_a_trickle_reader_do_not_starve_a_normal_client(
        proc: SpawnedServer) -> None:
    baseline = await _ttfa_ms(proc.url, 7)
    rss0, _, _ = proc_stats(proc.pid)
    flooders = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", FLOOD, proc.url, every, stdout=asyncio.subprocess.PIPE)
        for every in ("0", "1.0")]
    await asyncio.sleep(0.5)
    during = await _ttfa_ms(proc.url, 7)
    outs = [await asyncio.wait_for(f.communicate(), 90) for f in flooders]
    closed = [out.decode().strip() for out, _ in outs]
    rss1, _, _ = proc_stats(proc.pid)
    assert during <= 2 * max(baseline, 30.0), (baseline, during)
    assert all(code in ("1008", "1006") for code in closed), closed
    assert rss1 - rss0 < 30, f"RSS {rss0:.0f} -> {rss1:.0f} MB"
