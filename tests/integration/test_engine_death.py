"""Every engine's death is seen, by fault injection into a real server on
127.0.0.1: the Piper synthesis pool (the ChatTTS torch engine in
test_chattts_death.py, the GPU worker in test_gpu_worker_server.py, vLLM in
test_vllm_server.py). A fault inside one step fails that context with
``engine_failed`` and the server goes on; a dead loop takes the voice down
(``/ready`` 503, every context ``engine_failed``) and the process exits 70
(``ENGINE_DEAD_EXIT``, docs/DEPLOY.md)."""

from __future__ import annotations

import heapq
import json
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from rtserver.protocol.messages import Done, ErrorMessage
from rtserver.server.app import ENGINE_DEAD_EXIT
from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import scaled, wait_until, wait_until_async
from rtserver.tools.bench.server_proc import free_port, http_get, spawn
from rtserver.voices.piper import synthesis_pool
from rtserver.voices.piper.synthesis_pool import SynthesisPool
from tests.integration.util import until

REPO = Path(__file__).resolve().parents[2]


async def speak(url: str, context: str, text: str = "Hello there, this is a test.") -> (
        Done | ErrorMessage):
    """One context start to end: its ``done`` or its ``error``."""
    async with connect(url, compression=None) as ws:
        await ws.recv()  # ready
        await ws.send(json.dumps({"type": "start", "context": context}))
        await ws.send(json.dumps({"type": "text", "context": context, "text": text}))
        await ws.send(json.dumps({"type": "end", "context": context}))
        return await until(ws, (Done, ErrorMessage), context=context, limit_s=scaled(60))


def ready_status(srv: ServerThread) -> int:
    return http_get(srv.http + "/ready")[0]


@pytest.fixture
def piper_server() -> Iterator[ServerThread]:
    """A server of its own (a test may kill its engine)."""
    srv = ServerThread.with_settings(voice={"threads": 1}).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("fault", [MemoryError("injected: cannot allocate"),
                                   RuntimeError("injected: cannot allocate either")],
                         ids=["oom", "error"])
async def test_piper_fault_in_a_step_fails_that_context_and_the_server_goes_on(
        piper_server: ServerThread, monkeypatch: pytest.MonkeyPatch,
        fault: Exception) -> None:
    """Out of memory (MemoryError) or another error in one synthesis call, on
    the pool's thread, is that context's ``engine_failed``; the next context is
    spoken and the server stays ready."""
    submit = SynthesisPool.submit
    faults = [fault]

    def failing_submit(self: SynthesisPool, run: Callable[[], Any], *, first: bool,
                       deadline: float) -> Future[Any]:
        def step() -> Any:
            if faults:
                raise faults.pop()
            return run()
        return submit(self, step, first=first, deadline=deadline)

    monkeypatch.setattr(SynthesisPool, "submit", failing_submit)
    failed = await speak(piper_server.url, "a")
    assert isinstance(failed, ErrorMessage) and failed.code == "engine_failed"
    assert "cannot allocate" in failed.message
    assert isinstance(await speak(piper_server.url, "b"), Done)
    assert ready_status(piper_server) == 200
    assert piper_server.server is not None and piper_server.server.app is not None
    assert not piper_server.server.app.engine_dead.is_set()


class _DyingHeap:
    """``heapq`` for the pool module whose next pop raises: the fault of the
    pool's own loop (not of a job), which kills the thread that meets it."""

    def __init__(self) -> None:
        self.armed = True

    def heappush(self, heap: list[Any], item: Any) -> None:
        heapq.heappush(heap, item)

    def heappop(self, heap: list[Any]) -> Any:
        if self.armed:
            self.armed = False
            raise SystemError("injected: the pool's loop broke")
        return heapq.heappop(heap)


async def test_piper_pool_whose_loop_dies_takes_the_voice_down(
        piper_server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """A synthesis thread that dies fails the context waiting on it with
    ``engine_failed``; ``/ready`` turns 503, the server marks itself for exit
    (``engine_dead``) and new contexts are refused with ``engine_failed``."""
    monkeypatch.setattr(synthesis_pool, "heapq", _DyingHeap())
    failed = await speak(piper_server.url, "a")
    assert isinstance(failed, ErrorMessage) and failed.code == "engine_failed"
    assert "synthesis pool is dead" in failed.message
    wait_until(lambda: ready_status(piper_server) == 503, "/ready turns 503")
    app = piper_server.server.app if piper_server.server is not None else None
    assert app is not None and app.engine_dead.is_set()
    later = await speak(piper_server.url, "b")
    assert isinstance(later, ErrorMessage) and later.code == "engine_failed"
    assert later.retry_after_ms is None  # down for good: only a restart helps


async def test_a_dead_engine_ends_the_process_with_exit_70(tmp_path: Path) -> None:
    """``rtserver serve`` whose voice's engine dies (the test family's
    ``faulty:dead``): the context gets ``engine_failed``, ``/ready`` 503, and
    the process drains and exits 70 by itself, for its orchestrator to
    restart it."""
    port = free_port()
    code = ("import sys, tests.integration.fault_voice; from rtserver.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    cmd = [sys.executable, "-c", code, "serve", "--host", "127.0.0.1", "--port", str(port),
           "--voice", "faulty:dead"]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = spawn(cmd, port, tmp_path / "server.log", env=env)
    try:
        failed = await speak(server.url, "a")
        assert isinstance(failed, ErrorMessage) and failed.code == "engine_failed"
        await wait_until_async(lambda: server.process.poll() is not None,
                               "the process exits by itself")
        assert server.process.wait() == ENGINE_DEAD_EXIT == 70
        assert b"an engine died" in (tmp_path / "server.log").read_bytes()
    finally:
        server.stop()
