"""One context's pipeline: text -> segments -> voice -> resample -> frames -> outbox.

Two coroutines run in the connection's task group per context:
``segment_loop`` owns the segmenter (its first-segment timer included) and
``speak_loop`` synthesizes segments in order, frames their audio and queues
it. Cancelling the context's tasks stops both at once; the connection then
fences it (see ``rtserver.server.outbox``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from rtserver.audio.framer import SAMPLE_RATES, Framer, PcmS16Framer
from rtserver.audio.opus import OpusConfig, OpusFramer
from rtserver.audio.pcm import FloatArray
from rtserver.audio.resample import Resampler
from rtserver.errors import EngineFailed, RtError
from rtserver.metrics import Metrics
from rtserver.pacing.hints import HintConfig, ahead_ms, prebuffer_ms
from rtserver.pacing.rates import LiveRates, RtfTracker
from rtserver.protocol.messages import BufferHint, Done, SegmentStarted, Start
from rtserver.server.outbox import ContextLedger, Outbox
from rtserver.text.segmenter import Segment, Segmenter, SegmenterConfig
from rtserver.voices.base import MODEL_OUTPUT_MARK, SynthesisRequest, Voice

log = logging.getLogger("rtserver.context")
_request_ids = itertools.count()

# Until the first measurement of a voice, assume this many ms of audio per
# character of text (English at ~15 characters per second of speech).
DEFAULT_AUDIO_MS_PER_CHAR = 65.0
# Extra lead for a starvation release: the event loop, framing and the
# first network hop (a few ms each on loopback) plus one 20 ms frame.
STARVATION_MARGIN_S = 0.05
# Frames of a context's first audio that go out before the rest of its chunk
# is encoded: 5 x 20 ms covers the time the remainder takes to encode.
FIRST_SEND_FRAMES = 5
# Chunks of at least this many frames are encoded off the event loop; below it
# the thread hop (~0.1 ms) is not worth it. Above FIRST_SEND_FRAMES, so the
# context's first frames are always encoded inline, at once.
OFFLOAD_FRAMES = 8


@dataclass(frozen=True, slots=True)
class _Input:
    kind: str  # "text" | "flush" | "end" | "idle"
    text: str = ""
    at: float = 0.0  # when the connection received it
    end: int = 0  # characters received in the context up to and including it


@dataclass(slots=True)
class ServerLoad:
    """Contexts open in the server now (started, not yet done, cancelled or
    failed): the load every voice's r depends on (voices share the engine,
    the GPU, the cores). One per server, kept by the connections; the
    ``rtserver_active_contexts`` gauge reads it."""

    active: int = 0


@dataclass(slots=True)
class VoiceStats:
    """Measured behaviour of one voice, shared by its contexts."""

    rtf: RtfTracker  # completed segments
    audio_ms_per_char: float = DEFAULT_AUDIO_MS_PER_CHAR
    live: LiveRates = field(default_factory=LiveRates)  # segments in flight
    load: ServerLoad = field(default_factory=ServerLoad)  # shared by the server's voices

    def rtf_estimate(self, q: float, now: float) -> float:
        """The r to plan with: the ``q``-quantile of recent completed segments
        made at the present load (extrapolated above it), or of the segments
        in flight when those are slower (load rising)."""
        done = self.rtf.percentile(q, now, load=self.load.active)
        live = self.live.percentile(q)
        return done if live is None else max(done, live)

    def observe_segment(self, chars: int, audio_ms: float, gen_s: float, now: float) -> None:
        if audio_ms <= 0:
            return
        self.rtf.observe(gen_s, audio_ms / 1000.0, now, load=self.load.active)
        if chars > 0:  # exponential average, weight 0.1 per segment
            self.audio_ms_per_char += 0.1 * (audio_ms / chars - self.audio_ms_per_char)


@dataclass
class ContextPipeline:
    context: str
    start: Start
    voice: Voice
    ledger: ContextLedger
    outbox: Outbox
    voice_stats: VoiceStats
    segmenter_config: SegmenterConfig
    hint_config: HintConfig
    opus_config: OpusConfig
    metrics: Metrics
    clock: Callable[[], float] = time.monotonic
    encode_pool: Executor | None = None  # threads for Opus encoding (None: inline)
    _inputs: asyncio.Queue[_Input] = field(default_factory=asyncio.Queue)
    _segments: asyncio.Queue[Segment | None] = field(default_factory=asyncio.Queue)
    first_segment_at: float | None = None
    _busy: bool = False  # the speaker is synthesizing a segment
    _blocked_s: float = 0.0  # time the current segment waited on a full send queue
    _starve_checked: int = -1  # pending chars at the last starvation release
    # (characters received so far, arrival time) per fragment, until the first segment
    _arrivals: list[tuple[int, float]] = field(default_factory=list)
    chars_in: int = 0
    spoken: list[str] = field(default_factory=list)
    _framer: Framer | None = None
    # the first segment's way to its first frame: cut, synthesis start, first
    # PCM, first frames queued; the voice's own marks (see SynthesisRequest)
    _first_cut_at: float | None = None
    _first_times: dict[str, float] = field(default_factory=dict)
    _first_marks: dict[str, float] = field(default_factory=dict)

    # --- input from the connection (never blocks) ---------------------------

    def feed(self, text: str) -> None:
        self.chars_in += len(text)
        self._inputs.put_nowait(_Input("text", text, self.clock(), self.chars_in))

    def flush(self) -> None:
        self._inputs.put_nowait(_Input("flush", at=self.clock(), end=self.chars_in))

    def end(self) -> None:
        self._inputs.put_nowait(_Input("end", at=self.clock(), end=self.chars_in))

    def encode_rate(self) -> int:
        """The rate audio is framed at. Opus: the voice's own rate when libopus
        takes it as input and it is not above the requested rate (SNAC's 24 kHz),
        else the requested rate. An Opus packet decodes at any rate, so the
        client still decodes at ``start.sample_rate``; skipping the resampler
        skips its hold-back too (soxr HQ returns nothing for the first 768
        samples of 24 -> 48 kHz: that held the first frame back a whole chunk).
        """
        native = self.voice.info.sample_rate
        if (self.start.format == "opus" and native in SAMPLE_RATES
                and native <= self.start.sample_rate):
            return native
        return self.start.sample_rate

    def make_framer(self) -> Framer:
        if self._framer is None:
            if self.start.format == "opus":
                self._framer = OpusFramer(self.encode_rate(), self.start.frame_ms,
                                          config=self.opus_config)
            else:
                self._framer = PcmS16Framer(self.start.sample_rate, self.start.frame_ms)
        return self._framer

    # --- the two loops ---------------------------------------------------------

    async def segment_loop(self) -> None:
        segmenter = Segmenter(self.segmenter_config)
        while True:
            timer = segmenter.deadline()
            starve = self._starvation_at(segmenter)
            deadline = min((t for t in (timer, starve) if t is not None), default=None)
            try:
                if deadline is None:
                    item = await self._inputs.get()
                else:
                    timeout = max(0.0, deadline - self.clock())
                    item = await asyncio.wait_for(self._inputs.get(), timeout)
            except TimeoutError:
                now = self.clock()
                if timer is not None and now >= timer:
                    self._emit(segmenter.poll(now))
                elif starve is not None and now >= starve:
                    # the listener is about to run dry while the sentence still
                    # arrives: speak its complete words now rather than stall
                    self._starve_checked = segmenter.pending_chars
                    self._emit(segmenter.release_words(now))
                continue
            now = self.clock()
            if item.kind == "text":
                if self.first_segment_at is None:
                    self._arrivals.append((item.end, item.at))
                self._emit(segmenter.feed(item.text, now))
            elif item.kind == "flush":
                self._emit(segmenter.flush(now), item)
            elif item.kind == "end":
                self._emit(segmenter.end(now), item)
                self._segments.put_nowait(None)
                return
            # "idle": the speaker finished its queue; the starvation deadline moved

    def _starvation_at(self, segmenter: Segmenter) -> float | None:
        """When to release buffered words so the listener does not run dry.

        Only while the speaker is idle (all audio of earlier segments is out)
        and text is buffered: the listener's audio ends at the latest at
        ``first frame sent + audio sent`` (playback cannot start earlier); the
        release must come before that by the time the words take to
        synthesize (measured rtf) plus the jitter allowance.
        """
        sent = self.ledger.first_sent_at
        pending = segmenter.pending_chars
        if (sent is None or self._busy or not self._segments.empty() or pending == 0
                or pending == self._starve_checked):
            return None
        audio_end = sent + self.ledger.next_seq * self.start.frame_ms / 1000.0
        rtf = self.voice_stats.rtf_estimate(self.hint_config.percentile, self.clock())
        synth_s = rtf * pending * self.voice_stats.audio_ms_per_char / 1000.0
        return audio_end - synth_s - self.hint_config.jitter_ms / 1000.0 - STARVATION_MARGIN_S

    def _emit(self, segments: list[Segment], item: _Input | None = None) -> None:
        for seg in segments:
            if self.first_segment_at is None:
                self.first_segment_at = self._completed_at(seg, item)
                self._first_cut_at = self.clock()
            self._segments.put_nowait(seg)

    def _completed_at(self, seg: Segment, item: _Input | None) -> float:
        """When the server had the text that completes ``seg`` (PROTOCOL.md, TTFA):
        the arrival of the fragment holding its last character, or of the
        ``flush``/``end`` that released it. A segment the first-segment timer
        released counts from its last fragment too, so the wait is included.
        """
        if item is not None and item.kind != "text":
            return item.at
        for end, at in self._arrivals:
            if end >= seg.source[1]:
                return at
        return self.clock()

    async def speak_loop(self) -> None:
        framer = self.make_framer()
        resampler: Resampler | None = None
        pending_start = False  # a segment began; its first frame carries the flag
        while True:
            if self._segments.empty():
                self._busy = False
                self._inputs.put_nowait(_Input("idle"))  # wake the segmenter's timers
            seg = await self._segments.get()
            if seg is None:
                break
            self._busy = True
            if resampler is None:
                resampler = Resampler(self.voice.info.sample_rate, self.encode_rate())
            self.outbox.put_control(SegmentStarted(
                context=self.context, index=seg.index, text=seg.text, source=seg.source,
                seq=self.ledger.next_seq), self.context)
            pending_start = True
            self._send_hint(seg, first_chunk_ms=None)  # fresh rtf for a resume after underrun
            first_audio = self.ledger.next_seq == 0
            request = SynthesisRequest(
                text=seg.text, request_id=f"{self.context}-{next(_request_ids)}",
                first=seg.index == 0, deadline=self._deadline(),
                marks=self._first_marks if first_audio else None)
            began = self.clock()
            if first_audio:
                self._first_times = {"began": began}
            seg_samples = 0
            live = self.voice_stats.live
            live.begin(request.request_id, began)
            try:
                async for chunk in self.voice.synthesize(request):
                    if first_audio and "pcm" not in self._first_times:
                        self._first_times["pcm"] = self.clock()
                    seg_samples += len(chunk.samples)
                    live.progress(request.request_id, seg_samples / chunk.sample_rate,
                                  self._blocked_s, self.clock())
                    pcm = resampler.process(chunk.samples)
                    head = 0
                    if self.ledger.next_seq == 0:
                        # the context's first audio: encode and send a few frames
                        # before the rest of the chunk (Opus costs ~0.2 ms a frame)
                        head = min(len(pcm), FIRST_SEND_FRAMES * framer.frame_samples)
                    for part in (pcm[:head], pcm[head:]) if head else (pcm,):
                        frames = await self._encode(framer, part)
                        if frames:
                            if first_audio and "queued" not in self._first_times:
                                self._first_times["queued"] = self.clock()
                            await self._put(frames, segment_start=pending_start, last=False)
                            pending_start = False
                            if head:
                                await asyncio.sleep(0)  # let the writer send them now
            except RtError:
                raise
            except Exception as exc:  # a voice bug fails this context only
                raise EngineFailed(f"voice failed: {exc}", context=self.context) from exc
            finally:
                live.end(request.request_id)
            # generation time: without the waits on a full send queue, which
            # are the client's pace, not the voice's
            gen_s = max(0.0, self.clock() - began - self._blocked_s)
            self._blocked_s = 0.0
            audio_ms = 1000.0 * seg_samples / self.voice.info.sample_rate
            self.voice_stats.observe_segment(len(seg.text), audio_ms, gen_s, self.clock())
            self.metrics.observe_rtf(self.voice.info.name, gen_s * 1000.0 / audio_ms
                                     if audio_ms else 0.0)
            self.spoken.append(seg.text)
        tail: list[bytes] = []
        if resampler is not None:
            tail.extend(framer.push(resampler.flush()))
        tail.extend(framer.finish())
        if tail:
            await self._put(tail, segment_start=pending_start, last=True)
        self._observe_first_audio()
        self.outbox.put_deferred(self._done_message, self.context)

    def _observe_first_audio(self) -> None:
        """TTFA's parts (``metrics.FIRST_AUDIO_STAGES``), those that are known."""
        t = self._first_times
        if self.first_segment_at is None or self._first_cut_at is None or "began" not in t:
            return
        points = [("segmenter", self.first_segment_at, self._first_cut_at),
                  ("queue", self._first_cut_at, t["began"])]
        model_at = self._first_marks.get(MODEL_OUTPUT_MARK)
        if "pcm" in t:
            if model_at is not None and t["began"] <= model_at <= t["pcm"]:
                points += [("model", t["began"], model_at), ("vocoder", model_at, t["pcm"])]
            else:
                points.append(("vocoder", t["began"], t["pcm"]))
            if "queued" in t:
                points.append(("encode", t["pcm"], t["queued"]))
                sent = self.ledger.first_sent_at
                if sent is not None:
                    points.append(("send", t["queued"], sent))
        hist = self.metrics.first_audio_stage_ms
        for stage, a, b in points:
            hist.labels(self.voice.info.name, stage).observe(max(0.0, 1000.0 * (b - a)))

    async def _encode(self, framer: Framer, pcm: FloatArray) -> list[bytes]:
        """Frame ``pcm``: inline when short, else on the encode threads (libopus
        is called through ctypes, which releases the GIL), so that many
        streams' encoding spreads over the cores instead of the event loop."""
        if self.encode_pool is None or len(pcm) < OFFLOAD_FRAMES * framer.frame_samples:
            return framer.push(pcm)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.encode_pool, framer.push, pcm)

    async def _put(self, frames: list[bytes], *, segment_start: bool, last: bool) -> None:
        t = self.clock()
        await self.outbox.put_audio(self.ledger, frames, segment_start=segment_start, last=last)
        self._blocked_s += self.clock() - t

    # --- hints -----------------------------------------------------------------

    def _deadline(self) -> float:
        """When the listener needs the next audio: start of play + audio queued."""
        sent = self.ledger.first_sent_at
        if sent is None:
            return self.clock()
        return sent + self.ledger.next_seq * self.start.frame_ms / 1000.0

    def _send_hint(self, seg: Segment, first_chunk_ms: float | None) -> None:
        stats = self.voice_stats
        rtf = stats.rtf_estimate(self.hint_config.percentile, self.clock())
        plan = self.voice.info.chunk_plan_ms
        cost: list[float] | None = None
        if plan:  # a streaming voice: its own chunk schedule within the segment
            chunks = list(plan)
            if len(self.voice.info.chunk_cost_ms) == len(plan):
                cost = list(self.voice.info.chunk_cost_ms)
        else:
            first_ms = first_chunk_ms or len(seg.text) * stats.audio_ms_per_char
            # Later segments are unknown yet: plan for the longest the segmenter
            # allows each of them (its growing limits), which bounds the wait.
            limit = self.segmenter_config.limit
            chunks = [first_ms, *(limit(seg.index + k) * stats.audio_ms_per_char
                                  for k in range(1, 5))]
        hint = prebuffer_ms(rtf, chunks, self.hint_config.jitter_ms, cost_ms=cost)
        elapsed = 0.0
        if self.ledger.first_sent_at is not None:
            elapsed = 1000.0 * (self.clock() - self.ledger.first_sent_at)
        self.outbox.put_control(BufferHint(
            context=self.context, prebuffer_ms=round(hint, 1), rtf=round(rtf, 4),
            ahead_ms=round(ahead_ms(self.ledger.next_seq * self.start.frame_ms, elapsed), 1)),
            self.context)

    # --- the end -----------------------------------------------------------------

    def ttfa_ms(self) -> float | None:
        if self.first_segment_at is None or self.ledger.first_sent_at is None:
            return None
        return max(0.0, 1000.0 * (self.ledger.first_sent_at - self.first_segment_at))

    def _done_message(self) -> Done:
        return Done(
            context=self.context, frames=self.ledger.next_seq,
            audio_ms=float(self.ledger.next_seq * self.start.frame_ms),
            ttfa_ms=None if (t := self.ttfa_ms()) is None else round(t, 2),
            spoken_text=" ".join(self.spoken))

