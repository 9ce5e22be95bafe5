"""The synthesis pool: earliest deadline first, and a lane for first segments."""

from __future__ import annotations

import threading

from rtserver.voices.synthesis_pool import SynthesisPool


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
