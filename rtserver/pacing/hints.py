"""Jitter-buffer hints (the `buffer` message of PROTOCOL.md), pure maths.

Model. A context's audio comes in chunks k = 0..K-1 of ``d_k`` ms;
``D_k = d_0 + ... + d_{k-1}`` is the audio before chunk k. Chunks are made
one after another at real-time factor r (generation time / audio time), so
chunk k is out at ``a_k = max(ready_k, a_{k-1}) + r * c_k``, where
``ready_k`` is when its input exists (Piper: a segment is one chunk whose
synthesis starts once its text has arrived; streaming vocoders: growing
chunks of one segment, all "ready" at once) and ``c_k`` is the audio the
model must make for it: ``d_k`` for Piper; for a streaming vocoder, the
frames chunk k waits for beyond chunk k-1's, which differ from ``d_k``
because a decode emits only up to its lookahead (SNAC: the first chunk
is 32 ms out of one 85 ms frame, the second 186 ms that waits for 4 more).

PROTOCOL.md's listener buffers ``prebuffer_ms`` of *audio* before starting
(or resuming). Starting on the arrival of chunk m, chunk k plays at
``a_m + D_k``, so the start is safe iff ``a_k + J <= a_m + D_k`` for every
``k > m`` (J: how late the network may deliver a chunk). The hint is
``D_m* + J`` for the first safe m*: the listener then waits for chunk m*.

DESIGN.md's ``max_k[r (D_{k+1} - d_0) - D_k] + J`` (``start_delay_ms``) is the
*time* to wait after the first chunk arrives. Used as an amount of audio it
is not enough when chunks are uneven: chunks 100, 300, 1000 ms at r = 0.5
give 250 ms; a listener holding 250 ms starts on chunk 1 at t = 200 and
needs chunk 2 at 600, which arrives at 700. ``prebuffer_ms`` answers 440 ms
(wait for chunk 2, the 400 ms before it plus J = 40).

The guarantee (tested): with the planned durations and input times, a
listener that buffers ``prebuffer_ms`` never underruns while the actual r of
every chunk is at most the r planned for and the network delays each chunk
by at most J. The plan must include the chunks whose size grows: with
doubling chunks and r > 0.5 the need grows with every chunk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Float slack (ms) when comparing arrival and play times.
_EPS_MS = 1e-6
# A threshold strictly above D_m: "wait for chunk m", not "start on chunk m-1".
_STEP_MS = 1.0


@dataclass(frozen=True, slots=True)
class HintConfig:
    """How the server computes `buffer` hints.

    ``jitter_ms`` 40: two 20 ms frames; covers one TCP retransmission on a
    path of up to about 40 ms round trip, and event-loop scheduling noise of
    a few ms. ``percentile`` 0.95 of the last ``window`` per-segment r
    observations of a voice (64 segments: a few seconds of traffic under
    load, so the hint follows load). ``default_rtf`` before any observation:
    0.5, twice what Piper measured on the 2-core CI machine (about 0.17) so the
    first hint errs long; the warm-up synthesis replaces it.
    """

    jitter_ms: float = 40.0
    percentile: float = 0.95
    window: int = 64
    default_rtf: float = 0.5
    # Observations older than this stop counting (the newest always counts), so
    # a slow start (first CUDA calls, a burst an hour ago) does not inflate
    # hints once the voice is fast again. 30 s: several sentences of traffic.
    max_age_s: float = 30.0
    # Segments still being synthesized count too (``LiveRates``) once they
    # made this much audio: a load that rises within seconds (64 -> 128
    # streams over 8 s on the H200) slows segments in flight before any of
    # them completes, and hints computed from completed ones alone came out
    # short (bench/results/h200-orpheus-v3-2026-12-03). 1 s keeps a segment's
    # start-up (its time to first audio) from dominating its rate.
    live_min_audio_s: float = 1.0
    # r depends on load (contexts generating at once): vLLM's step time grows
    # with its batch (H200, Orpheus-3B shapes: r 0.25 at 1 stream, 0.40 at 64,
    # 0.61 at 128). Observations made at under ``load_similar`` of the current
    # load do not count; above every load seen lately, r is extrapolated with
    # the fitted slope (rates.LoadSlope: weights halve every
    # ``load_halflife`` observations; no slope until loads spread over
    # ``load_min_spread`` contexts). A burst of 64 users after levels of 8 and
    # 32 had hints from r 0.47 while it ran at 0.67-0.71; the slope of those
    # levels predicts 0.69 (bench/results/h200-orpheus-v3-2026-12-03, burst;
    # replayed in tests/unit/test_hints.py).
    load_similar: float = 0.75
    load_halflife: float = 512.0
    load_min_spread: float = 2.0
    # A context's first chunk that took ``slow_start_factor`` times the
    # voice's usual (median of its last ``first_chunk_window`` first chunks,
    # plus the wait for starts queued ahead) says the host is slower now than
    # the rates say (another process on the cores, CPU throttling): the
    # context is hinted again, before its first audio, at r times that
    # factor. The browser test on CI: a first chunk at 193 ms where ~45 is
    # usual, then chunk 1 at r 0.65 against the 0.12 planned, and a 40 ms
    # hint ran dry (2026-12-06). 2: first segments differ in length (1-6
    # words), and their first chunks with it.
    slow_start_factor: float = 2.0
    first_chunk_window: int = 16

    def __post_init__(self) -> None:
        if not self.jitter_ms >= 0:
            raise ValueError(f"jitter_ms must be >= 0, not {self.jitter_ms}")
        if not 0.0 <= self.percentile <= 1.0:
            raise ValueError(f"percentile must be in [0, 1], not {self.percentile}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, not {self.window}")
        if not self.default_rtf > 0:
            raise ValueError(f"default_rtf must be > 0, not {self.default_rtf}")
        if not self.max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0, not {self.max_age_s}")
        if not self.live_min_audio_s > 0:
            raise ValueError(f"live_min_audio_s must be > 0, not {self.live_min_audio_s}")
        if not 0.0 <= self.load_similar <= 1.0:
            raise ValueError(f"load_similar must be in [0, 1], not {self.load_similar}")
        if not (self.load_halflife > 0 and self.load_min_spread > 0):
            raise ValueError("load_halflife and load_min_spread must be > 0")
        if not self.slow_start_factor > 1.0:
            raise ValueError(f"slow_start_factor must be > 1, not {self.slow_start_factor}")
        if self.first_chunk_window < 1:
            raise ValueError(f"first_chunk_window must be >= 1, not {self.first_chunk_window}")


def _check_chunks(chunk_ms: Sequence[float]) -> None:
    for d in chunk_ms:
        if not (math.isfinite(d) and d >= 0):
            raise ValueError(f"chunk durations must be finite and >= 0, not {d}")


def _check_rtf(rtf: float) -> None:
    if not (math.isfinite(rtf) and rtf >= 0):
        raise ValueError(f"rtf must be finite and >= 0, not {rtf}")


def _costs(chunk_ms: Sequence[float], cost_ms: Sequence[float] | None) -> list[float]:
    if cost_ms is None:
        return [float(d) for d in chunk_ms]
    if len(cost_ms) != len(chunk_ms):
        raise ValueError("cost_ms needs one value per chunk")
    _check_chunks(cost_ms)
    return [float(c) for c in cost_ms]


def planned_arrivals(rtf: float | Sequence[float], chunk_ms: Sequence[float],
                     ready_ms: Sequence[float] | None = None, *,
                     cost_ms: Sequence[float] | None = None) -> list[tuple[float, float]]:
    """``(arrival_ms, duration_ms)`` per chunk when chunks are made in order:
    ``a_k = max(ready_k, a_{k-1}) + r_k * c_k``, from time 0. ``rtf``: one r
    for all chunks or one per chunk; ``ready_ms``: when each chunk's input
    exists (default: all at 0); ``cost_ms``: the audio the model must make for
    each chunk (default its own duration; a streaming vocoder's chunk needs
    its lookahead too, see the module docstring)."""
    _check_chunks(chunk_ms)
    costs = _costs(chunk_ms, cost_ms)
    rates = [float(rtf)] * len(chunk_ms) if isinstance(rtf, int | float) else list(rtf)
    ready = [0.0] * len(chunk_ms) if ready_ms is None else list(ready_ms)
    if len(rates) != len(chunk_ms) or len(ready) != len(chunk_ms):
        raise ValueError("rtf and ready_ms need one value per chunk")
    out: list[tuple[float, float]] = []
    t = 0.0
    for r, d, c, ready_at in zip(rates, chunk_ms, costs, ready, strict=True):
        _check_rtf(r)
        t = max(t, ready_at) + r * c
        out.append((t, float(d)))
    return out


def prebuffer_ms(rtf: float, chunk_ms: Sequence[float], jitter_ms: float, *,
                 ready_ms: Sequence[float] | None = None,
                 cost_ms: Sequence[float] | None = None) -> float:
    """Audio (ms) a listener must buffer before playing so that no chunk is
    late: ``D_m + J`` for the first chunk m whose arrival is a safe start
    (see the module docstring), ``J`` when chunk 0 is. Never negative.

    ``ready_ms``: when each chunk's input (a Piper segment's text) exists,
    relative to the start of chunk 0's generation; default all at once.
    ``cost_ms``: the audio the model makes for each chunk (``planned_arrivals``).
    Safe start m means: even if chunks up to m were made instantly (the
    earliest the listener could start on chunk m) and later ones at ``rtf``,
    every later chunk k is there ``jitter_ms`` before it plays.
    """
    _check_rtf(rtf)
    _check_chunks(chunk_ms)
    if not jitter_ms >= 0:
        raise ValueError(f"jitter_ms must be >= 0, not {jitter_ms}")
    n = len(chunk_ms)
    costs = _costs(chunk_ms, cost_ms)
    ready = [0.0] * n if ready_ms is None else [float(x) for x in ready_ms]
    if len(ready) != n:
        raise ValueError("ready_ms needs one value per chunk")
    before = [0.0]  # D_k
    for d in chunk_ms:
        before.append(before[-1] + d)
    earliest = 0.0  # R_m: chunk m cannot be out before every input up to it exists
    for m in range(n):
        earliest = max(earliest, ready[m])
        t = earliest  # worst case: chunks <= m instant, the rest at rtf
        safe = True
        for k in range(m + 1, n):
            t = max(t, ready[k]) + rtf * costs[k]
            if t + jitter_ms > earliest + before[k] + _EPS_MS:
                safe = False
                break
        if safe:
            return before[m] + (max(jitter_ms, _STEP_MS) if m else jitter_ms)
    return jitter_ms  # no chunks: nothing to wait for


def heard_chunks_ms(sent_samples: Sequence[int], sample_rate: int, frame_samples: int,
                    skip_ms: float = 0.0) -> list[float]:
    """A voice's chunks as a listener receives them, in ms of audio.

    ``sent_samples[k]``: samples handed to the framer once chunk k is made,
    cumulative (after a resampler's hold-back, ``output_after_chunks``). The
    framer sends whole frames only, so the audio out after chunk k is
    ``floor(sent / frame) * frame``; the decoder drops ``skip_ms`` from the
    very start (Opus pre-skip). A chunk may come out as 0 ms (all held back).
    """
    if sample_rate <= 0 or frame_samples <= 0:
        raise ValueError("sample_rate and frame_samples must be > 0")
    if not (math.isfinite(skip_ms) and skip_ms >= 0):
        raise ValueError(f"skip_ms must be finite and >= 0, not {skip_ms}")
    out: list[float] = []
    before = 0.0
    last = 0
    for n in sent_samples:
        if n < last:
            raise ValueError("sent_samples must be cumulative (non-decreasing)")
        last = n
        held = max(0.0, 1000.0 * (n // frame_samples) * frame_samples / sample_rate - skip_ms)
        out.append(held - before)
        before = held
    return out


def start_delay_ms(rtf: float, chunk_ms: Sequence[float], jitter_ms: float) -> float:
    """DESIGN.md's ``max_k[r (D_{k+1} - d_0) - D_k] + J``: how long after the
    first chunk arrives to start playing (a wait in time, not an amount of
    audio; see the module docstring). Never negative."""
    _check_rtf(rtf)
    _check_chunks(chunk_ms)
    if not chunk_ms:
        return max(0.0, jitter_ms)
    d0 = chunk_ms[0]
    before = 0.0
    worst = 0.0  # k = 0 gives r*(d_0 - d_0) - 0 = 0
    for d in chunk_ms:
        worst = max(worst, rtf * (before + d - d0) - before)
        before += d
    return max(0.0, worst + jitter_ms)


def ahead_ms(audio_sent_ms: float, elapsed_ms: float) -> float:
    """How far generation runs ahead of real time: audio sent so far minus
    the time since the first frame was sent (negative: behind)."""
    return audio_sent_ms - elapsed_ms


@dataclass(frozen=True, slots=True)
class PlaybackResult:
    underruns: int
    stalled_ms: float  # time spent waiting after underruns
    start_ms: float | None  # when playback first began (None: no audio)


def simulate_playback(arrivals: Sequence[tuple[float, float]],
                      prebuffer_ms: float) -> PlaybackResult:
    """Play chunks ``(arrival_ms, duration_ms)`` (in arrival order) in real time.

    The listener starts, and after an underrun resumes, as soon as it holds
    at least ``prebuffer_ms`` of audio (and some audio), or once every chunk
    has arrived. An underrun: playing, it runs out of audio before the next
    chunk arrives.
    """
    underruns = 0
    stalled = 0.0
    start: float | None = None
    playing = False
    empty_at = 0.0  # while playing: when the buffered audio runs out
    buffered = 0.0  # while waiting: audio held
    waiting_since: float | None = None  # set after an underrun
    last_at = -math.inf
    n = len(arrivals)
    for i, (at, dur) in enumerate(arrivals):
        if at < last_at:
            raise ValueError("arrivals must be in time order")
        if not (math.isfinite(dur) and dur >= 0):
            raise ValueError(f"chunk durations must be finite and >= 0, not {dur}")
        last_at = at
        if playing and empty_at < at - _EPS_MS:
            underruns += 1
            playing = False
            buffered = 0.0
            waiting_since = empty_at
        if playing:
            empty_at += dur
            continue
        buffered += dur
        if (buffered > 0 and buffered >= prebuffer_ms - _EPS_MS) or i == n - 1:
            playing = True
            empty_at = at + buffered
            if start is None:
                start = at
            if waiting_since is not None:
                stalled += at - waiting_since
                waiting_since = None
    return PlaybackResult(underruns=underruns, stalled_ms=stalled, start_ms=start)


__all__ = [
    "HintConfig",
    "PlaybackResult",
    "ahead_ms",
    "heard_chunks_ms",
    "planned_arrivals",
    "prebuffer_ms",
    "simulate_playback",
    "start_delay_ms",
]
