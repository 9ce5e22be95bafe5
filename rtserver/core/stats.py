"""What a speech core measures across its contexts: the load and each voice's
rates (the hints plan with them). Pure: no I/O, times passed in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rtserver.core.heard import ListenerCorrection
from rtserver.pacing.rates import FirstChunkTimes, LiveRates, RtfTracker

# Until the first measurement of a voice, assume this many ms of audio per
# character of text (English at ~15 characters per second of speech).
DEFAULT_AUDIO_MS_PER_CHAR = 65.0


# A context counts as starting for at most this long after it opened: a
# burst's first audio comes within ~0.5 s on 2 cores (bench/results/
# cpu-piper-2026-12-03-bf16-burst: TTFA p99 355 ms at 16 at once), and a
# context opened long before its text must not hold back other starts.
STARTING_WINDOW_S = 2.0


def _none_elsewhere(voice: str) -> int:
    return 0


def _no_rate() -> float | None:
    return None


@dataclass(slots=True)
class ServerLoad:
    """Contexts open in the server now (started, not yet done, cancelled or
    failed): the load every voice's r depends on (voices share the engine,
    the GPU, the cores). One per core, kept by its contexts; the
    ``rtserver_active_contexts`` gauge reads it."""

    active: int = 0
    # Contexts opened whose first audio is not out yet, by id, with when they
    # opened: a burst's first segments, queued ahead of everyone's next chunk
    # (a CPU voice serves first chunks first). One opened this long ago
    # without audio (its text has not come) stops counting.
    starting: dict[int, float] = field(default_factory=dict)
    # Starts of a voice that other processes queue where this one's go too
    # (a GPU worker's other front ends), by voice name; the server sets it.
    starting_elsewhere: Callable[[str], int] = _none_elsewhere

    def starting_now(self, now: float) -> int:
        """Contexts starting now (opened within ``STARTING_WINDOW_S``, no audio yet)."""
        return sum(1 for t in self.starting.values() if now - t < STARTING_WINDOW_S)

    def starting_ahead(self, voice: str, now: float) -> int:
        """Starts a new context of ``voice`` queues behind: this process's
        (``starting_now``) and other processes' in the same place
        (``starting_elsewhere``), so a storm spread over N front ends counts
        in full on each."""
        return self.starting_now(now) + self.starting_elsewhere(voice)


@dataclass(slots=True)
class VoiceStats:
    """Measured behaviour of one voice, shared by its contexts."""

    rtf: RtfTracker  # completed segments
    audio_ms_per_char: float = DEFAULT_AUDIO_MS_PER_CHAR
    live: LiveRates = field(default_factory=LiveRates)  # segments in flight
    first_chunk: FirstChunkTimes = field(default_factory=FirstChunkTimes)  # contexts' first
    load: ServerLoad = field(default_factory=ServerLoad)  # shared by the server's voices
    parallel: int = 0  # VoiceInfo.parallel_segments
    # listeners' first heard audio against the predictions (``played``)
    heard: ListenerCorrection = field(default_factory=ListenerCorrection)
    # r of this voice's engine as another process measured it (a GPU worker,
    # over every front end's requests: ``Load.rtf``), or None
    rtf_elsewhere: Callable[[], float | None] = _no_rate

    @property
    def measured(self) -> bool:
        """A segment of this voice completed, or one in flight made enough
        audio to have a rate, or another process measured its engine (before:
        ``rtf_estimate`` is ``default_rtf``)."""
        return (self.rtf.count > 0 or self.live.percentile(0.5) is not None
                or self.rtf_elsewhere() is not None)

    def rtf_estimate(self, q: float, now: float, *, extra_load: int = 0) -> float:
        """The r to plan with: the ``q``-quantile of recent completed segments
        made at the present load (extrapolated above it), or of the segments
        in flight when those are slower (load rising). ``extra_load``:
        contexts about to start, counted in the load (admission asks with 1).
        Before this process measured any: ``rtf_elsewhere``, else ``default_rtf``
        (a front end's first contexts on a GPU worker that others have fed
        planned with r 0.5 while it ran at 0.32, and heard their first audio
        after 250 ms instead of ~70: bench/results/h100-2026-12-05-s15)."""
        live = self.live.percentile(q)
        if self.rtf.count == 0 and live is None:
            shared = self.rtf_elsewhere()
            if shared is not None:
                return shared
        done = self.rtf.percentile(q, now, load=self.load.active + extra_load,
                                   parallel=self.parallel)
        return done if live is None else max(done, live)

    def observe_segment(self, chars: int, audio_ms: float, gen_s: float, now: float) -> None:
        if audio_ms <= 0:
            return
        self.rtf.observe(gen_s, audio_ms / 1000.0, now, load=self.load.active)
        if chars > 0:  # exponential average, weight 0.1 per segment
            self.audio_ms_per_char += 0.1 * (audio_ms / chars - self.audio_ms_per_char)
