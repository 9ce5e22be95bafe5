"""The synthesis pool: earliest deadline first, a lane for first segments, and
the other threads' lower priority."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from rtserver.errors import EngineDead
from rtserver.voices.piper.synthesis_pool import SynthesisPool, run_at_nice


def test_first_segment_runs_at_once_while_every_worker_is_busy() -> None:
    pool = SynthesisPool(2, first_lane=1)
    release = threading.Event()
    started = threading.Semaphore(0)

    def long_call() -> str:
        started.release()
        assert release.wait(10)
        return "long"

    try:
        longs = [pool.submit(long_call, first=False, deadline=float(i)) for i in range(2)]
        assert started.acquire(timeout=10) and started.acquire(timeout=10)  # both busy
        queued_later = pool.submit(lambda: "later", first=False, deadline=0.0)
        first = pool.submit(lambda: "first", first=True, deadline=99.0)
        assert first.result(timeout=10) == "first"  # did not wait for the long calls
        assert not queued_later.done()  # a later segment still waits its turn
        release.set()
        assert [f.result(timeout=10) for f in longs] == ["long", "long"]
        assert queued_later.result(timeout=10) == "later"
    finally:
        release.set()
        pool.close()


def test_jobs_run_earliest_deadline_first_with_first_segments_ahead() -> None:
    pool = SynthesisPool(1, first_lane=0)
    gate = threading.Event()
    order: list[str] = []
    try:
        blocker = pool.submit(lambda: gate.wait(10), first=False, deadline=0.0)
        jobs = [pool.submit(lambda n=n: order.append(n), first=first, deadline=d)
                for n, first, d in [("late", False, 9.0), ("soon", False, 1.0),
                                    ("first", True, 50.0), ("mid", False, 5.0)]]
        gate.set()
        blocker.result(timeout=10)
        for job in jobs:
            job.result(timeout=10)
        assert order == ["first", "soon", "mid", "late"]
    finally:
        gate.set()
        pool.close()


def test_a_cancelled_queued_job_never_runs() -> None:
    pool = SynthesisPool(1, first_lane=0)
    gate = threading.Event()
    ran: list[int] = []
    try:
        blocker = pool.submit(lambda: gate.wait(10), first=False, deadline=0.0)
        victim = pool.submit(lambda: ran.append(1), first=False, deadline=1.0)
        assert victim.cancel()
        after = pool.submit(lambda: ran.append(2), first=False, deadline=2.0)
        gate.set()
        blocker.result(timeout=10)
        after.result(timeout=10)
        assert ran == [2]
    finally:
        gate.set()
        pool.close()


def _my_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_background_workers_run_at_their_nice_and_the_first_lane_at_normal() -> None:
    base = _my_nice()  # pytest itself may run under nice
    pool = SynthesisPool(2, first_lane=1, background_nice=7)
    try:
        later = [pool.submit(_my_nice, first=False, deadline=float(i)) for i in range(4)]
        assert [f.result(timeout=5) for f in later] == [min(19, base + 7)] * 4
        lane = pool._threads[-1]  # the first lane's thread
        assert lane.name.endswith("first-0") and lane.native_id is not None
        stat = Path(f"/proc/self/task/{lane.native_id}/stat").read_text()
        assert int(stat.rsplit(")", 1)[1].split()[16]) == base  # field 19: nice
    finally:
        pool.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_run_at_nice_gives_threads_started_there_the_nice() -> None:
    def start_one() -> int:
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(_my_nice()))
        t.start()
        t.join()
        return seen[0]

    base = _my_nice()
    assert run_at_nice(start_one, 4) == min(19, base + 4)
    assert _my_nice() == base  # the caller's own priority is untouched
    with pytest.raises(ZeroDivisionError):
        run_at_nice(lambda: 1 // 0, 3)


def test_a_nice_outside_linux_range_is_refused() -> None:
    with pytest.raises(ValueError, match="background_nice"):
        SynthesisPool(1, background_nice=20)


def test_a_thread_that_dies_kills_the_pool_and_fails_its_jobs_engine_dead() -> None:
    """A fault of the loop itself (here: a future finished behind the pool's
    back, which its thread cannot start) fails every queued job and every later
    submit with EngineDead, and ``dead`` says why: nothing waits for ever."""
    pool = SynthesisPool(1, first_lane=0)
    release = threading.Event()
    started = threading.Event()

    def long_call() -> str:
        started.set()
        assert release.wait(10)
        return "long"

    try:
        running = pool.submit(long_call, first=False, deadline=0.0)
        assert started.wait(10)
        poisoned = pool.submit(lambda: "never", first=False, deadline=1.0)
        queued = pool.submit(lambda: "never", first=False, deadline=2.0)
        poisoned.set_result("finished elsewhere")  # the thread's next pop meets it
        assert pool.dead is None
        release.set()
        assert running.result(timeout=10) == "long"  # what ran before ends well
        with pytest.raises(EngineDead, match="synthesis pool is dead"):
            queued.result(timeout=10)
        assert pool.dead is not None and "RuntimeError" in pool.dead
        with pytest.raises(EngineDead):
            pool.submit(lambda: "late", first=True, deadline=0.0)
    finally:
        release.set()
        pool.close()
