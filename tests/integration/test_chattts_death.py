"""The ChatTTS torch engine's faults, injected into a real server with a tiny
checkpoint (random weights): out of memory or an error inside a step fails
that step's contexts with ``engine_failed`` and the engine goes on; a loop
that dies (with a context in flight or none) takes the voice down: its
contexts ``engine_failed``, ``/ready`` 503, and the server marks itself for
its exit 70 (the exit itself: test_engine_death.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pybase16384")

from websockets.asyncio.client import connect  # noqa: E402

from rtserver.protocol.messages import Done, ErrorMessage, Started  # noqa: E402
from rtserver.server.guarded import unwrap  # noqa: E402
from rtserver.testing.server_thread import ServerThread  # noqa: E402
from rtserver.testing.wait import scaled, wait_until  # noqa: E402
from rtserver.tools.bench.server_proc import http_get  # noqa: E402
from rtserver.tools.layouts.chattts import write_tiny_chattts  # noqa: E402
from tests.integration.util import until  # noqa: E402

TEXT = "Hello there."


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chattts")
    write_tiny_chattts(root)
    return root


@pytest.fixture
def chattts(checkpoint: Path) -> Iterator[ServerThread]:
    """A server of its own (a test may kill its engine)."""
    srv = ServerThread.with_settings(
        voice={"default": "chattts"},
        chattts={"asset_dir": str(checkpoint), "device": "cpu", "slots": 2, "max_len": 256,
                 "ignore_eos": True, "budget_base_s": 0.3, "budget_s_per_char": 0.02,
                 "warm_up_steps": 2},
    ).start(timeout=300)
    yield srv
    srv.stop()


def engine_of(srv: ServerThread) -> Any:
    assert srv.server is not None and srv.server.app is not None
    app = srv.server.app
    return unwrap(app.voices[app.default_voice]).runtime.engine  # type: ignore[attr-defined]


async def speak(url: str, context: str) -> Done | ErrorMessage:
    async with connect(url, compression=None) as ws:
        await ws.recv()  # ready
        await ws.send(json.dumps({"type": "start", "context": context}))
        await ws.send(json.dumps({"type": "text", "context": context, "text": TEXT}))
        await ws.send(json.dumps({"type": "end", "context": context}))
        return await until(ws, (Done, ErrorMessage), context=context, limit_s=scaled(60))


def ready(srv: ServerThread) -> int:
    return http_get(srv.http + "/ready")[0]


@pytest.mark.parametrize("fault", [
    torch.OutOfMemoryError("injected: CUDA out of memory"),
    RuntimeError("injected: a kernel failed"),
], ids=["oom", "error"])
async def test_a_fault_in_a_step_fails_its_context_and_the_engine_goes_on(
        chattts: ServerThread, fault: BaseException) -> None:
    runner = engine_of(chattts).runner
    launch = runner.launch
    faults = [fault]

    def failing_launch(*args: Any, **kwargs: Any) -> Any:
        if faults:
            raise faults.pop()
        return launch(*args, **kwargs)

    runner.launch = failing_launch  # the engine thread reads it at its next step
    failed = await speak(chattts.url, "a")
    assert isinstance(failed, ErrorMessage) and failed.code == "engine_failed"
    assert ("out of GPU memory" if isinstance(fault, torch.OutOfMemoryError)
            else "a kernel failed") in failed.message
    assert isinstance(await speak(chattts.url, "b"), Done)
    assert ready(chattts) == 200
    assert engine_of(chattts).dead_reason() is None


def _kill_loop(engine: Any) -> None:
    """The loop's own fault (not a step's): its next turn raises."""
    def broken() -> None:
        raise SystemError("injected: the step loop broke")
    engine._take_inbox = broken


async def test_a_loop_that_dies_while_idle_takes_the_voice_down(chattts: ServerThread) -> None:
    """No context in flight: the server's watch sees the dead loop by itself."""
    _kill_loop(engine_of(chattts))
    wait_until(lambda: ready(chattts) == 503, "/ready turns 503 with nothing in flight")
    assert chattts.server is not None and chattts.server.app is not None
    assert chattts.server.app.engine_dead.is_set()
    later = await speak(chattts.url, "a")
    assert isinstance(later, ErrorMessage) and later.code == "engine_failed"
    assert "loop died" in later.message and later.retry_after_ms is None


async def test_a_loop_that_dies_mid_context_fails_it_engine_failed(
        chattts: ServerThread) -> None:
    async with connect(chattts.url, compression=None) as ws:
        await ws.recv()  # ready
        await ws.send(json.dumps({"type": "start", "context": "a"}))
        await until(ws, Started, context="a")
        await ws.send(json.dumps({"type": "text", "context": "a",
                                  "text": "A long sentence that keeps the engine busy for a "
                                          "while, and then some more words to say."}))
        await ws.send(json.dumps({"type": "flush", "context": "a"}))
        while not isinstance(await ws.recv(), bytes):  # its first audio: in flight
            pass
        _kill_loop(engine_of(chattts))
        failed = await until(ws, (Done, ErrorMessage), context="a", limit_s=scaled(60))
    assert isinstance(failed, ErrorMessage) and failed.code == "engine_failed"
    wait_until(lambda: ready(chattts) == 503, "/ready turns 503")
    assert chattts.server is not None and chattts.server.app is not None
    assert chattts.server.app.engine_dead.is_set()
