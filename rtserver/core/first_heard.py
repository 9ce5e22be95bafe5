"""The one model of first heard audio: the chunks a context's ``buffer`` hint
plans with, and when a listener that honours the hint starts playing.

The context's hints (``Speaker``) and admission (``SpeechCore.
predicted_first_heard_ms``, asked by the WebSocket connection and the HTTP
speech API through ``Gate.start``) both use it, so a prediction is the
context's own first hint played out. Pure: no asyncio, times passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rtserver.core.framing import HeardFormat
from rtserver.core.stats import VoiceStats
from rtserver.pacing.hints import HintConfig, planned_arrivals, prebuffer_ms
from rtserver.voices.base import VoiceInfo

# Characters a new context's first segment is predicted to hold: the eager
# first segment's words (SegmenterConfig.first_max_words is 6) times
# characters per English word with its space (about 6).
FIRST_SEGMENT_CHARS = 36
# Segments a hint plans with after the current one (their sizes grow with the
# segmenter's limits, which bounds the wait).
LATER_SEGMENTS = 4

Chunks = tuple[list[float], list[float] | None]  # durations (ms), model costs (ms) or None


def hint_chunks(info: VoiceInfo, heard: HeardFormat, *, at_start: bool, segment_chars: int,
                index: int, audio_ms_per_char: float, limit: Callable[[int], int]) -> Chunks:
    """The chunks a hint plans with, and what each costs the model.

    A streaming voice: its own chunk plan as the listener gets it
    (``HeardFormat.chunks_ms``; ``at_start``: the context's first audio,
    less the decoder's pre-skip) with the voice's chunk costs (its
    first-segment plan for segment 0, where it has one). Otherwise
    segment ``index`` of ``segment_chars`` characters and the next
    ``LATER_SEGMENTS`` at the segmenter's ``limit`` for their index (later
    segments are not known yet: plan for the longest allowed)."""
    plan, costs = info.chunk_plan_ms, info.chunk_cost_ms
    if index == 0 and info.first_chunk_plan_ms:
        plan, costs = info.first_chunk_plan_ms, info.first_chunk_cost_ms
    if plan:
        cost = list(costs) if len(costs) == len(plan) else None
        return heard.chunks_ms(plan, at_start=at_start), cost
    first = segment_chars * audio_ms_per_char
    return [first, *(limit(index + k) * audio_ms_per_char
                     for k in range(1, LATER_SEGMENTS + 1))], None


def queued_ahead_ms(starting_ahead: int, rtf: float, chunk_ms: Sequence[float],
                    info: VoiceInfo) -> float:
    """Work queued ahead of a context's later chunks, in ms: the first chunks
    of the ``starting_ahead`` other contexts starting now, which a voice serves
    first (a CPU voice's first-chunk lane), each about this context's own
    first chunk at ``rtf``, shared by the first chunks ``info``'s voice makes
    at once: its worker threads (``parallel_segments``), else its engine's
    rows (``batch_rows``: a storm's starts are prefilled and decoded in one
    batch), else one. A hint that adds it to its prebuffer keeps the listener
    playing while they are made; admission adds it to the first heard audio
    it predicts."""
    if starting_ahead <= 0 or not chunk_ms:
        return 0.0
    lanes = max(1, info.parallel_segments or info.batch_rows)
    return starting_ahead * rtf * chunk_ms[0] / lanes


def first_heard_ms(rtf: float, chunk_ms: Sequence[float], jitter_ms: float, *,
                   cost_ms: Sequence[float] | None = None) -> float:
    """Time from the text that completes the first segment to the moment a
    listener honouring the ``buffer`` hint starts playing: chunks are made one
    after another at ``rtf`` (``hints.planned_arrivals``) and playback starts
    once the hint's amount of audio (``hints.prebuffer_ms``, which holds the
    jitter allowance) has arrived. ``chunk_ms``: the chunks the hint plans
    with (``hint_chunks``)."""
    if not chunk_ms:
        return 0.0
    arrivals = planned_arrivals(rtf, chunk_ms, cost_ms=cost_ms)
    need = prebuffer_ms(rtf, chunk_ms, jitter_ms, cost_ms=cost_ms)
    held = 0.0
    for at, duration in arrivals:
        held += duration
        if held >= need - 1e-6:
            return at
    return arrivals[-1][0]  # the whole plan is shorter than the hint: all of it


def predicted_first_heard_ms(stats: VoiceStats, info: VoiceInfo, heard: HeardFormat,
                             hints: HintConfig, limit: Callable[[int], int],
                             now: float) -> float:
    """First heard audio of a context opened now: its first hint's chunks
    (a first segment of ``FIRST_SEGMENT_CHARS``, at most the segmenter's
    first limit) at the r that hint will plan with: ``rtf_estimate`` with
    the new context counted in the load, and the work of the contexts
    starting now queued ahead of it (``queued_ahead_ms`` of ``ServerLoad.
    starting_ahead``: other front ends' too, for a voice behind a GPU
    worker). 0.0 before the voice is measured
    (no warm-up yet): ``default_rtf`` errs long for hints, and is no ground
    to refuse a context on."""
    if not stats.measured:
        return 0.0
    rtf = stats.rtf_estimate(hints.percentile, now, extra_load=1)
    chunks, cost = hint_chunks(info, heard, at_start=True,
                               segment_chars=min(limit(0), FIRST_SEGMENT_CHARS), index=0,
                               audio_ms_per_char=stats.audio_ms_per_char, limit=limit)
    ahead = queued_ahead_ms(stats.load.starting_ahead(info.name, now), rtf, chunks, info)
    # its hint asks for that much more audio, and its own chunks wait for them
    return ahead + first_heard_ms(rtf, chunks, hints.jitter_ms + ahead, cost_ms=cost)


__all__ = ["FIRST_SEGMENT_CHARS", "LATER_SEGMENTS", "first_heard_ms", "hint_chunks",
           "predicted_first_heard_ms", "queued_ahead_ms"]
