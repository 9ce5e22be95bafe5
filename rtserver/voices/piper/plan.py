"""How a Piper sentence's decoder work is cut into chunks. Pure: no onnx.

The front (encoder, duration predictor, flow) gives all of a sentence's
latent frames at once; the decoder then runs on windows of them, planned by
``rtserver.vocoder.chunking`` as if the frames arrived one at a time. Two
geometries: *eager* chunks grow from a small first one (TTFA), each
``growth`` times the last up to ``max_chunk_ms``; *bulk* chunks are
``max_chunk_ms`` from the start, for a sentence whose audio is not needed
soon (every chunk boundary costs the decoder its context and lookahead
again: on four sentences, eager decodes 1.25x the frames, bulk 1.10x;
``python -m rtserver.tools.measure.piper costs``); *near* chunks start at
``near_chunk_ms`` for a later sentence needed soon. Context and lookahead
are the decoder's measured receptive field (``graph.measure_decoder``:
2582 samples for ``en_US-joe-medium``), so every seam equals the
whole-sentence decode up to float rounding; the crossfade (windows summing
to one) hides that rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rtserver.vocoder.chunking import ChunkConfig, ChunkPlanner, DecodeJob

# The front's compute per frame of latent, relative to the decoder's, for the
# hint's cost model: 0.53 measured on en_US-joe-medium on this 2-core CPU
# (CPU time, one thread, four sentences, blocked 2-D decoder: front with
# phonemizing 0.023 s per audio s, decoder 0.044; ``python -m
# rtserver.tools.measure.piper costs``).
FRONT_COST_RATIO = 0.53


@dataclass(frozen=True, slots=True)
class PiperChunking:
    """Chunk sizes in milliseconds of audio (converted with the voice's rate)."""

    # Audio of the first chunk. It costs ~0.6 ms of one core per 11.6 ms
    # frame, so 100 rather than 60 ms adds ~2 ms to TTFA, and lets a listener
    # start on it (hint: start on chunk 0 iff r * c_1 + jitter 40 ms <= d_0,
    # which holds for r up to ~0.15: d_0 109 ms, c_1 449 ms).
    first_chunk_ms: float = 100.0
    growth: float = 2.0
    max_chunk_ms: float = 1500.0  # one decode call: ~0.1 s of one core at most
    # A context's first sentence is decoded eagerly (TTFA). A later one whose
    # audio the listener needs within ``eager_slack_ms`` (its deadline) starts
    # with a ``near_chunk_ms`` chunk, then grows; any other in bulk. 250 ms: a
    # bulk chunk's decode (~80 ms of one core) plus a few queued ahead of it
    # still arrive in time.
    eager_slack_ms: float = 250.0
    # 400 ms: its decode (~57 frames, ~35 ms of one core) is ready well within
    # the slack, and sentences of 40-300 frames decode 1.00-1.26x their frames
    # this way vs 1.28-1.51x eagerly (``python -m rtserver.tools.measure.piper
    # plans``): under load most later sentences are needed soon, and eager
    # chunks there spent CPU the load lacked (16 streams: the decoder ran 1.28x
    # the frames it emitted).
    near_chunk_ms: float = 400.0

    def __post_init__(self) -> None:
        if not self.first_chunk_ms > 0:
            raise ValueError("first_chunk_ms must be > 0")
        if not self.growth >= 1.0:
            raise ValueError("growth must be >= 1")
        if not self.max_chunk_ms >= self.first_chunk_ms:
            raise ValueError("max_chunk_ms must be >= first_chunk_ms")
        if not self.eager_slack_ms >= 0:
            raise ValueError("eager_slack_ms must be >= 0")
        if not self.first_chunk_ms <= self.near_chunk_ms <= self.max_chunk_ms:
            raise ValueError("near_chunk_ms must be between first_chunk_ms and max_chunk_ms")


PLANS = ("eager", "near", "bulk")


def chunk_config(hop: int, support: int, sample_rate: int,
                 chunking: PiperChunking | None = None, *, plan: str = "eager") -> ChunkConfig:
    """The planner's geometry for a decoder of ``hop`` samples per frame. The
    first chunk is ``first_chunk_ms`` (``eager``), ``near_chunk_ms`` (``near``)
    or ``max_chunk_ms`` (``bulk``: every chunk that size)."""
    c = chunking or PiperChunking()
    crossfade = max(1, hop // 2)
    firsts = {"eager": c.first_chunk_ms, "near": c.near_chunk_ms, "bulk": c.max_chunk_ms}
    if plan not in firsts:
        raise ValueError(f"plan must be one of {PLANS}, not {plan!r}")
    first_ms = firsts[plan]
    first_samples = math.ceil(first_ms * sample_rate / 1000.0)
    first_frames = math.ceil((first_samples + support + crossfade) / hop)
    max_frames = max(first_frames, math.ceil(c.max_chunk_ms * sample_rate / 1000.0 / hop))
    return ChunkConfig(samples_per_frame=hop, first_frames=first_frames, growth=c.growth,
                       max_chunk_frames=max_frames, context_samples=support,
                       first_lookahead_samples=support, lookahead_samples=support,
                       crossfade_samples=crossfade)


def sentence_jobs(config: ChunkConfig, n_frames: int) -> list[DecodeJob]:
    """Every decode of a sentence of ``n_frames`` latent frames, in order."""
    planner = ChunkPlanner(config)
    jobs: list[DecodeJob] = []
    for _ in range(n_frames):
        jobs.extend(planner.push(1))
    jobs.extend(planner.finish())
    return jobs


def max_window_frames(config: ChunkConfig) -> int:
    """The most latent frames one decode of this geometry sees (a sentence's
    decodes are capped at ``max_chunk_frames``, so long ones are planned)."""
    return max(j.n_frames for j in sentence_jobs(config, 3 * config.max_chunk_frames + 64))


def hint_plan(config: ChunkConfig, sample_rate: int, n_chunks: int = 6
              ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(chunk_plan_ms, chunk_cost_ms)`` for ``VoiceInfo`` (the hint maths).

    The plan is the first ``n_chunks`` chunks of a long sentence. A chunk's
    cost is the share of the sentence's measured generation time it waits
    for, in audio ms (the hint multiplies it by the measured rtf, which is
    time / audio over whole segments): proportional to its decode window,
    and the first chunk's also carries the front's work for all of them.
    """
    f = config.samples_per_frame
    jobs = sentence_jobs(config, config.first_frames + sum(
        config.chunk_frames(k) for k in range(1, n_chunks)) + 2 * config.lookahead_samples // f
        + 2)[:n_chunks]
    plan = [1000.0 * (j.emit_end - j.emit_start) / sample_rate for j in jobs]
    frames = sum(j.emit_end - j.emit_start for j in jobs) / f
    work = [float(j.n_frames) for j in jobs]
    work[0] += FRONT_COST_RATIO * frames
    total_ms, total_work = sum(plan), sum(work)
    cost = [total_ms * w / total_work for w in work]
    return tuple(round(p, 3) for p in plan), tuple(round(c, 3) for c in cost)
