"""Worker threads that run blocking synthesis jobs earliest-deadline-first.

CPU voices (onnxruntime releases the GIL) run here, never on the event loop.
A job's key is (not first, deadline, arrival order): first segments decide
TTFA, so they go ahead; later ones are served by when the listener needs them,
which is the order that avoids underruns (earliest deadline first is optimal
for one server when feasible; Liu & Layland, 1973).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any


@dataclass(order=True)
class _Job:
    key: tuple[bool, float, int]
    run: Callable[[], Any] = field(compare=False)
    future: Future[Any] = field(compare=False)


class SynthesisPool:
    """A fixed set of threads pulling jobs from one priority heap."""

    def __init__(self, workers: int, name: str = "synth") -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self._heap: list[_Job] = []
        self._cond = threading.Condition()
        self._order = itertools.count()
        self._closed = False
        self._busy = 0
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    @property
    def workers(self) -> int:
        return len(self._threads)

    @property
    def queued(self) -> int:
        return len(self._heap)

    @property
    def busy(self) -> int:
        return self._busy

    def submit(self, run: Callable[[], Any], *, first: bool, deadline: float) -> Future[Any]:
        """Queue ``run``; the returned future may be cancelled while queued."""
        future: Future[Any] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("synthesis pool is closed")
            heapq.heappush(self._heap, _Job((not first, deadline, next(self._order)), run, future))
            self._cond.notify()
        return future

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for job in self._heap:
                job.future.cancel()
            self._heap.clear()
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=5)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job = heapq.heappop(self._heap)
                if not job.future.set_running_or_notify_cancel():
                    continue
                self._busy += 1
            try:
                job.future.set_result(job.run())
            except BaseException as exc:  # delivered to the awaiting task, not lost
                job.future.set_exception(exc)
            finally:
                with self._cond:
                    self._busy -= 1
