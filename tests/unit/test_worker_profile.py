"""The worker's GPU timeline on demand: SIGUSR1 starts, SIGUSR2 stops and
writes the worker's own trace; every profiled engine is started and stopped."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("torch")

from rtserver.engine.base import ProfiledEngine
from rtserver.testing.wait import wait_until_async
from rtserver.tools.bench.gpu_timeline import find_traces, load
from rtserver.worker.profile import WorkerProfile


class Engine:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start_profile(self) -> None:
        self.calls.append("start")

    async def stop_profile(self) -> None:
        self.calls.append("stop")


async def test_signals_start_and_stop_a_recording(tmp_path: Path) -> None:
    import torch

    engine = Engine()
    assert isinstance(engine, ProfiledEngine)
    prof = WorkerProfile(str(tmp_path / "tl"), [engine])
    prof.install(asyncio.get_running_loop())
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        await wait_until_async(lambda: engine.calls == ["start"], "the engine started recording")
        torch.ones(64, 64) @ torch.ones(64, 64)  # something to record
        os.kill(os.getpid(), signal.SIGUSR1)  # a second start while recording: ignored
        os.kill(os.getpid(), signal.SIGUSR2)
        await wait_until_async(lambda: prof.recordings == 1 and find_traces(tmp_path / "tl"),
                               "the trace written")
        assert engine.calls == ["start", "stop"]
        (path,) = find_traces(tmp_path / "tl")
        assert path.name.startswith(f"worker-{os.getpid()}-1")
        trace = load(path)
        assert trace.first_us < trace.last_us  # host events were recorded
    finally:
        loop = asyncio.get_running_loop()
        loop.remove_signal_handler(signal.SIGUSR1)
        loop.remove_signal_handler(signal.SIGUSR2)
