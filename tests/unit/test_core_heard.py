"""Time to first heard audio from listeners' ``played``, and the bounded
correction admission applies to its prediction (pure, then the core with a
fake voice and a manual clock)."""

from __future__ import annotations

import pytest

from rtserver.clock import ManualClock
from rtserver.core.heard import (
    MAX_CORRECTION_MS,
    MIN_REPORTS,
    WEIGHT,
    FirstHeard,
    ListenerCorrection,
)
from rtserver.protocol.messages import Start
from tests.unit.test_core_guarantees import PCM, FakeVoice, RecordingSink, core_with


def probe(predicted_ms: float | None = 100.0) -> tuple[FirstHeard, list[tuple[str, float]]]:
    reports: list[tuple[str, float]] = []
    heard = FirstHeard(voice="v", predicted_ms=predicted_ms, correction=ListenerCorrection(),
                       report=lambda v, s: reports.append((v, s)))
    heard.text_complete_at, heard.first_sent_at, heard.sent_ms = 10.0, 10.05, 2000.0
    return heard, reports


def test_the_first_report_gives_when_playback_began() -> None:
    heard, reports = probe()
    assert heard.played(0.0, 10.2) is None  # nothing heard yet: not a start
    assert heard.played(200.0, 10.45) == pytest.approx(0.25)  # began 10.25, text at 10.0
    assert reports == [("v", pytest.approx(0.25))]
    assert heard.played(450.0, 10.9) is None and len(reports) == 1  # later ones do not count
    assert heard.correction.reports == 1
    assert heard.correction.offset_ms == pytest.approx(WEIGHT * (250.0 - 100.0))


def test_impossible_reports_are_clamped_to_what_was_sent_and_when() -> None:
    heard, _ = probe()
    heard.sent_ms = 100.0  # only 100 ms went out: a claim of 5 s is read as 100 ms
    assert heard.played(5000.0, 10.3) == pytest.approx(0.2)
    early, _ = probe()  # playback cannot begin before the first frame left (10.05)
    assert early.played(1000.0, 10.5) == pytest.approx(0.05)


def test_no_audio_sent_means_nothing_to_have_heard() -> None:
    heard, reports = probe()
    heard.first_sent_at = None
    assert not heard.waiting and heard.played(100.0, 11.0) is None and reports == []


def test_the_correction_waits_for_reports_and_is_bounded_per_report() -> None:
    c = ListenerCorrection()
    for _ in range(MIN_REPORTS - 1):
        c.observe(100.0, 400.0)
    assert c.correction_ms == 0.0 and c.corrected_ms(100.0) == 100.0
    c.observe(100.0, 400.0)
    assert 0 < c.correction_ms < 300.0
    before = c.offset_ms
    c.observe(100.0, 1e9)  # one absurd report moves it by at most WEIGHT * MAX
    assert c.offset_ms - before <= WEIGHT * MAX_CORRECTION_MS
    for _ in range(200):  # listeners steadily 300 ms later than predicted
        c.observe(100.0, 400.0)
    assert c.correction_ms == pytest.approx(300.0, abs=1.0)
    assert ListenerCorrection(reports=9, offset_ms=-500.0).corrected_ms(200.0) == 0.0


async def test_admission_hears_what_listeners_report() -> None:
    """Contexts whose listeners start 300 ms after the model's prediction move
    admission's prediction up by about that; the plain prediction stays."""
    clock = ManualClock(100.0)
    voice = FakeVoice(clock)
    core = core_with(voice, clock)
    start = Start(context="c", **PCM)
    for i in range(MIN_REPORTS + 30):
        ctx = core.open(Start(context=f"c{i}", **PCM), RecordingSink())
        predicted = ctx.first_heard.predicted_ms
        assert predicted is not None
        ctx.feed("Hello there.")
        ctx.end()
        assert await ctx.run() == "done"
        complete = ctx.segments.first_segment_at
        assert complete is not None
        # the listener began playing 300 ms after the prediction; reports 100 ms in
        target = complete + (predicted + 300.0 + 100.0) / 1000.0
        assert target > clock.now()
        clock.advance(target - clock.now())
        heard = ctx.played(100.0)
        assert heard is not None
        assert heard * 1000.0 == pytest.approx(predicted + 300.0, abs=1.0)
    plain = core.predicted_first_heard_ms(start)
    assert core.admission_first_heard_ms(start) == pytest.approx(plain + 300.0, abs=15.0)
    name = voice.info.name
    count = core.metrics.registry.get_sample_value(
        "rtserver_time_to_first_heard_seconds_count", {"voice": name})
    assert count == MIN_REPORTS + 30
