"""Hostile messages over a real socket (a small run of rtserver.tools.bench.fuzz; the
script sends 100k): each is answered by one error, no connection ends, and
the context speaking on the same connection finishes with every frame."""

from __future__ import annotations

from rtserver.testing.server_thread import ServerThread
from rtserver.tools.bench.fuzz import run_fuzz


async def test_hostile_messages_are_answered_and_touch_nothing(server: ServerThread) -> None:
    report = await run_fuzz(server.url, messages=1500, connections=3, seed=7)
    assert report.closed_early == []
    assert report.unanswered == 0, report.errors
    assert report.victims_done == 3
    assert report.victim_gaps == 0 and report.victim_frames_missing == 0
    assert report.victim_errors == []
    assert set(report.errors) <= {"bad_message", "unknown_context", "unsupported_format"}
    assert report.errors["bad_message"] > 1000
