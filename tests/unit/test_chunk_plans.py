"""``tools.measure.chunk_plans``: the trade-off it reports is the plan's own
arithmetic (a smaller chunk ceiling never makes the listener wait longer, and
never makes the decoder compute less), and its default row is the server's."""

from __future__ import annotations

import itertools

import pytest

from rtserver.core.first_heard import first_heard_ms
from rtserver.tools.measure.chunk_plans import FRAME_MS, decoded_per_frame, main, rows
from rtserver.vocoder.config import VocoderConfig
from rtserver.voices.orpheus import codes as ot
from rtserver.voices.token_voice import chunk_timing


def test_smaller_ceilings_trade_decoder_work_for_first_heard_audio() -> None:
    rtfs = [0.3, 0.72, 0.95]
    table = rows(rtfs, [16, 8, 4, 2], 2.0, [60], 40.0)
    for wide, narrow in itertools.pairwise(table):
        for r in rtfs:
            assert narrow[f"heard_{r}"] <= wide[f"heard_{r}"] + 1e-9
        assert narrow["decoded_per_frame_60"] >= wide["decoded_per_frame_60"] - 1e-9
    # at r 0.72 the default's doubling chunks make the listener wait far longer
    assert table[0]["heard_0.72"] > 1.5 * table[1]["heard_0.72"]
    assert all(row["decoded_per_frame_60"] > 1.0 for row in table)  # context + lookahead


def test_the_default_row_is_the_servers_plan() -> None:
    config = VocoderConfig()
    plan, cost = chunk_timing(config.chunk_config(ot.SAMPLES_PER_FRAME), ot.SAMPLE_RATE,
                              FRAME_MS)
    row = rows([0.5], [config.max_chunk_frames], config.growth, [24], 40.0)[0]
    assert row["heard_0.5"] == first_heard_ms(0.5, list(plan), 40.0, cost_ms=list(cost))
    assert decoded_per_frame(config.chunk_config(ot.SAMPLES_PER_FRAME),
                             24) == row["decoded_per_frame_24"]


def test_the_first_segments_growth_starts_the_listener_sooner_for_the_same_work() -> None:
    """The first segment's plan with ``first_growth`` 1.5 against doubling (the
    default, 0: ``growth``), both capped at ``first_max_chunk_frames``: never a
    later first hearing at any r, a sooner one at r 0.6, and no more decoder
    work over a 24-frame segment (by the model; see ``VocoderConfig``)."""
    exact = 0  # first_segment_lookahead_samples: both at the exact lookahead
    config = VocoderConfig(first_growth=1.5, first_segment_lookahead_samples=exact)
    first = config.first_chunk_config(ot.SAMPLES_PER_FRAME)
    assert first.growth == 1.5
    assert first.max_chunk_frames == config.first_max_chunk_frames
    doubling = VocoderConfig(first_segment_lookahead_samples=exact).first_chunk_config(
        ot.SAMPLES_PER_FRAME)
    assert doubling.growth == VocoderConfig().growth == 2.0
    heard = {}
    for name, plan_config in (("first", first), ("doubling", doubling)):
        plan, cost = chunk_timing(plan_config, ot.SAMPLE_RATE, FRAME_MS)
        heard[name] = [first_heard_ms(r, list(plan), 40.0, cost_ms=list(cost))
                       for r in (0.4, 0.5, 0.6, 0.7, 0.85)]
    assert all(a <= b + 1e-9 for a, b in zip(heard["first"], heard["doubling"], strict=True))
    assert heard["first"][2] < 0.7 * heard["doubling"][2]  # r 0.6
    assert decoded_per_frame(first, 24) <= decoded_per_frame(doubling, 24) + 1e-9
    assert VocoderConfig(first_growth=0).first_chunk_config(ot.SAMPLES_PER_FRAME).growth == 2.0


def test_the_first_segments_shorter_lookahead_starts_the_listener_sooner() -> None:
    """A context's first segment with ``first_segment_lookahead_samples`` (the
    default, 3,584) against the exact lookahead: never a later first hearing at
    any r, a sooner one at r 0.55-0.65, and the same decoder work over a
    24-frame segment (by the model; see ``VocoderConfig``)."""
    short = VocoderConfig().first_chunk_config(ot.SAMPLES_PER_FRAME)
    exact = VocoderConfig(first_segment_lookahead_samples=0).first_chunk_config(
        ot.SAMPLES_PER_FRAME)
    assert short.lookahead_samples == VocoderConfig().first_segment_lookahead_samples
    assert exact.lookahead_samples == VocoderConfig().lookahead_samples
    assert VocoderConfig().chunk_config(ot.SAMPLES_PER_FRAME).lookahead_samples == (
        exact.lookahead_samples)  # later segments stay exact
    rtfs = [r / 20 for r in range(2, 40)]
    heard = {}
    for name, plan_config in (("short", short), ("exact", exact)):
        plan, cost = chunk_timing(plan_config, ot.SAMPLE_RATE, FRAME_MS)
        heard[name] = {r: first_heard_ms(r, list(plan), 40.0, cost_ms=list(cost))
                       for r in rtfs}
    assert all(heard["short"][r] <= heard["exact"][r] + 1e-9 for r in rtfs)
    for r in (0.55, 0.6, 0.65):
        assert heard["short"][r] < 0.7 * heard["exact"][r]
    assert decoded_per_frame(short, 24) == decoded_per_frame(exact, 24)


def test_the_first_segment_rows_are_the_servers_first_plan() -> None:
    """``--first-segment``: the default row is a context's first segment's plan
    as the server makes it (``first_chunk_config``), not a later segment's."""
    config = VocoderConfig(first_growth=1.25)
    first = config.first_chunk_config(ot.SAMPLES_PER_FRAME)
    plan, cost = chunk_timing(first, ot.SAMPLE_RATE, FRAME_MS)
    row = rows([0.7], [config.first_max_chunk_frames], 1.25, [24], 40.0, first_segment=True)[0]
    assert row["heard_0.7"] == first_heard_ms(0.7, list(plan), 40.0, cost_ms=list(cost))
    assert row["decoded_per_frame_24"] == decoded_per_frame(first, 24)
    later = rows([0.7], [config.first_max_chunk_frames], 1.25, [24], 40.0)[0]
    assert later["heard_0.7"] != row["heard_0.7"]  # the later plan waits the exact lookahead


def test_held_rows_are_a_later_segment_that_starts_with_the_time_held(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--held-s``: a later segment whose listener holds that much audio
    (``VocoderConfig.held_start``) decodes fewer frames in fewer windows than
    one that restarts at 1 frame, and has no hint columns (its listener is
    playing)."""
    held = rows([0.7], [16], 2.0, [24, 60], 40.0, held_s=1.7)[0]
    plain = rows([0.7], [16], 2.0, [24, 60], 40.0)[0]
    for n in (24, 60):
        assert held[f"decoded_per_frame_{n}"] < plain[f"decoded_per_frame_{n}"]
        assert held[f"windows_{n}"] < plain[f"windows_{n}"]
    assert "hint_0.7" in plain and "hint_0.7" not in held
    main(["--held-s", "1.7", "--max-chunk-frames", "16", "--segment-frames", "24"])
    out = capsys.readouterr().out
    assert "later segments, 1.7 s held" in out and "| 16 | 1.21, 2 |" in out
