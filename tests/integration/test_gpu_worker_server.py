"""ChatTTS through a GPU worker process, end to end: ``rtserver serve`` with
``[gpu] worker = "process"`` (a supervisor, one GPU worker, two front ends on
one port) and a tiny checkpoint on the CPU (random weights: the audio is noise
of the right length), the real client over the WebSocket.

What a user would check: the voice speaks through the worker; the front ends
never load torch; cancel frees the worker's slot; a front end killed with -9
loses only its own contexts and the worker frees their slots; the worker
killed with -9 fails its contexts with ``engine_failed``, ``/ready`` answers
503, and once the supervisor has restarted it a new context on the same
connection speaks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("pybase16384")

from rtserver.client import AudioFrames, ContextStream, RtClient, ServerError
from rtserver.tools.layouts.chattts import write_tiny_chattts
from rtserver.voices.chattts.speaker import encode_speaker
from tests.deploy.util import free_port, free_port_block, scrape

pytestmark = pytest.mark.slow

SAMPLES_PER_STEP = 512
# Each segment runs its whole step budget (ignore_eos): 8 s of audio, 375
# steps, long enough that a stream is still in the worker when a test kills
# something (the tiny model takes a few ms a step on a CI core).
BUDGET_S = 8.0
STEPS = int(np.ceil(BUDGET_S * 24000 / SAMPLES_PER_STEP))
FRONT = re.compile(r"worker (\d+) of (\d+), pid (\d+)")
REQUESTS = re.compile(r'rtserver_gpu_worker_requests\{family="chattts"\} (\S+)')
STARTING = re.compile(r'rtserver_gpu_worker_starting_requests\{family="chattts"\} (\S+)')


class Split:
    """``rtserver serve`` with a GPU worker and two front ends, as a subprocess."""

    def __init__(self, tmp: Path, *, slots: int = 2, max_len: int = 512,
                 budget_s: float = BUDGET_S, gpu: str = "") -> None:
        root = tmp / "chattts"
        write_tiny_chattts(root)
        vec = np.random.default_rng(5).standard_normal(32).astype(np.float32)
        (root / "voices.json").write_text(json.dumps({"alice": encode_speaker(vec)}))
        self.port, self.worker_metrics = free_port(), free_port()
        # front end i serves /metrics on metrics_port + i
        self.metrics_base = free_port_block(2, avoid=(self.port, self.worker_metrics))
        cfg = tmp / "rtserver.toml"
        cfg.write_text(
            f'[server]\nmetrics_port = {self.metrics_base}\ndrain_timeout_s = 5\n'
            '[voice]\ndefault = "chattts:alice"\n'
            f'[chattts]\nasset_dir = "{root}"\ndevice = "cpu"\nslots = {slots}\n'
            f'max_len = {max_len}\n'
            f'voices_file = "{root / "voices.json"}"\nseeds = "1"\nignore_eos = true\n'
            f'budget_base_s = {budget_s}\nbudget_s_per_char = 0.0\nwarm_up_steps = 2\n'
            '[gpu]\nworker = "process"\nfrontends = 2\n'
            f'metrics_port = {self.worker_metrics}\n{gpu}')
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rtserver", "serve", "--config", str(cfg),
             "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])))
        self.lines: list[str] = []
        self._new = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def close(self) -> None:
        """SIGTERM the server (its supervisor stops the worker and front ends)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._new:
                self.lines.append(line.rstrip())
                self._new.notify_all()

    def wait_for(self, pattern: str, timeout: float = 180.0, after: int = 0) -> re.Match[str]:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._new:
            while True:
                for line in self.lines[after:]:
                    if found := rx.search(line):
                        return found
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"no line like {pattern!r}:\n" + "\n".join(self.lines))
                self._new.wait(min(left, 0.5))

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/stream"

    def worker_pid(self, after: int = 0) -> int:
        """The pid of the GPU worker now: the last one started (a test before,
        or a repeat, may have killed and restarted it)."""
        pattern = r"gpu worker 0 started, pid (\d+)"
        self.wait_for(pattern, after=after)
        with self._new:
            starts = [m for line in self.lines[after:] if (m := re.search(pattern, line))]
        return int(starts[-1].group(1))

    def engine(self, name: str) -> float:
        """An ``rtserver_engine_<name>`` of the ChatTTS engine, from the GPU
        worker's own /metrics (``running_requests``: rows in use)."""
        body = scrape(f"http://127.0.0.1:{self.worker_metrics}/metrics")
        found = re.search(rf"^rtserver_engine_{name}\{{[^}}]*\}} (\S+)$", body, re.M)
        assert found, body
        return float(found.group(1))

    def worker_up(self, front: int) -> bool:
        """Whether front end ``front`` has the GPU worker (its own view)."""
        body = scrape(f"http://127.0.0.1:{self.metrics_base + front}/metrics")
        return "rtserver_gpu_worker_up 1.0" in body

    def held(self, front: int) -> float:
        """Requests the GPU worker holds, as front end ``front`` last heard."""
        body = scrape(f"http://127.0.0.1:{self.metrics_base + front}/metrics")
        found = REQUESTS.search(body)
        assert found, body
        return float(found.group(1))

    def starting(self, front: int | None) -> float:
        """First segments in the GPU worker without output yet, as front end
        ``front`` last heard (None: the worker's own count)."""
        port = self.worker_metrics if front is None else self.metrics_base + front
        body = scrape(f"http://127.0.0.1:{port}/metrics")
        found = STARTING.search(body)
        assert found, body
        return float(found.group(1))


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    srv = Split(tmp_path_factory.mktemp("split"), gpu="gil_switch_ms = 1.0\n")
    try:
        srv.wait_for(r"3 of 3 workers ready")
        yield srv
    finally:
        srv.close()


