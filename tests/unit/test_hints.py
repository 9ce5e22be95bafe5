"""Jitter-buffer hints: hand-checked examples, the no-underrun guarantee, the tracker."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rtserver.pacing.hints import (
    HintConfig,
    PlaybackResult,
    ahead_ms,
    heard_chunks_ms,
    planned_arrivals,
    prebuffer_ms,
    simulate_playback,
    start_delay_ms,
)
from rtserver.pacing.rates import LiveRates, RtfTracker
from rtserver.vocoder.chunking import ChunkConfig, stream_plan

# --- closed-form examples, worked by hand ------------------------------------------------


def test_design_formula_by_hand() -> None:
    # d = 100, 300, 1000; D = 0, 100, 400; r = 0.5:
    # k=0: 0; k=1: 0.5*(400-100) - 100 = 50; k=2: 0.5*(1400-100) - 400 = 250
    assert start_delay_ms(0.5, [100, 300, 1000], 0) == 250
    assert start_delay_ms(0.5, [100, 300, 1000], 40) == 290
    # faster than needed everywhere: only J is left
    assert start_delay_ms(0.1, [200, 200, 200], 40) == 40
    assert start_delay_ms(2.0, [], 40) == 40


def test_prebuffer_by_hand() -> None:
    # same chunks: arrivals 50, 200, 700. Start on chunk 0 (t=50): chunk 1 plays
    # at 150 < 200. On chunk 1 (t=200): chunk 2 plays at 600 < 700. So wait
    # for chunk 2: D_2 + J = 400 + 40.
    assert planned_arrivals(0.5, [100, 300, 1000]) == [(50, 100), (200, 300), (700, 1000)]
    assert prebuffer_ms(0.5, [100, 300, 1000], 40) == 440
    # equal 1 s chunks at r = 0.5: chunk 1 is out 500 ms after chunk 0 and plays
    # 1000 ms after it; 500 + J <= 1000, so start on chunk 0: hint J.
    assert prebuffer_ms(0.5, [1000, 1000, 1000], 40) == 40
    # r = 0.95: 950 + 40 <= 1000 still starts on chunk 0; r = 0.98: 980 + 40 > 1000,
    # wait for chunk 1. From chunk 1 on: chunk 2 comes 980 ms after it and plays
    # 1000 ms after it: fine. Hint D_1 + J.
    assert prebuffer_ms(0.95, [1000, 1000, 1000], 40) == 40
    assert prebuffer_ms(0.98, [1000, 1000, 1000], 40) == 1040


def test_piper_next_segment_waits_for_its_text() -> None:
    # Piper: one chunk per segment; segment 1's text arrives 900 ms in.
    # r = 0.2: segment 0 (600 ms) is out at 120; segment 1 (2000 ms) starts at 900,
    # out at 1300, plays at 120 + 600 = 720 if we start at once: too late.
    chunks, ready = [600.0, 2000.0], [0.0, 900.0]
    assert planned_arrivals(0.2, chunks, ready) == [(120, 600), (1300, 2000)]
    hint = prebuffer_ms(0.2, chunks, 40, ready_ms=ready)
    assert hint == 640  # wait for segment 1: D_1 + J
    assert prebuffer_ms(0.2, chunks, 40) == 40  # with the text already there: start at once
    arrivals = planned_arrivals(0.2, chunks, ready)
    assert simulate_playback(arrivals, 40).underruns == 1
    assert simulate_playback(arrivals, hint).underruns == 0


def test_design_formula_as_an_audio_threshold_underruns_where_the_hint_does_not() -> None:
    chunks = [100.0, 300.0, 1000.0]
    arrivals = planned_arrivals(0.5, chunks)
    played = simulate_playback(arrivals, start_delay_ms(0.5, chunks, 40))
    assert played == PlaybackResult(underruns=1, stalled_ms=100.0, start_ms=200.0)
    assert simulate_playback(arrivals, prebuffer_ms(0.5, chunks, 40)) == PlaybackResult(
        underruns=0, stalled_ms=0.0, start_ms=700.0)


def test_simulated_listener_by_hand() -> None:
    arrivals = [(0.0, 100.0), (100.0, 100.0), (350.0, 100.0), (360.0, 100.0), (370.0, 200.0)]
    # prebuffer 0: plays 0-200, runs dry at 200, chunk 2 at 350: one underrun, then
    # 350-750 without a gap (chunks 3 and 4 come while chunk 2 plays)
    assert simulate_playback(arrivals, 0) == PlaybackResult(1, 150.0, 0.0)
    # prebuffer 200: starts at 100; dry at 300; resumes once 200 ms are back: at 360
    assert simulate_playback(arrivals, 200) == PlaybackResult(1, 60.0, 100.0)
    # more than there will ever be: start once everything is in
    assert simulate_playback(arrivals, 10_000) == PlaybackResult(0, 0.0, 370.0)
    assert simulate_playback([], 100) == PlaybackResult(0, 0.0, None)
    with pytest.raises(ValueError):
        simulate_playback([(10.0, 20.0), (5.0, 20.0)], 0)


def test_hint_is_never_negative_and_validates() -> None:
    assert prebuffer_ms(0.0, [100, 100], 0) == 0
    assert start_delay_ms(0.0, [100, 100], 0) == 0
    assert prebuffer_ms(0.3, [], 40) == 40
    for bad in ((-0.1, [100.0], 40.0), (0.5, [-1.0], 40.0), (0.5, [100.0], -1.0)):
        with pytest.raises(ValueError):
            prebuffer_ms(*bad)
    with pytest.raises(ValueError):
        prebuffer_ms(0.5, [100.0, 100.0], 40.0, ready_ms=[0.0])


def test_heard_chunks_by_hand() -> None:
    # 48 kHz, 20 ms frames (960 samples): whole frames go out, the partial one
    # waits for the next chunk; 6.5 ms of pre-skip come off the very start
    assert heard_chunks_ms([3500, 3500, 10000], 48000, 960, skip_ms=6.5) == [53.5, 0.0, 140.0]
    assert heard_chunks_ms([0, 960], 48000, 960) == [0.0, 20.0]
    assert heard_chunks_ms([], 48000, 960) == []
    # pre-skip longer than what went out: nothing heard yet, never negative
    assert heard_chunks_ms([960, 1920], 48000, 960, skip_ms=30.0) == [0.0, 10.0]
    with pytest.raises(ValueError):
        heard_chunks_ms([960, 10], 48000, 960)  # not cumulative
    with pytest.raises(ValueError):
        heard_chunks_ms([960], 48000, 0)
    with pytest.raises(ValueError):
        heard_chunks_ms([960], 48000, 960, skip_ms=-1.0)


def test_ahead() -> None:
    assert ahead_ms(1000.0, 400.0) == 600.0
    assert ahead_ms(200.0, 500.0) == -300.0


# --- the guarantee, on generated timelines ----------------------------------------------

chunk_lists = st.lists(st.floats(1.0, 3000.0), min_size=1, max_size=8)


@st.composite
def timelines(draw: st.DrawFn, gated: bool) -> tuple[float, list[float], float, list[float] | None,
                                                      list[float], list[float], float]:
    chunks = draw(chunk_lists)
    n = len(chunks)
    r = draw(st.floats(0.0, 2.0))
    jitter = draw(st.floats(0.0, 100.0))
    ready = None
    if gated:  # when each segment's text arrives (in order)
        gaps = draw(st.lists(st.floats(0.0, 3000.0), min_size=n, max_size=n))
        ready = [sum(gaps[:k]) for k in range(n)]
    slow = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))  # actual r / planned r
    delays = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))  # of J
    offset = draw(st.floats(0.0, 500.0))  # time to first audio: shifts everything
    return r, chunks, jitter, ready, slow, delays, offset


def _actual_arrivals(r: float, chunks: list[float], jitter: float, ready: list[float] | None,
                     slow: list[float], delays: list[float],
                     offset: float, cost: list[float] | None = None) -> list[tuple[float, float]]:
    made = planned_arrivals([r * s for s in slow], chunks, ready, cost_ms=cost)
    out: list[tuple[float, float]] = []
    last = 0.0
    for (at, d), delay in zip(made, delays, strict=True):
        last = max(last, offset + at + jitter * delay)  # TCP delivers in order
        out.append((last, d))
    return out


@settings(max_examples=300, deadline=None)
@given(timelines(gated=False))
def test_no_underrun_with_constant_and_jittered_r_up_to_the_planned_r(
        case: tuple[float, list[float], float, None, list[float], list[float], float]) -> None:
    r, chunks, jitter, ready, slow, delays, offset = case
    hint = prebuffer_ms(r, chunks, jitter)
    assert hint >= 0
    assert simulate_playback(planned_arrivals(r, chunks), hint).underruns == 0  # constant r
    actual = _actual_arrivals(r, chunks, jitter, ready, slow, delays, offset)
    assert simulate_playback(actual, hint).underruns == 0


@settings(max_examples=300, deadline=None)
@given(timelines(gated=True))
def test_no_underrun_when_segments_wait_for_their_text(
        case: tuple[float, list[float], float, list[float], list[float], list[float],
                    float]) -> None:
    r, chunks, jitter, ready, slow, delays, offset = case
    hint = prebuffer_ms(r, chunks, jitter, ready_ms=ready)
    actual = _actual_arrivals(r, chunks, jitter, ready, slow, delays, offset)
    assert simulate_playback(actual, hint).underruns == 0


@settings(max_examples=300, deadline=None)
@given(chunks=chunk_lists, r=st.floats(0.05, 2.0))
def test_the_hint_is_the_least_that_works(chunks: list[float], r: float) -> None:
    hint = prebuffer_ms(r, chunks, 0.0)
    assume(hint > 0)  # else the listener starts on chunk 0 and nothing is smaller
    # the hint is D_m + 1 ms, m > 0: buffering only D_m starts on chunk m-1
    before = [sum(chunks[:k]) for k in range(len(chunks) + 1)]
    (m,) = [k for k, b in enumerate(before) if b == pytest.approx(hint - 1.0)]
    assert m > 0
    assert simulate_playback(planned_arrivals(r, chunks), before[m]).underruns >= 1


def test_a_smaller_prebuffer_underruns_in_a_constructed_case() -> None:
    chunks = [200.0, 400.0, 800.0, 1600.0]  # growing chunks, r = 0.6
    arrivals = planned_arrivals(0.6, chunks)
    hint = prebuffer_ms(0.6, chunks, 40.0)
    assert simulate_playback(arrivals, hint).underruns == 0
    assert simulate_playback(arrivals, hint - 41.0).underruns >= 1


# --- the r tracker -------------------------------------------------------------------------


def test_tracker_default_then_nearest_rank_percentiles() -> None:
    tracker = RtfTracker(HintConfig(default_rtf=0.7, window=10))
    assert tracker.percentile(0.95) == 0.7 and tracker.count == 0
    for i in range(1, 11):  # r = 0.1 .. 1.0
        tracker.observe(gen_s=i * 0.1, audio_s=1.0)
    assert tracker.percentile(0.5) == pytest.approx(0.5)
    assert tracker.percentile(0.95) == pytest.approx(1.0)
    assert tracker.percentile(0.0) == pytest.approx(0.1)
    assert tracker.percentile() == pytest.approx(1.0)  # the config's 0.95


def test_tracker_follows_load_through_its_window() -> None:
    tracker = RtfTracker(HintConfig(window=8))
    for _ in range(8):
        tracker.observe(0.1, 1.0)  # idle: r = 0.1
    assert tracker.percentile(0.95) == pytest.approx(0.1)
    tracker.observe(0.9, 1.0)  # load arrives
    assert tracker.percentile(0.95) == pytest.approx(0.9)
    for _ in range(8):
        tracker.observe(0.3, 1.0)
    assert tracker.percentile(0.95) == pytest.approx(0.3)  # the spike has left the window
    assert tracker.count == 8 and tracker.total == 17


def test_tracker_and_config_validate() -> None:
    tracker = RtfTracker()
    for gen, audio in ((-1.0, 1.0), (1.0, 0.0), (float("nan"), 1.0), (1.0, float("inf"))):
        with pytest.raises(ValueError):
            tracker.observe(gen, audio)
    with pytest.raises(ValueError):
        tracker.percentile(1.5)
    for bad in ({"jitter_ms": -1.0}, {"percentile": 2.0}, {"window": 0}, {"default_rtf": 0.0}):
        with pytest.raises(ValueError):
            HintConfig(**bad)


def test_rtf_tracker_forgets_observations_older_than_max_age() -> None:

    tracker = RtfTracker(HintConfig(max_age_s=30.0))
    tracker.observe(4.7, 1.0, now=0.0)  # a slow first call
    for t in range(1, 6):
        tracker.observe(0.2, 1.0, now=100.0 + t)
    assert tracker.percentile(0.95) == 4.7  # without a clock: the whole ring
    assert tracker.percentile(0.95, now=106.0) == 0.2
    assert tracker.percentile(0.95, now=1000.0) == 0.2  # all stale: the newest counts


@settings(max_examples=300, deadline=None)
@given(timelines(gated=False), st.data())
def test_no_underrun_when_chunks_wait_for_more_audio_than_they_hold(
        case: tuple[float, list[float], float, None, list[float], list[float], float],
        data: st.DataObject) -> None:
    # a streaming vocoder: chunk k waits for cost_k ms of model output
    r, chunks, jitter, ready, slow, delays, offset = case
    cost = data.draw(st.lists(st.floats(0.0, 3000.0), min_size=len(chunks),
                              max_size=len(chunks)))
    hint = prebuffer_ms(r, chunks, jitter, cost_ms=cost)
    actual = _actual_arrivals(r, chunks, jitter, ready, slow, delays, offset, cost)
    assert simulate_playback(actual, hint).underruns == 0


def test_snac_plan_needs_the_lookahead_in_the_hint() -> None:
    # SNAC's schedule: 32 ms after 1 frame, then 186 ms that waits for 4 more
    # frames (the lookahead), then chunks as long as what they wait for.
    plan = stream_plan(ChunkConfig(), 8)
    chunks = [1000.0 * n / 24000 for n, _ in plan]
    cost = [f * 2048 / 24.0 for _, f in plan]
    assert [f for _, f in plan][:3] == [1, 4, 4] and round(chunks[0]) == 32
    # A fast engine (r = 0.1) and a 10 ms network allowance: planned as if each
    # chunk cost only its own audio, the listener starts on the 32 ms chunk and
    # runs dry before the next one, which waited for 341 ms of frames.
    arrivals = planned_arrivals(0.1, chunks, cost_ms=cost)
    naive = prebuffer_ms(0.1, chunks, 10)
    assert simulate_playback(arrivals, naive).underruns == 1
    hint = prebuffer_ms(0.1, chunks, 10, cost_ms=cost)
    assert hint > chunks[0]  # wait for the second chunk
    assert simulate_playback(arrivals, hint).underruns == 0


# --- segments in flight --------------------------------------------------------------------


def test_live_rates_count_segments_in_flight_once_they_made_enough_audio() -> None:
    live = LiveRates(HintConfig(live_min_audio_s=1.0))
    assert live.percentile(0.95) is None
    live.begin("a", now=10.0)
    live.progress("a", audio_s=0.5, waited_s=0.0, now=10.4)  # too little audio yet
    assert live.percentile(0.95) is None and len(live) == 1
    live.progress("a", audio_s=2.0, waited_s=0.4, now=11.6)  # (1.6 - 0.4) / 2.0
    assert live.percentile(0.95) == pytest.approx(0.6)
    live.begin("b", now=11.0)
    live.progress("b", audio_s=1.0, waited_s=0.0, now=11.2)
    assert live.percentile(0.0) == pytest.approx(0.2)
    assert live.percentile(1.0) == pytest.approx(0.6)
    live.progress("unknown", audio_s=5.0, waited_s=0.0, now=12.0)  # never begun: ignored
    live.end("a")
    live.end("a")  # twice is harmless (a cancelled segment's finally)
    assert live.percentile(0.95) == pytest.approx(0.2) and len(live) == 1
    with pytest.raises(ValueError):
        live.percentile(1.5)
    with pytest.raises(ValueError):
        HintConfig(live_min_audio_s=0.0)


def test_rising_load_lengthens_the_hint_before_any_segment_completes() -> None:
    # 64 -> 128 streams on the H200: completed segments said r = 0.4, the ones
    # in flight already run at 0.7; a new stream must be told to buffer for 0.7
    from rtserver.core.stats import VoiceStats

    stats = VoiceStats(RtfTracker())
    for t in range(10):
        stats.rtf.observe(0.4, 1.0, now=float(t))
    assert stats.rtf_estimate(0.95, now=10.0) == pytest.approx(0.4)
    stats.live.begin("s1", now=10.0)
    stats.live.progress("s1", audio_s=2.0, waited_s=0.0, now=11.4)
    assert stats.rtf_estimate(0.95, now=11.4) == pytest.approx(0.7)
    plan = stream_plan(ChunkConfig(), 8)
    chunks = [1000.0 * n / 24000 for n, _ in plan]
    cost = [f * 2048 / 24 for _, f in plan]
    short = prebuffer_ms(0.4, chunks, 40.0, cost_ms=cost)
    assert prebuffer_ms(stats.rtf_estimate(0.95, 11.4), chunks, 40.0, cost_ms=cost) > short
    stats.live.end("s1")
    stats.live.begin("s2", now=12.0)
    stats.live.progress("s2", audio_s=2.0, waited_s=0.0, now=12.4)  # r = 0.2
    assert stats.rtf_estimate(0.95, now=12.4) == pytest.approx(0.4)  # never below completed


# --- r against load ----------------------------------------------------------------------


def test_load_slope_fits_a_line_and_says_nothing_without_spread() -> None:
    from rtserver.pacing.rates import LoadSlope

    fit = LoadSlope(halflife=1e9, min_spread=2.0)
    assert fit.slope() is None
    for _ in range(5):
        fit.observe(8, 0.25 + 0.004 * 8)
    assert fit.slope() is None  # one load only: no slope to tell
    for n in (16, 32, 64):
        fit.observe(n, 0.25 + 0.004 * n)
    assert fit.slope() == pytest.approx(0.004)
    falling = LoadSlope(halflife=1e9, min_spread=1.0)
    for n, r in ((1, 0.5), (10, 0.2)):
        falling.observe(n, r)
    assert falling.slope() == 0.0  # more streams never make one faster
    forgetting = LoadSlope(halflife=4, min_spread=1.0)
    for n in (1, 10) * 50:
        forgetting.observe(n, 0.1 + 0.01 * n)  # old regime
    for n in (1, 10) * 50:
        forgetting.observe(n, 0.1 + 0.05 * n)  # the voice got slower per stream
    assert forgetting.slope() == pytest.approx(0.05, rel=1e-3)
    with pytest.raises(ValueError):
        LoadSlope(halflife=0.0, min_spread=1.0)


def test_quantile_at_a_load_ignores_lighter_loads_and_extrapolates_above() -> None:
    tracker = RtfTracker(HintConfig(percentile=0.95))
    for t in range(20):
        tracker.observe(0.25, 1.0, now=0.5 * t, load=1)
    for t in range(20, 40):
        tracker.observe(0.40, 1.0, now=0.5 * t, load=64)
    # steady at 64: the 64-stream observations; without a load: the whole window
    assert tracker.percentile(0.95, now=20.0, load=64) == pytest.approx(0.40)
    assert tracker.percentile(0.5, now=20.0, load=64) == pytest.approx(0.40)
    assert tracker.percentile(0.5, now=20.0) == pytest.approx(0.25)
    # lighter load than lately: everything at or above it counts (erring long)
    assert tracker.percentile(0.95, now=20.0, load=1) == pytest.approx(0.40)
    # heavier than ever seen: the heaviest observations plus the fitted slope
    slope = tracker.load_slope
    assert slope == pytest.approx((0.40 - 0.25) / 63)
    assert tracker.percentile(0.95, now=20.0, load=128) == pytest.approx(0.40 + 64 * slope)
    with pytest.raises(ValueError):
        tracker.observe(0.1, 1.0, load=-1)


def test_a_cpu_voice_shares_its_workers_before_any_slope_is_known() -> None:
    # bench/results/cpu-piper-2026-12-03-capacity: Piper ran at r ~0.16 alone,
    # then 8 users started at once on its 2 worker threads and ran at r 0.6-0.96
    # with hints planned from 0.16: 7 of 8 underran on their first reply
    tracker = RtfTracker(HintConfig(percentile=0.95))
    for t in range(6):
        tracker.observe(0.16, 1.0, now=float(t), load=1)
    assert tracker.load_slope is None  # one load seen: no slope yet
    assert tracker.percentile(now=6.0, load=8) == pytest.approx(0.16)  # no prior: as before
    assert tracker.percentile(now=6.0, load=8, parallel=2) == pytest.approx(0.64)
    assert tracker.percentile(now=6.0, load=2, parallel=2) == pytest.approx(0.16)  # fits
    # loads 1 and 6 seen: the fitted slope wins over the prior
    for t in range(6, 12):
        tracker.observe(0.48, 1.0, now=float(t), load=6)
    slope = tracker.load_slope
    assert slope is not None
    assert tracker.percentile(now=12.0, load=8, parallel=2) == pytest.approx(0.48 + 2 * slope)
    # the prior scales from the heaviest load seen: at 6 on 2 workers it was shared already
    fresh = RtfTracker(HintConfig(percentile=0.95))
    for t in range(6):
        fresh.observe(0.48, 1.0, now=float(t), load=6)
    assert fresh.percentile(now=6.0, load=8, parallel=2) == pytest.approx(0.64)


def test_a_burst_is_planned_for_from_the_loads_before_it() -> None:
    # bench/results/h200-orpheus-v3-2026-12-03/run2/burst: levels of 8 and 32
    # users ran at r 0.32-0.33 and 0.47-0.49; then 64 users at once ran at
    # r 0.67 (p50) to 0.71 (p99) with 72 ms hints, and 54 of 64 underran
    tracker = RtfTracker()
    for k in range(24):
        tracker.observe(0.32 + 0.0005 * k, 1.0, now=k * 0.3, load=8)
    for k in range(40):
        tracker.observe(0.47 + 0.0005 * k, 1.0, now=10 + k * 0.2, load=32)
    before = tracker.percentile(0.95, now=20.0)  # what the hint used
    planned = tracker.percentile(0.95, now=20.0, load=64)
    assert before < 0.5 and 0.67 <= planned < 0.8
    plan = stream_plan(ChunkConfig(), 8)
    chunks = [1000.0 * n / 24000 for n, _ in plan]
    cost = [f * 2048 / 24 for _, f in plan]
    assert prebuffer_ms(before, chunks, 40.0, cost_ms=cost) == pytest.approx(72.0, abs=1)
    # the hint planned for covers the burst's measured p99 r (the guarantee
    # of prebuffer_ms, tested above, then says: no underrun)
    hint = prebuffer_ms(planned, chunks, 40.0, cost_ms=cost)
    assert hint >= prebuffer_ms(0.71, chunks, 40.0, cost_ms=cost) > 72.0
