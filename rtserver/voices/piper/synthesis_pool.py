"""Worker threads that run blocking synthesis jobs earliest-deadline-first.

CPU voices (onnxruntime releases the GIL) run here, never on the event loop.
A job's key is (not first, deadline, arrival order): first segments decide
TTFA, so they go ahead; later ones are served by when the listener needs them,
which is the order that avoids underruns (earliest deadline first is optimal
for one server when feasible; Liu & Layland, 1973).

Calls are not preemptible, so a new stream's first segment could wait for a
long sentence to finish on every worker (head-of-line blocking: up to a
second on a 2-core machine). ``first_lane`` extra threads take first
segments only: such a call then runs beside the long ones at once, sharing
the cores for its ~50 ms instead of queueing behind them. With
``background_nice`` the other threads run that much nicer than the server
(Linux: nice is per thread), so the kernel gives a first segment's thread the core it shares
with them (CFS weight 1024 at nice 0 vs 110 at nice 10) instead of half of
it; cores the lane does not need stay theirs.

A thread that ends other than by ``close`` (a bug in the loop, not in a job:
a job's exception goes to its caller) kills the pool: ``dead`` says why, the
jobs queued fail with ``EngineDead``, and so does every later ``submit``; the
server sees ``dead`` and exits to be restarted (a pool short of a thread
would go on quietly at a fraction of its capacity).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import heapq
import itertools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rtserver.errors import EngineDead

T = TypeVar("T")
log = logging.getLogger("rtserver.synthesis")


def set_thread_nice(increment: int) -> bool:
    """Make the calling thread ``increment`` nicer than it is (Linux: each
    thread has its own nice value; at most 19); False where that cannot be
    done. Threads it starts from now inherit the new value."""
    if increment == 0:
        return True
    if not hasattr(os, "setpriority"):
        return False
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid,
                       min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
    except OSError as exc:
        log.warning("could not make a thread %d nicer: %s", increment, exc)
        return False
    return True


def run_at_nice(fn: Callable[[], T], increment: int) -> T:
    """``fn()`` on a new thread ``increment`` nicer than the caller: threads
    that ``fn`` starts (a runtime's worker pool, say) inherit that priority."""
    out: list[T] = []
    errors: list[BaseException] = []

    def body() -> None:
        set_thread_nice(increment)
        try:
            out.append(fn())
        except BaseException as exc:  # re-raised in the caller below
            errors.append(exc)

    thread = threading.Thread(target=body, name="nice-loader", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


@dataclass(order=True)
class _Job:
    key: tuple[bool, float, int]
    run: Callable[[], Any] = field(compare=False)
    future: Future[Any] = field(compare=False)


class SynthesisPool:
    """A fixed set of threads pulling jobs from one priority heap."""

    def __init__(self, workers: int, name: str = "synth", first_lane: int = 1,
                 background_nice: int = 0) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if first_lane < 0:
            raise ValueError("first_lane must be >= 0")
        if not 0 <= background_nice <= 19:
            raise ValueError("background_nice must be in 0..19")
        self.background_nice = background_nice
        self._heap: list[_Job] = []
        self._cond = threading.Condition()
        self._order = itertools.count()
        self._closed = False
        self.dead: str | None = None  # why a thread died (see the module docstring)
        self._busy = 0
        self._running: dict[int, Future[Any]] = {}  # thread -> the job it runs now
        self._workers = workers
        self._threads = [
            threading.Thread(target=self._work, args=(False,), name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ] + [
            threading.Thread(target=self._work, args=(True,), name=f"{name}-first-{i}",
                             daemon=True)
            for i in range(first_lane)
        ]
        for t in self._threads:
            t.start()

    @property
    def workers(self) -> int:
        """Threads that take any job (the first-segment lane not counted)."""
        return self._workers

    @property
    def queued(self) -> int:
        return len(self._heap)

    @property
    def busy(self) -> int:
        return self._busy

    def submit(self, run: Callable[[], Any], *, first: bool, deadline: float) -> Future[Any]:
        """Queue ``run``; the returned future may be cancelled while queued."""
        future: Future[Any] = Future()
        # the caller's context variables (its request id for log lines) in the job
        run = functools.partial(contextvars.copy_context().run, run)
        with self._cond:
            if self.dead is not None:
                raise EngineDead(f"the synthesis pool is dead: {self.dead}")
            if self._closed:
                raise RuntimeError("synthesis pool is closed")
            heapq.heappush(self._heap, _Job((not first, deadline, next(self._order)), run, future))
            self._cond.notify_all()  # a lane thread may be the one that can take it
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

    def _work(self, first_only: bool) -> None:
        try:
            self._loop(first_only)
        except BaseException as exc:
            log.critical("synthesis thread %s died", threading.current_thread().name,
                         exc_info=True)
            self._die(f"thread {threading.current_thread().name} died: "
                      f"{type(exc).__name__}: {exc}")

    def _die(self, why: str) -> None:
        """The calling thread dies: fail its job and every queued one."""
        with self._cond:
            own = self._running.pop(threading.get_ident(), None)
            if self._closed or self.dead is not None:
                return
            self.dead = why
            jobs, self._heap = self._heap, []
            self._cond.notify_all()
        err = EngineDead(f"the synthesis pool is dead: {why}")
        for job in jobs:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(err)
        if own is not None:
            with contextlib.suppress(InvalidStateError):  # it had ended
                own.set_exception(err)

    def _loop(self, first_only: bool) -> None:
        if not first_only:
            set_thread_nice(self.background_nice)
        while True:
            with self._cond:
                # first jobs sort to the top of the heap, so a lane thread looks there
                while not self._closed and (not self._heap
                                            or (first_only and self._heap[0].key[0])):
                    self._cond.wait()
                if self._closed:
                    return
                job = heapq.heappop(self._heap)
                if not job.future.set_running_or_notify_cancel():
                    continue
                self._busy += 1
                self._running[threading.get_ident()] = job.future
            try:
                job.future.set_result(job.run())
            except BaseException as exc:  # delivered to the awaiting task, not lost
                job.future.set_exception(exc)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._running.pop(threading.get_ident(), None)
