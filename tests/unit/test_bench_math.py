"""The benchmark's maths: percentiles, the simulated listener, the TTFA rule."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtserver.tools.bench import report
from rtserver.tools.bench.corpus import CORPUS, fragments, llm_tokens, token_offsets, words
from rtserver.tools.bench.listener import ListenerConfig, simulate
from rtserver.tools.bench.measure import TurnRecord, analyze, completing_send
from rtserver.tools.bench.stats import ecdf, percentile, summarize

# --- percentiles ---------------------------------------------------------------------


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=200),
       st.floats(0, 100))
def test_percentile_matches_numpys_linear_definition(xs: list[float], q: float) -> None:
    got = percentile(xs, q)
    assert got == pytest.approx(float(np.percentile(xs, q)), rel=1e-9, abs=1e-6)


def test_percentile_small_cases() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(range(1, 101), 99) == pytest.approx(99.01)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_skips_missing_values() -> None:
    s = summarize([None, 3.0, 1.0, None, 2.0])
    assert (s.n, s.p50, s.max, s.mean) == (3, 2.0, 3.0, 2.0)
    assert summarize([None]).n == 0


def test_ecdf_reaches_one() -> None:
    xs, ys = ecdf([3.0, 1.0, 2.0])
    assert xs == [1.0, 2.0, 3.0]
    assert ys == pytest.approx([1 / 3, 2 / 3, 1.0])


# --- the listener ---------------------------------------------------------------------
# frames of 20 ms; times in seconds


def test_frames_ahead_of_real_time_never_underrun() -> None:
    arrivals = [(0.000 + 0.010 * k, 1) for k in range(50)]  # twice real time
    p = simulate(arrivals, 20)
    assert (p.underruns, p.stalled_ms) == (0, 0.0)
    assert p.start_at == 0.0
    assert p.end_at == pytest.approx(1.0)
    assert p.audio_ms == 1000


def test_exactly_real_time_is_not_an_underrun() -> None:
    p = simulate([(0.020 * k, 1) for k in range(10)], 20)
    assert p.underruns == 0


def test_one_late_frame_is_one_underrun_with_its_stall() -> None:
    # frame 5 should play at 0.100 but arrives at 0.130; no prebuffer
    arrivals = [(0.0, 5), (0.130, 5)]
    p = simulate(arrivals, 20)
    assert p.underruns == 1
    assert p.stalls[0].at == pytest.approx(0.100)
    assert p.stalled_ms == pytest.approx(30.0)
    assert p.end_at == pytest.approx(0.130 + 0.100)


def test_prebuffer_hint_absorbs_the_late_frame() -> None:
    # with 40 ms buffered first, playback starts at 0.030 and frame 5 plays at 0.130
    arrivals = [(0.0, 1), (0.030, 4), (0.130, 5)]
    hints = [(0.0, 40.0)]
    p = simulate(arrivals, 20, hints)
    assert p.start_at == pytest.approx(0.030)
    assert p.underruns == 0


def test_rebuffering_after_an_underrun_waits_for_the_prebuffer_again() -> None:
    # start with 2 frames (40 ms); frame 2 is late; resume needs 2 frames again
    arrivals = [(0.0, 2), (0.100, 1), (0.150, 1), (0.160, 6)]
    hints = [(0.0, 40.0)]
    p = simulate(arrivals, 20, hints)
    assert p.start_at == 0.0
    assert p.underruns == 1
    assert p.stalls[0].at == pytest.approx(0.040)
    assert p.stalled_ms == pytest.approx(110.0)  # resumes at 0.150 with frames 2, 3
    no_rebuffer = simulate(arrivals, 20, hints, config=ListenerConfig(rebuffer=False))
    assert no_rebuffer.stalls[0].ms == pytest.approx(60.0)  # resumes on frame 2 at 0.100
    assert no_rebuffer.underruns == 2  # frame 3 (due 0.120) arrives at 0.150


def test_a_later_hint_raises_the_prebuffer_before_the_start() -> None:
    arrivals = [(0.0, 1), (0.010, 1), (0.050, 3)]
    p = simulate(arrivals, 20, [(0.0, 20.0)])
    assert p.start_at == 0.0
    p2 = simulate(arrivals, 20, [(0.0, 100.0)])
    assert p2.start_at == pytest.approx(0.050)  # 5 frames there at 0.050


def test_a_short_context_starts_once_all_of_it_is_known_to_be_there() -> None:
    # prebuffer 1 s, but the whole context is 3 frames, known complete at 0.02
    p = simulate([(0.0, 2), (0.010, 1)], 20, [(0.0, 1000.0)], end_known_at=0.020)
    assert p.start_at == pytest.approx(0.020)
    assert p.underruns == 0


def test_a_cancelled_stream_does_not_underrun_after_its_last_frame() -> None:
    p = simulate([(0.0, 10)], 20, end_known_at=5.0)
    assert p.underruns == 0
    assert p.end_at == pytest.approx(0.2)


def test_no_frames_no_playback() -> None:
    p = simulate([], 20)
    assert (p.frames, p.start_at, p.underruns) == (0, None, 0)


def test_arrivals_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError):
        simulate([(0.1, 1), (0.0, 1)], 20)


@given(st.lists(st.tuples(st.floats(0, 0.2), st.integers(1, 5)), min_size=1, max_size=40),
       st.floats(0, 200))
def test_listener_accounting_is_consistent(steps: list[tuple[float, int]],
                                           prebuffer: float) -> None:
    t = 0.0
    arrivals = []
    for gap, count in steps:
        t += gap
        arrivals.append((t, count))
    p = simulate(arrivals, 20, [(0.0, prebuffer)])
    frames = sum(c for _, c in arrivals)
    assert p.frames == frames
    assert p.start_at is not None and p.end_at is not None
    # playing time plus stalls covers the span from start to end exactly
    assert (p.end_at - p.start_at) * 1000 == pytest.approx(frames * 20 + p.stalled_ms, abs=1e-6)
    assert p.underruns == len(p.stalls)
    assert all(s.ms > 0 for s in p.stalls)
    # the last frame cannot finish playing before it arrived plus its own duration
    assert p.end_at >= arrivals[-1][0] + 0.020 - 1e-9


# --- TTFA: which send completed the first segment --------------------------------------

Sent = tuple[tuple[float, int, int], ...]


def _sent(text_pieces: list[str], times: list[float]) -> tuple[str, Sent]:
    out = []
    pos = 0
    for piece, t in zip(text_pieces, times, strict=True):
        out.append((t, pos, pos + len(piece)))
        pos += len(piece)
    return "".join(text_pieces), tuple(out)


def test_first_clause_is_completed_by_the_fragment_carrying_its_punctuation() -> None:
    text, sent = _sent(["Sure", ",", " I", " can", " help", "."], [0.0, 0.025, 0.05, 0.075,
                                                                  0.1, 0.125])
    rec = TurnRecord(text=text, frame_ms=20, text_sent=sent, end_sent_at=0.13,
                     seg0_source=(0, 6), arrivals=((0.080, 0, 3),))
    assert completing_send(rec) == (0.025, "text")
    a = analyze(rec)
    assert a["ttfa_ms"] == pytest.approx(55.0)
    assert a["ttfa_first_text_ms"] == pytest.approx(80.0)
    assert a["completed_by"] == "text"
    # " I" went out at 0.050, before the first frame: a look-ahead server may have
    # waited for it
    assert a["ttfa_after_lookahead_ms"] == pytest.approx(30.0)
    late = analyze(TurnRecord(text=text, frame_ms=20, text_sent=(*sent[:2], (0.09, 6, 8)),
                              seg0_source=(0, 6), arrivals=((0.080, 0, 3),)))
    assert late["ttfa_after_lookahead_ms"] == late["ttfa_ms"] == pytest.approx(55.0)


def test_closing_quote_and_markdown_after_punctuation_still_count_as_the_boundary() -> None:
    text, sent = _sent(["**Hello", ".**", " More"], [0.0, 0.1, 0.2])
    rec = TurnRecord(text=text, frame_ms=20, text_sent=sent, seg0_source=(0, 10))
    assert completing_send(rec) == (0.1, "text")


def test_a_segment_without_punctuation_is_completed_by_flush_or_end() -> None:
    text, sent = _sent(["Hello", " world"], [0.0, 0.1])
    by_end = TurnRecord(text=text, frame_ms=20, text_sent=sent, end_sent_at=0.3,
                        seg0_source=(0, 11))
    assert completing_send(by_end) == (0.3, "end")
    by_flush = TurnRecord(text=text + " again", frame_ms=20,
                          text_sent=(*sent, (0.5, 11, 17)), flushes=((0.2, 11),),
                          end_sent_at=0.6, seg0_source=(0, 12))
    assert completing_send(by_flush) == (0.2, "flush")


def test_a_long_clause_cut_at_a_word_counts_from_the_fragment_with_its_last_letter() -> None:
    text, sent = _sent(["one", " two", " three", " four"], [0.0, 0.1, 0.2, 0.3])
    rec = TurnRecord(text=text, frame_ms=20, text_sent=sent, end_sent_at=0.4,
                     seg0_source=(0, 8))  # "one two " cut by a length limit
    assert completing_send(rec) == (0.1, "text")


def test_cancel_figures() -> None:
    rec = TurnRecord(text="Hi.", frame_ms=20, text_sent=((0.0, 0, 3),), seg0_source=(0, 3),
                     arrivals=((0.05, 0, 10), (0.30, 10, 5), (0.31, 15, 2)),
                     outcome="cancelled", cancel_sent_at=0.29, cancelled_at=0.33,
                     cancelled_last_seq=16)
    a = analyze(rec)
    assert a["cancel_to_cancelled_ms"] == pytest.approx(40.0)
    assert a["cancel_to_last_frame_ms"] == pytest.approx(20.0)
    assert a["frames_after_cancel"] == 7
    # frames 0-9 play from 0.05 to 0.25; frame 10 comes at 0.30: one underrun
    assert a["underruns"] == 1
    assert a["stalled_ms"] == pytest.approx(50.0)


def test_analyze_flags_an_underrun_and_the_time_behind_real_time() -> None:
    rec = TurnRecord(text="Hi.", frame_ms=20, text_sent=((0.0, 0, 3),), seg0_source=(0, 3),
                     arrivals=((0.05, 0, 5), (0.25, 5, 5)), finished_at=0.25)
    a = analyze(rec)
    assert a["underruns"] == 1
    assert a["stalled_ms"] == pytest.approx(100.0)
    assert a["gap_max_ms"] == pytest.approx(200.0)
    assert a["behind_max_ms"] == pytest.approx(100.0)


# --- corpus -------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["whole", "word", "token"])
def test_fragments_join_back_to_the_text(mode: str) -> None:
    for u in CORPUS:
        assert "".join(fragments(u.text, mode)) == u.text


def test_tokens_look_like_an_llms() -> None:
    assert llm_tokens("Hello, world 12345.") == ["Hello", ",", " world", " 123", "45", "."]
    assert words("a  b\nc") == ["a", "  b", "\nc"]
    assert llm_tokens("你好。") == ["你", "好", "。"]


def test_token_offsets_are_reproducible_and_average_the_rate() -> None:
    a = token_offsets(2001, 40.0, 0.3, random.Random(7))
    b = token_offsets(2001, 40.0, 0.3, random.Random(7))
    assert a == b
    assert a[0] == 0.0
    assert all(y > x for x, y in itertools.pairwise(a))
    assert a[-1] / 2000 == pytest.approx(1 / 40, rel=0.05)
    assert token_offsets(3, 10.0, 0.0, random.Random(1)) == pytest.approx([0.0, 0.1, 0.2])


# --- capacity and the report ------------------------------------------------------------

def _samples(level: int, ttfa: list[float], underruns: int = 0, errors: int = 0
             ) -> list[dict[str, object]]:
    out: list[dict[str, object]] = [
        {"system": "rtserver", "run": "sweep", "load": "stream/word", "level": level,
         "kind": "stream", "outcome": "done", "ttfa_ms": t, "ttfa_first_text_ms": t + 100,
         "frames": 50, "audio_ms": 1000, "underruns": 0, "stalled_ms": 0.0} for t in ttfa]
    for s in out[:underruns]:
        s["underruns"] = 1
        s["stalled_ms"] = 40.0
    out += [{"system": "rtserver", "run": "sweep", "load": "stream/word", "level": level,
             "kind": "stream", "outcome": "error", "error": "overloaded"}] * errors
    return out


def test_capacity_is_the_last_level_before_the_first_failure() -> None:
    samples = (_samples(1, [40, 45, 50]) + _samples(4, [50, 60, 70])
               + _samples(8, [60, 80, 400])  # p99 over the bound
               + _samples(16, [70, 80, 90]))  # passes again: reported, not counted
    rows = report.aggregate(samples)
    (cap,) = report.capacity(rows, ttfa_p99_ms=150)
    assert (cap.streams, cap.highest_passing, cap.first_failing) == (4, 16, 8.0)
    assert "TTFA p99" in cap.why_failing
    text = report.markdown(_results(), rows, [cap])
    assert "4 concurrent real-time streams with TTFA p99 under 150 ms" in text
    assert "| 8 | 3 | 80 |" in text  # level, contexts, p50


def test_an_underrun_or_an_error_fails_a_level() -> None:
    rows = report.aggregate(_samples(1, [10, 10]) + _samples(2, [10, 10], underruns=1)
                            + _samples(4, [10], errors=1))
    assert [report.passes(r, 100) for r in rows] == [True, False, False]
    (cap,) = report.capacity(rows, 100)
    assert cap.streams == 1
    assert "1/2 contexts underran" in cap.why_failing
    assert rows[2].stats["errors"] == 1 and rows[2].stats["error_codes"] == ["overloaded"]


def test_baseline_ratios_pair_levels() -> None:
    rt = _samples(1, [50, 50])
    base = [{**s, "system": "baseline", "ttfa_ms": 500.0, "ttfa_first_text_ms": 1500.0}
            for s in rt]
    (line,) = report.ratios(report.aggregate(rt + base))
    assert line[:2] == ["stream/word", "1"]
    assert line[3] == "10.0×" and line[5] == "10.0×"


def _results() -> dict[str, object]:
    return {"meta": {"date": "d", "machine": {"cpu": "c", "cores": 2, "memory_gib": 1.0,
                                              "os": "o"},
                     "versions": {"python": "3"}, "server": "s", "voice": "v",
                     "command": "python -m bench", "notes": []},
            "config": {"seed": "0", "duration_s": 1.0, "fragment": "word",
                       "tokens_per_s": 40.0, "jitter": 0.3, "format": "opus",
                       "sample_rate": 48000, "frame_ms": 20},
            "steps": []}


def test_cpu_table_gives_cpu_seconds_per_second_of_audio() -> None:
    samples = [{**s, "audio_ms": 5000.0} for s in _samples(20, [50, 60, 70, 80])]
    results = {**_results(), "samples": samples, "steps": [
        {"system": "rtserver", "run": "sweep", "load": "stream/word", "level": 20,
         "seconds": 10.0, "cpu": {"busy_cores": 1.9, "ours_cores": 1.8, "other_cores": 0.1,
                                  "stolen_cores": 0.0}},
        {"system": "rtserver", "run": "sweep", "load": "stream/word", "level": 24,
         "seconds": 10.0, "cpu": {"busy_cores": 1.9, "ours_cores": 1.8, "other_cores": 0.1}}]}
    assert report.step_audio_s(samples) == {("rtserver", "sweep", "stream/word", 20.0): 20.0}
    text = report.markdown(results, report.aggregate(samples), [])
    # 1.8 cores x 10 s for 4 x 5 s of audio
    assert "| rtserver | stream/word | 20 | 10 | 1.90 | 1.80 | 0.10 | 0.00 | 0.900 |" in text
    # a results file from before steal was counted: the column left blank
    assert "| rtserver | stream/word | 24 | 10 | 1.90 | 1.80 | 0.10 | – | – |" in text


def test_cpu_meter_counts_the_spawned_servers_children() -> None:
    """A supervisor's children (GPU worker, front ends) are the server's CPU,
    not "other processes": a grandchild is found under the bench's pid."""
    import os
    import subprocess
    import sys

    from rtserver.tools.bench.machine import with_descendants

    outer = subprocess.Popen([sys.executable, "-c",
                              "import subprocess, sys; p = subprocess.Popen([sys.executable, "
                              "'-c', 'import sys; sys.stdin.read()'], stdin=subprocess.PIPE); "
                              "print(p.pid, flush=True); sys.stdin.read(); p.stdin.close(); "
                              "p.wait()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert outer.stdout is not None
        inner = int(outer.stdout.readline())
        tree = with_descendants([os.getpid()])
        assert outer.pid in tree and inner in tree
        assert inner not in with_descendants([outer.pid + 10**7])  # no such process
    finally:
        assert outer.stdin is not None
        outer.stdin.close()
        outer.wait(30)


def test_worker_ipc_bench_smoke(tmp_path: Path) -> None:
    """The link benchmark runs a worker process and writes every chunk's count."""
    import json

    from rtserver.tools.bench.worker_ipc import main

    assert main(["--streams", "2", "--chunk-samples", "512", "--chunks", "10",
                 "--realtime", "50", "--out", str(tmp_path)]) == 0
    (level,) = json.loads((tmp_path / "results.json").read_text())["levels"]
    assert level["streams"] == 2 and level["chunks"] == 20 and level["samples"] == 20 * 512


def test_first_segment_guesses_are_summed_over_voices() -> None:
    series = {"outcome=started,voice=a": 3.0, "outcome=adopted,voice=a": 2.0,
              "outcome=dropped,voice=a": 1.0, "outcome=started,voice=b": 1.0,
              "outcome=adopted,voice=b": 1.0}
    assert report._guesses(series) == "4 / 3 / 1"
    assert report._guesses({}) == "–"


def test_cpu_meter_tells_steal_apart_from_other_processes(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Time the hypervisor gave other guests is counted busy by /proc/stat but is
    neither ours nor another process's: its own column."""
    from rtserver.tools.bench import machine

    busy = iter([(100.0, 10.0), (120.0, 15.0)])  # 20 busy s in the step, 5 of them stolen
    ours = iter([50.0, 62.0])  # the bench's own process: 12 s
    monkeypatch.setattr(machine, "cpu_busy_s", lambda: next(busy))
    monkeypatch.setattr(machine, "process_cpu_s", lambda pid: next(ours))
    monkeypatch.setattr(machine, "with_descendants", lambda pids: list(pids))
    meter = machine.CpuMeter([1])
    meter.start()
    assert meter.stop(10.0) == {"busy_cores": 2.0, "ours_cores": 1.2,
                                "other_cores": pytest.approx(0.3), "stolen_cores": 0.5}


@pytest.mark.parametrize(("bf16", "said"), [(True, "(2 cores, 1.0 GiB, native bf16)"),
                                            (False, "(2 cores, 1.0 GiB, no native bf16)"),
                                            (None, "(2 cores, 1.0 GiB)")])
def test_the_machine_line_says_whether_piper_could_run_in_bf16(bf16: bool | None,
                                                                said: str) -> None:
    results = _results()
    if bf16 is not None:
        results["meta"]["machine"]["native_bf16"] = bf16
    text = report.markdown(results, report.aggregate([]), [])
    assert f"- Machine: c {said}" in text