async def until(cond: Callable[[], bool], within: float = 30.0) -> None:
    """Wait until ``cond()`` holds (polling an observable state)."""
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(cond):
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.05)


def ready_status(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url + "/ready", timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def front_of(client: RtClient) -> tuple[int, int]:
    """(index, pid) of the front end a connection landed on."""
    found = FRONT.search(client.ready.server)
    assert found, client.ready.server
    return int(found.group(1)), int(found.group(3))


async def speak(client: RtClient, text: str) -> np.ndarray:
    ctx = await client.start(format="pcm_s16le", sample_rate=24000)
    await ctx.send_text(text)
    await ctx.end()
    result = await ctx.collect()
    assert result.ok, (result.error, result.failure)
    assert result.pcm is not None
    return result.pcm


E = TypeVar("E")


async def first_event(client: RtClient, text: str, kind: type[E]) -> tuple[ContextStream, E]:
    """A context that was sent its whole ``text``, and its first event of ``kind``."""
    ctx = await client.start(format="pcm_s16le", sample_rate=24000)
    await ctx.send_text(text)
    await ctx.end()
    async with contextlib.aclosing(ctx.events()) as events:
        async for event in events:
            if isinstance(event, kind):
                return ctx, event
    raise AssertionError(f"no {kind.__name__}")


async def first_audio(client: RtClient,
                      text: str = "Keep talking. Keep on talking. Still talking.") -> ContextStream:
    """A context whose audio has begun to arrive (three segments: the worker
    holds one of its requests for several seconds)."""
    return (await first_event(client, text, AudioFrames))[0]


def mapped(pid: int, lib: str) -> bool:
    return lib in Path(f"/proc/{pid}/maps").read_text()


async def test_speaks_through_the_worker_and_front_ends_load_no_torch(split: Split) -> None:
    async with RtClient.connect(split.url) as client:
        assert "chattts:alice" in [getattr(v, "name", v) for v in client.ready.voices]
        pcm = await speak(client, "Hello there.")
        _, front_pid = front_of(client)
    n = STEPS * SAMPLES_PER_STEP  # every step of the budget, the last frame padded
    assert len(pcm) == int(np.ceil(n / 480)) * 480 and float(np.abs(pcm[:n]).max()) > 0
    # the worker's process maps libtorch, the front end's does not
    assert mapped(split.worker_pid(), "libtorch")
    assert not mapped(front_pid, "libtorch")
    # the worker serves its engine's metrics and its own load
    body = scrape(f"http://127.0.0.1:{split.worker_metrics}/metrics")
    assert 'rtserver_gpu_worker_capacity{family="chattts"} 2.0' in body
    assert "rtserver_gpu_worker_frontends 2.0" in body
    assert "rtserver_engine_" in body
    assert "rtserver_gpu_worker_gil_switch_seconds 0.001" in body  # gpu.gil_switch_ms


async def test_cancel_frees_the_slot_in_the_worker(split: Split) -> None:
    async with RtClient.connect(split.url) as client:
        front, _ = front_of(client)
        aborted = split.engine("aborted_requests_total")
        ctx = await first_audio(client)
        await until(lambda: split.held(front) == 1)
        await until(lambda: split.engine("running_requests") == 1)
        await ctx.cancel()
        await until(lambda: split.held(front) == 0, within=5)
        # the engine's row is free: the request was aborted, not run out
        await until(lambda: split.engine("running_requests") == 0, within=5)
        assert split.engine("aborted_requests_total") == aborted + 1


async def test_two_front_ends_cannot_oversubscribe_the_worker(split: Split) -> None:
    """The worker serves 2 ChatTTS requests at once (chattts.slots): with
    both held from two front ends, a third context is refused `overloaded`
    with a retry, by its front end (which knows the worker's load) or by the
    worker itself (a first segment past capacity)."""
    clients = [await RtClient.connect(split.url) for _ in range(16)]
    try:
        by_front = {front_of(c)[0]: c for c in clients}
        assert len(by_front) == 2, "the kernel spread 16 connections over one front end"
        held = [await first_audio(by_front[0]), await first_audio(by_front[1])]
        await until(lambda: split.held(0) == 2)
        try:
            third = await by_front[0].start(format="pcm_s16le", sample_rate=24000)
        except ServerError as exc:  # refused by the front end at start
            error = exc.error
        else:  # admitted here; the worker refused its first segment
            await third.send_text("One more.")
            await third.end()
            error = (await third.collect()).error
        assert error is not None and error.code == "overloaded", error
        assert error.retry_after_ms
        assert split.engine("running_requests") == 2
        for ctx in held:
            await ctx.cancel()
        # both front ends see the slots free again before the next test
        await until(lambda: split.held(0) == 0 and split.held(1) == 0, within=5)
    finally:
        for c in clients:
            await c.close()


async def test_a_killed_front_end_frees_its_slots(split: Split) -> None:
    clients = [await RtClient.connect(split.url) for _ in range(16)]
    by_front = {front_of(c)[0]: c for c in clients}
    assert len(by_front) == 2, "the kernel spread 16 connections over one front end"
    victim, witness = by_front[0], 1
    _, pid = front_of(victim)
    aborted = split.engine("aborted_requests_total")
    await first_audio(victim)
    await until(lambda: split.held(witness) == 1)
    mark = len(split.lines)
    os.kill(pid, signal.SIGKILL)
    split.wait_for(r"front end \S+ (gone|silent).*cancelling its 1 request", timeout=30,
                   after=mark)
    await until(lambda: split.held(witness) == 0, within=5)
    await until(lambda: split.engine("running_requests") == 0, within=5)
    assert split.engine("aborted_requests_total") == aborted + 1  # aborted, not run out
    split.wait_for(r"worker 0 died \(-9\); restarting", after=mark)
    split.wait_for(r"3 of 3 workers ready", after=mark)  # the front end is back
    for c in clients:
        with contextlib.suppress(Exception):
            await c.close()


async def test_killed_worker_fails_contexts_then_recovers(split: Split) -> None:
    http = f"http://127.0.0.1:{split.port}"
    async with RtClient.connect(split.url) as client:
        front, _ = front_of(client)
        ctx = await first_audio(client)
        mark = len(split.lines)
        os.kill(split.worker_pid(), signal.SIGKILL)
        result = await ctx.collect()
        assert not result.ok and result.error is not None
        assert result.error.code == "engine_failed", result.error
        # every front end sees the worker gone; /ready answers 503
        await until(lambda: not split.worker_up(0) and not split.worker_up(1), within=5)
        assert await asyncio.to_thread(ready_status, http) == 503
        split.wait_for(r"gpu worker 0 died \(-9\); restarting", after=mark)
        split.worker_pid(after=mark)  # restarted
        # /ready on the port reaches either front end; each has its own view
        await until(lambda: ready_status(http) == 200, within=120)
        await until(lambda: split.worker_up(front), within=10)
        # the connection stayed; a new context on it speaks
        pcm = await speak(client, "Back again.")
        assert len(pcm) >= STEPS * SAMPLES_PER_STEP
