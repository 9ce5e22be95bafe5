"""A GPU timeline of the worker on demand (issue 24): ``SIGUSR1`` starts it,
``SIGUSR2`` stops it and writes the traces to ``[gpu] profile_dir``.

The worker records its own process with torch's profiler (CPU calls and the
CUDA kernels of its vocoders) and asks every engine that can (vLLM's
EngineCore, its own process) to record its own; each writes a Chrome trace
there (``*.pt.trace.json.gz``). ``python -m rtserver.tools.bench.gpu_timeline
DIR`` merges the kernels of all of them into one timeline: busy share, gaps,
and which process's kernels ran.

Profiling costs the host time it measures; keep a window short (seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rtserver.engine.base import ProfiledEngine

log = logging.getLogger(__name__)


class WorkerProfile:
    """Starts and stops one recording at a time; signals only schedule."""

    def __init__(self, folder: str, engines: Sequence[ProfiledEngine]) -> None:
        self.folder = Path(folder)
        self.engines = list(engines)
        self._own: Any = None  # torch.profiler.profile while recording
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.recordings = 0

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """SIGUSR1 starts a recording, SIGUSR2 stops it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for sig, action in ((signal.SIGUSR1, self.start), (signal.SIGUSR2, self.stop)):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, self._schedule, action)

    def _schedule(self, action: Any) -> None:
        task = asyncio.get_running_loop().create_task(action())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        async with self._lock:
            if self._own is not None:
                return
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            own = torch.profiler.profile(activities=activities, with_stack=False)
            await asyncio.to_thread(own.start)
            self._own = own
            for engine in self.engines:
                await engine.start_profile()
            log.info("GPU timeline: recording (worker pid %d, %d engine(s))", os.getpid(),
                     len(self.engines))

    async def stop(self) -> None:
        async with self._lock:
            own, self._own = self._own, None
            if own is None:
                return
            for engine in self.engines:
                await engine.stop_profile()
            await asyncio.to_thread(own.stop)
            self.recordings += 1
            path = self.folder / f"worker-{os.getpid()}-{self.recordings}.pt.trace.json.gz"
            await asyncio.to_thread(own.export_chrome_trace, str(path))  # .gz: torch gzips
            log.info("GPU timeline: written to %s", self.folder)

