"""Chunk schedule for streaming a convolutional codec decoder. Pure: numpy only.

A stream receives codec frames one push at a time. ``ChunkPlanner`` decides
when to decode, which frames each decode sees (its *window*) and which output
samples it emits; ``SeamJoiner`` stitches the decoded windows into one gapless
signal. Together they guarantee: every output sample is emitted exactly once,
in order, and when the stream finishes the total is ``n_frames * samples_per_frame``.

Geometry of one decode (absolute sample positions, ``F`` = samples per frame)::

    window [a*F, b*F)      a = max(0, floor((E - context) / F)), b <= frames pushed
    |-- context --|-fade-|------ fresh ------|-hold-|-- lookahead --|
                  E                          emit_end                b*F

- ``E`` (``emit_start``) is where the previous decode stopped emitting; the
  previous decode also kept ``fade`` samples beyond ``E`` (its *hold*), which
  this decode's first ``fade`` samples are crossfaded with (weights that sum
  to one, ``crossfade_windows``).
- Samples within ``lookahead`` of the window end are never emitted (they depend
  on frames the window lacks), except by the final decode, whose window end is
  the true end of the stream (the same boundary a full decode sees).
- At least ``context`` samples of left context precede ``E`` unless the window
  starts at frame 0 (the true start, again the full decode's own boundary).

Schedule: the first decode runs as soon as ``first_frames`` frames are there
(it emits ``first_frames*F - first_lookahead - crossfade`` samples: the TTFA
chunk). Later decodes run once they can emit at least ``c_k * F`` new samples,
``c_2 = ceil(first_frames*growth)`` (or ``second_frames`` when set: a first
decode with a long lookahead emits much less than its frames),
``c_{k+1} = ceil(c_k*growth)``, capped at
``max_chunk_frames``; one decode emits under ``(max_chunk_frames + 1) * F``
samples (a burst of frames becomes several decodes, decoded in one batch),
the final one up to ``lookahead + crossfade`` more.

Sizing (SNAC 24 kHz decoder, ``python -m rtserver.tools.measure.snac rf``): one code
changes output samples up to ``SNAC24_EXACT_SUPPORT`` = 4757 samples (2.32 frames)
beyond its own span on either side -- derived from the layer kernels
(``snac_net.decoder_support``), and confirmed by perturbing each of the 7
codes of one frame on the real config shape with random weights: any change
(above -120 dB re RMS) within 4692 samples, above -60 dB within 4182, above
-40 dB within 3633. Cutting a window short is worse than one code's change
(every missing code adds up): see ``BOUNDARY_ERROR_DB``. So a context of 4757
samples makes the left edge exact (it costs only compute), and the lookahead is
the latency/quality trade: every sample of lookahead delays the first chunk by
as much (``first_lookahead``) and adds to the buffer a listener needs later
(``lookahead``); too little leaves a seam error, which the crossfade spreads
out so it cannot click.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]

# Exact one-sided support of the SNAC 24 kHz decoder in output samples (see the
# module docstring; ``snac_net.decoder_support`` derives it from the layers).
SNAC24_EXACT_SUPPORT = 4757

# Error of a window cut short, vs the full decode, by distance (samples) from the
# cut: worst over 256-sample spans, dB re signal RMS, real 24 kHz shape, random
# weights, 5 cuts (3 right edges, 2 left edges) of random codes. Left and right
# edges behave alike. Measured with ``python -m rtserver.tools.measure.snac edges``.
BOUNDARY_ERROR_DB: dict[int, float] = {
    0: -0.9, 512: -8.9, 1024: -6.0, 1536: -14.1, 2048: -20.8, 2560: -26.4, 3072: -33.3,
    3584: -42.2, 4096: -53.9, 4608: -109.2,  # 4608: float rounding
}


@dataclass(frozen=True, slots=True)
class ChunkConfig:
    """How a stream is cut into decodes. Sample counts are output samples."""

    samples_per_frame: int = 2048  # SNAC 24 kHz: hop 512 x coarsest stride 4
    first_frames: int = 1  # frames before the first decode (the decoder needs 1)
    growth: float = 2.0  # chunk k+1 is ceil(growth x chunk k) frames
    max_chunk_frames: int = 16  # 1.37 s of audio per decode at most
    second_frames: int = 0  # target of decode 2 (0: ceil(first_frames x growth))
    context_samples: int = SNAC24_EXACT_SUPPORT  # exact left edge
    # First chunk: 2048 - 1024 - 256 = 768 samples (32 ms) of audio after ONE
    # frame (TTFA first). Its seam is the stream's only approximate one: about
    # -12 dB re RMS on random weights (see BOUNDARY_ERROR_DB); first_frames=2 with
    # 2048 gives -22 dB one frame later, first_frames=3 with 3584 gives -45 dB.
    first_lookahead_samples: int = 1024
    # Later chunks: the exact support, so every later seam equals the full decode
    # to float rounding; costs the listener ~2.3 frames of generation time of
    # buffer (vs 1.75 frames for -45 dB at 3584).
    lookahead_samples: int = SNAC24_EXACT_SUPPORT
    crossfade_samples: int = 256  # 10.7 ms raised-cosine
    # Deep chunks (0: none): a later decode of this many frames instead, when
    # its stream's listener holds at least that much audio (``push(deep=True)``).
    # Its window has the same context and lookahead, so the same seams, and
    # costs less compute per sample emitted; the wait for its extra frames is
    # covered by what the listener holds while the stream keeps real time.
    # The hints plan without them (``stream_plan``): a listener never needs more.
    deep_chunk_frames: int = 0

    def __post_init__(self) -> None:
        if self.samples_per_frame < 1:
            raise ValueError("samples_per_frame must be >= 1")
        if self.first_frames < 1:
            raise ValueError("first_frames must be >= 1")
        if self.growth < 1.0:
            raise ValueError("growth must be >= 1")
        if self.second_frames < 0:
            raise ValueError("second_frames must be >= 0")
        if self.max_chunk_frames < self.first_frames:
            raise ValueError("max_chunk_frames must be >= first_frames")
        for name in ("context_samples", "first_lookahead_samples", "lookahead_samples",
                     "crossfade_samples"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.deep_chunk_frames and self.deep_chunk_frames <= self.max_chunk_frames:
            raise ValueError("deep_chunk_frames must be 0 or > max_chunk_frames")
        if self.crossfade_samples > self.samples_per_frame:
            raise ValueError("crossfade_samples must be <= samples_per_frame")
        if self.first_frames * self.samples_per_frame <= (self.first_lookahead_samples
                                                           + self.crossfade_samples):
            raise ValueError("the first chunk would be empty: first_frames * samples_per_frame "
                             "must exceed first_lookahead_samples + crossfade_samples")

    def chunk_frames(self, k: int) -> int:
        """Target size, in frames, of the ``k``-th decode (0-based)."""
        c = self.first_frames
        if k == 0:
            return c
        if self.second_frames:
            c = min(self.max_chunk_frames, self.second_frames)
        else:
            c = min(self.max_chunk_frames, max(c, math.ceil(c * self.growth)))
        for _ in range(k - 1):  # a fixed point once it stops growing (the cap)
            grown = min(self.max_chunk_frames, max(c, math.ceil(c * self.growth)))
            if grown == c:
                break
            c = grown
        return c


@dataclass(frozen=True, slots=True)
class DecodeJob:
    """One decode of frames ``[start_frame, end_frame)`` and what it emits.

    Emitted: absolute samples ``[emit_start, emit_end)``, the first ``fade`` of
    them crossfaded with the previous job's hold. Kept for the next job:
    ``[emit_end, emit_end + hold)``. ``final`` jobs end the stream (hold 0).
    """

    index: int
    start_frame: int
    end_frame: int
    emit_start: int
    emit_end: int
    fade: int
    hold: int
    final: bool

    @property
    def n_frames(self) -> int:
        return self.end_frame - self.start_frame


class ChunkPlanner:
    """Per-stream schedule state. ``push`` and ``finish`` return the jobs now due.

    Jobs are planned in order and must be joined (``SeamJoiner.join``) in that
    order; they are independent of each other's output, so all jobs of one
    push can be decoded in one batch.
    """

    __slots__ = ("_cfg", "_emitted", "_frames", "_held", "_jobs", "_started", "finished")

    def __init__(self, config: ChunkConfig) -> None:
        self._cfg = config
        self._frames = 0  # frames pushed
        self._emitted = 0  # E: samples emitted (planned) so far
        self._held = 0  # samples after E held by the last job
        self._jobs = 0
        self._started = False
        self.finished = False

    @property
    def config(self) -> ChunkConfig:
        return self._cfg

    @property
    def frames(self) -> int:
        return self._frames

    @property
    def emitted_samples(self) -> int:
        """Samples planned for emission so far (all of them once finished)."""
        return self._emitted

    def first_needed_frame(self) -> int:
        """The earliest frame any future window can start at (older ones can go)."""
        return self._window_start(self._emitted)

    @property
    def deep_buffer_samples(self) -> int:
        """Audio a listener must hold for ``push(deep=True)`` (0: no deep chunks)."""
        return self._cfg.deep_chunk_frames * self._cfg.samples_per_frame

    def push(self, n_frames: int, *, deep: bool = False) -> list[DecodeJob]:
        """``n_frames`` more frames arrived; return the decodes now due.
        ``deep``: the stream's listener holds ``deep_buffer_samples`` of audio,
        so later decodes wait for ``deep_chunk_frames`` frames (when set)."""
        if self.finished:
            raise RuntimeError("push after finish")
        if n_frames < 0:
            raise ValueError("n_frames must be >= 0")
        self._frames += n_frames
        cfg, f = self._cfg, self._cfg.samples_per_frame
        jobs: list[DecodeJob] = []
        if not self._started:
            if self._frames < cfg.first_frames:
                return jobs
            # Short lookahead only when the frames for the full one are not there.
            margin = cfg.lookahead_samples + cfg.crossfade_samples
            b = min(self._frames, (cfg.max_chunk_frames * f + margin) // f)
            short = cfg.first_frames * f - cfg.first_lookahead_samples - cfg.crossfade_samples
            if b * f - margin >= short:
                jobs.append(self._job(b, b * f - margin, final=False))
            else:  # the short chunk, with all the frames there as its lookahead
                jobs.append(self._job(b, short, final=False))
            self._started = True
        # Later decodes: the smallest b that emits the target, or more frames up
        # to the per-decode cap when a burst is already there.
        margin = cfg.lookahead_samples + cfg.crossfade_samples
        deep = deep and cfg.deep_chunk_frames > 0
        most = cfg.deep_chunk_frames if deep else cfg.max_chunk_frames
        while True:
            target = (most if deep else cfg.chunk_frames(self._jobs)) * f
            cap = self._emitted + most * f
            b_need = math.ceil((self._emitted + target + margin) / f)
            if b_need > self._frames:
                return jobs
            b_cap = (cap + margin) // f  # largest b emitting <= cap
            b = max(b_need, min(self._frames, b_cap))
            jobs.append(self._job(b, b * f - margin, final=False))

    def finish(self) -> list[DecodeJob]:
        """No more frames: return the decodes that flush the tail."""
        if self.finished:
            raise RuntimeError("finish twice")
        end = self._frames * self._cfg.samples_per_frame
        jobs: list[DecodeJob] = []
        # ``push`` planned all it could, so the tail is under one chunk plus the
        # lookahead and crossfade.
        if end > self._emitted:
            jobs.append(self._job(self._frames, end, final=True))
        self.finished = True
        self._started = True
        return jobs

    def _window_start(self, emit_start: int) -> int:
        f = self._cfg.samples_per_frame
        return max(0, (emit_start - self._cfg.context_samples) // f)

    def _job(self, b: int, emit_end: int, *, final: bool) -> DecodeJob:
        hold = 0 if final else self._cfg.crossfade_samples
        if emit_end < self._emitted + self._held:
            raise AssertionError("chunk shorter than its crossfade")  # excluded by the targets
        job = DecodeJob(index=self._jobs, start_frame=self._window_start(self._emitted),
                        end_frame=b, emit_start=self._emitted, emit_end=emit_end,
                        fade=self._held, hold=hold, final=final)
        self._jobs += 1
        self._emitted = emit_end
        self._held = hold
        return job


def held_start(config: ChunkConfig, seconds: float, frame_s: float) -> ChunkConfig:
    """A later segment's plan when its listener can wait ``seconds`` for its
    first audio (what it holds from earlier segments, less a margin): the first
    decode waits for as many frames as generation at real time makes in that
    time, up to ``max_chunk_frames``, and uses the exact lookahead, so the
    segment starts without the plan's approximate first seam and with fewer,
    larger windows (fewer frames decoded per frame: ``tools.measure.
    chunk_plans``). ``config`` unchanged when that is too few frames for a
    first chunk of at least one frame. Called once a segment: the plans for each
    frame count are built once (``_held_plan``)."""
    f = config.samples_per_frame
    margin = config.lookahead_samples + config.crossfade_samples
    fewest = -(-margin // f) + 1  # the exact first chunk emits at least one frame
    frames = min(config.max_chunk_frames, math.floor(seconds / frame_s)) if seconds > 0 else 0
    if frames < max(fewest, config.first_frames + 1):
        return config
    return _held_plan(config, frames)


@functools.lru_cache(maxsize=64)
def _held_plan(config: ChunkConfig, frames: int) -> ChunkConfig:
    return replace(config, first_frames=frames, first_lookahead_samples=config.lookahead_samples)


def stream_plan(config: ChunkConfig, n_chunks: int) -> list[tuple[int, int]]:
    """``(samples emitted, frames waited for)`` of a stream's first ``n_chunks``
    decodes when frames arrive one at a time: decode k emits its samples once
    its frames (beyond decode k-1's) are there. The pacing hints plan with it
    (``rtserver.pacing.hints``): emission lags generation by the lookahead."""
    planner = ChunkPlanner(config)
    out: list[tuple[int, int]] = []
    waited_from = 0
    while len(out) < n_chunks:
        for job in planner.push(1):
            out.append((job.emit_end - job.emit_start, planner.frames - waited_from))
            waited_from = planner.frames
    return out[:n_chunks]


def crossfade_windows(n: int) -> tuple[FloatArray, FloatArray]:
    """``(fade_out, fade_in)`` of length ``n``: raised cosine, summing to one.

    ``fade_in[i] = sin^2(pi/2 * (i + 0.5) / n)`` and ``fade_out = 1 - fade_in``,
    so ``fade_out + fade_in == 1`` to float rounding at every sample.
    """
    t = (np.arange(n, dtype=np.float64) + 0.5) / max(n, 1)
    fade_in = np.sin(0.5 * np.pi * t) ** 2
    return (1.0 - fade_in).astype(np.float32), fade_in.astype(np.float32)


class SeamJoiner:
    """Stitches decoded windows into output chunks, in job order."""

    __slots__ = ("_f", "_next", "_tail", "_windows")

    def __init__(self, samples_per_frame: int) -> None:
        self._f = samples_per_frame
        self._tail: FloatArray = np.zeros(0, dtype=np.float32)
        self._windows: dict[int, tuple[FloatArray, FloatArray]] = {}
        self._next = 0

    def join(self, job: DecodeJob, audio: FloatArray) -> FloatArray:
        """Samples ``[job.emit_start, job.emit_end)`` from the window's audio."""
        if job.index != self._next:
            raise ValueError(f"job {job.index} joined out of order (expected {self._next})")
        if audio.shape != (job.n_frames * self._f,):
            raise ValueError(f"job {job.index}: audio of shape {audio.shape}, expected "
                             f"({job.n_frames * self._f},)")
        if len(self._tail) != job.fade:
            raise ValueError(f"job {job.index}: fade {job.fade} but {len(self._tail)} held")
        origin = job.start_frame * self._f
        lo, hi = job.emit_start - origin, job.emit_end - origin
        out = np.array(audio[lo:hi], dtype=np.float32)
        if job.fade:
            fade_out, fade_in = self._crossfade(job.fade)
            out[:job.fade] = fade_out * self._tail + fade_in * out[:job.fade]
        self._tail = np.array(audio[hi:hi + job.hold], dtype=np.float32)
        self._next += 1
        return out

    def _crossfade(self, n: int) -> tuple[FloatArray, FloatArray]:
        w = self._windows.get(n)
        if w is None:
            w = self._windows[n] = crossfade_windows(n)
        return w
