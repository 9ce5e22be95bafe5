"""A context's audio out: the speaker takes segments in order, synthesizes
them, resamples and frames their audio, and puts it into the sink with seqs
from 0, no gaps; a ``segment`` before each one's first frame, a ``buffer``
hint before the audio it describes.

Putting may wait (the sink is full: backpressure); that time is the
client's pace, not the voice's, and is kept out of the measured r.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass

import numpy as np

from rtserver.audio.framer import Framer
from rtserver.audio.pcm import FloatArray
from rtserver.audio.resample import Resampler
from rtserver.core.events import AudioFrames, Ledger, Sink, SinkClosed
from rtserver.core.first_heard import hint_chunks, queued_ahead_ms
from rtserver.core.framing import HeardFormat, encode_rate, make_framer
from rtserver.core.pronounce import Pronouncer
from rtserver.core.segments import SegmentQueue
from rtserver.core.shared import Shared
from rtserver.core.speculation import Speculation
from rtserver.core.stats import VoiceStats
from rtserver.core.words import estimated_times, timed_words
from rtserver.errors import EngineFailed, RtError
from rtserver.pacing.hints import ahead_ms, prebuffer_ms
from rtserver.protocol.messages import BufferHint, SegmentStarted, Start
from rtserver.text.segmenter import Segment
from rtserver.voices.base import Marks, SynthesisRequest, Voice

log = logging.getLogger("rtserver.context")

_request_ids = itertools.count()

# Frames of a context's first audio that go out before the rest of its chunk
# is encoded: 5 x 20 ms covers the time the remainder takes to encode.
FIRST_SEND_FRAMES = 5
# Chunks of at least this many frames are encoded off the event loop; below it
# the thread hop (~0.1 ms) is not worth it. Above FIRST_SEND_FRAMES, so the
# context's first frames are always encoded inline, at once.
OFFLOAD_FRAMES = 8
# Speculative first segments a context may start (``speculate``): a guess
# costs the voice's work until the cut drops it, so a first word that arrives
# in many pieces (text typed or streamed a character at a time) costs at most
# this many; LLM tokens mostly start a new word, so the first guess is
# usually the one that is cut.
MAX_GUESSES = 2


class Speaker:
    """Speaks the segments of ``queue`` into ``sink`` (``run``) until the end."""

    def __init__(self, shared: Shared, start: Start, voice: Voice, stats: VoiceStats,
                 sink: Sink, ledger: Ledger, queue: SegmentQueue,
                 pronouncer: Pronouncer | None = None) -> None:
        self.shared = shared
        self.start = start
        self.voice = voice
        self.stats = stats
        self.sink = sink
        self.ledger = ledger
        self.queue = queue
        self.pronouncer = pronouncer or Pronouncer.of(start, voice.info)
        self.rate = encode_rate(voice.info, start)  # audio is framed at this rate
        self.framer = make_framer(start, self.rate, shared.opus_config)
        self.heard = HeardFormat.of(voice.info, self.framer)
        self.spoken: list[str] = []
        self.first_hint_ms: float | None = None
        # the first segment's way to its first frame: synthesis start, first
        # PCM, first frames queued; the voice's own marks (see SynthesisRequest)
        self.first_times: dict[str, float] = {}
        self.first_marks = Marks(shared.clock)
        self._blocked_s = 0.0  # time the current segment waited on a full sink
        self._voice_samples = 0  # the voice's audio so far, every segment's (words' timeline)
        self._guess: Speculation | None = None  # the first segment, started before its cut
        self._guesses = 0
        self._dropped: set[Speculation] = set()  # being stopped
        self._first_taken = False
        self._start_plan: _StartPlan | None = None  # what the first audio's hint planned

    async def drop_guesses(self) -> None:
        """Stop every speculative synthesis not adopted, and wait until their
        voice requests are closed (idempotent; the context calls it once its
        loop and speaker are done, however they ended)."""
        if self._guess is not None:
            self._drop(self._guess)
            self._guess = None
        dropped, self._dropped = self._dropped, set()
        for guess in dropped:  # each already cancelled: the waits overlap
            await guess.drop()

    async def run(self) -> None:
        """Speak every segment, then the framer's tail (the last frame)."""
        framer = self.framer
        resampler: Resampler | None = None
        pending_start = False  # a segment began; its first frame carries the flag
        while True:
            seg = await self.queue.get()
            guess = self._adopt(seg) if not self._first_taken else None
            if seg is None:
                break
            if resampler is None:
                resampler = Resampler(self.voice.info.sample_rate, self.rate)
            seg = self.pronouncer.prepare(seg)  # aliases applied: what the client sees
            if seg.pause_before_ms:
                await self._silence(seg.pause_before_ms, resampler)
            self.sink.control(SegmentStarted(
                context=self.start.context, index=seg.index, text=seg.text, source=seg.source,
                seq=self.ledger.next_seq))
            pending_start = True
            self._send_hint(seg)  # fresh rtf for a resume after underrun
            if self.voice.info.word_timing != "model":
                self._send_estimated_words(seg)
            pending_start = await self._speak(seg, resampler, pending_start, guess)
            if seg.pause_after_ms:
                await self._silence(seg.pause_after_ms, resampler)
        tail: list[bytes] = []
        if resampler is not None:
            tail.extend(framer.push(resampler.flush()))
        tail.extend(framer.finish())
        if tail:
            await self._put(tail, segment_start=pending_start, last=True)

    # --- the speculative first segment ---------------------------------------------

    def speculate(self, raw: Segment | None) -> None:
        """The segmenter's guess at the first segment (``Segmenter.tentative``,
        None: no guess now). A new guess drops the one running and starts
        synthesizing (at most ``MAX_GUESSES`` a context); the same guess, or
        None, leaves the running one to the cut."""
        if self._first_taken or raw is None:
            return
        if self._guess is not None:
            if self._guess.segment == raw:
                return
            self._drop(self._guess)
            self._guess = None
        if self._guesses >= MAX_GUESSES:
            return
        self._guesses += 1
        self._count_guess("started")
        seg = self.pronouncer.prepare(raw)
        marks = Marks(self.shared.clock)
        self._guess = Speculation(raw, self._request(seg, marks), marks, self.voice,
                                  self.shared.clock.now())

    def _adopt(self, seg: Segment | None) -> Speculation | None:
        """The first segment is cut: the guess that is this segment, or None
        (any other guess is dropped)."""
        self._first_taken = True
        guess, self._guess = self._guess, None
        if guess is None:
            return None
        if seg is not None and guess.segment == seg:
            self._count_guess("adopted")
            return guess
        self._drop(guess)
        return None

    def _drop(self, guess: Speculation) -> None:
        guess.cancel()
        self._dropped.add(guess)
        self._count_guess("dropped")

    def _count_guess(self, outcome: str) -> None:
        self.shared.metrics.first_segment_guesses.labels(self.voice.info.name, outcome).inc()

    # --- synthesis -------------------------------------------------------------------

    def _request(self, seg: Segment, marks: Marks | None) -> SynthesisRequest:
        return SynthesisRequest(
            text=seg.text, request_id=f"{self.start.context}-{next(_request_ids)}",
            first=seg.index == 0, deadline=self._deadline(), marks=marks,
            clock=self.shared.clock, phonemes=seg.phonemes, speed=seg.speed)

    async def _speak(self, seg: Segment, resampler: Resampler, pending_start: bool,
                     guess: Speculation | None = None) -> bool:
        """Synthesize ``seg`` into the sink (or take ``guess``'s synthesis of
        it); returns whether its first frame is still to come
        (``segment_start`` for the next frames)."""
        framer = self.framer
        ledger = self.ledger
        now = self.shared.clock.now
        first_audio = ledger.next_seq == 0
        if guess is not None:
            request, began = guess.request, guess.began
            self.first_marks = guess.marks
            source = guess.chunks()
        else:
            request = self._request(seg, self.first_marks if first_audio else None)
            began = now()
            source = self.voice.synthesize(request)
        if first_audio:
            self.first_times = {"began": began}
        seg_samples = 0
        seg_start_s = self._voice_samples / self.voice.info.sample_rate
        live = self.stats.live
        live.begin(request.request_id, began)
        try:
            async with contextlib.aclosing(source) as chunks:
                async for chunk in chunks:
                    if first_audio and "pcm" not in self.first_times:
                        self.first_times["pcm"] = now()
                        made = guess.first_chunk_at if guess is not None else None
                        self._check_start(1000.0 * ((now() if made is None else made) - began))
                    if chunk.words:  # before the frames they describe
                        self.sink.control(timed_words(self.start.context, seg, chunk.words,
                                                      seg_start_s, timing="model"))
                    seg_samples += len(chunk.samples)
                    live.progress(request.request_id, seg_samples / chunk.sample_rate,
                                  self._blocked_s, now())
                    pcm = resampler.process(chunk.samples)
                    head = 0
                    if ledger.next_seq == 0:
                        # the context's first audio: encode and send a few frames
                        # before the rest of the chunk (Opus costs ~0.2 ms a frame)
                        head = min(len(pcm), FIRST_SEND_FRAMES * framer.frame_samples)
                    for part in (pcm[:head], pcm[head:]) if head else (pcm,):
                        frames = await self._encode(part)
                        if frames:
                            if first_audio and "queued" not in self.first_times:
                                self.first_times["queued"] = now()
                            await self._put(frames, segment_start=pending_start, last=False)
                            pending_start = False
                            if head:
                                await asyncio.sleep(0)  # let the sink deliver them now
        except (RtError, SinkClosed):
            raise
        except Exception as exc:  # a voice bug fails this context only
            raise EngineFailed(f"voice failed: {exc}", context=self.start.context) from exc
        finally:
            live.end(request.request_id)
            self._voice_samples += seg_samples
        # generation time: without the waits on a full sink, which are the
        # client's pace, not the voice's
        gen_s = max(0.0, now() - began - self._blocked_s)
        self._blocked_s = 0.0
        audio_ms = 1000.0 * seg_samples / self.voice.info.sample_rate
        self.stats.observe_segment(len(seg.text), audio_ms, gen_s, now())
        self.shared.metrics.observe_rtf(self.voice.info.name,
                                        gen_s * 1000.0 / audio_ms if audio_ms else 0.0)
        self.spoken.append(seg.text)
        return pending_start

    async def _silence(self, ms: float, resampler: Resampler) -> None:
        """``ms`` of silence (an SSML ``<break>``), framed like the voice's audio."""
        samples = np.zeros(round(ms * self.voice.info.sample_rate / 1000.0), dtype=np.float32)
        frames = await self._encode(resampler.process(samples))
        if frames:
            await self._put(frames, segment_start=False, last=False)

    async def _encode(self, pcm: FloatArray) -> list[bytes]:
        """Frame ``pcm``: inline when short, else on the encode threads (libopus
        is called through ctypes, which releases the GIL), so that many
        streams' encoding spreads over the cores instead of the event loop."""
        framer: Framer = self.framer
        pool = self.shared.encode_pool
        if pool is None or len(pcm) < OFFLOAD_FRAMES * framer.frame_samples:
            return framer.push(pcm)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, framer.push, pcm)

    async def _put(self, frames: list[bytes], *, segment_start: bool, last: bool) -> None:
        """Number the frames and put them into the sink (waiting while it is full)."""
        ledger = self.ledger
        seq = ledger.next_seq
        ledger.next_seq = seq + len(frames)
        clock = self.shared.clock
        t = clock.now()
        await self.sink.audio(AudioFrames(ledger, seq, tuple(frames), segment_start, last))
        if seq == 0:  # its first audio is out: no longer starting
            self.shared.load.starting.pop(id(ledger), None)
        self._blocked_s += clock.now() - t

    # --- words -----------------------------------------------------------------

    def _send_estimated_words(self, seg: Segment) -> None:
        """``words`` for a voice that does not time them: spread over the
        segment's expected audio (its measured audio per character)."""
        audio_s = len(seg.text) * self.stats.audio_ms_per_char / 1000.0
        start_s = self._voice_samples / self.voice.info.sample_rate
        times = estimated_times(seg.text, audio_s)
        if times:
            self.sink.control(timed_words(self.start.context, seg, times, start_s,
                                          timing="estimated"))

    # --- hints -----------------------------------------------------------------

    def _deadline(self) -> float:
        """When the listener needs the next audio: start of play + audio queued."""
        sent = self.ledger.first_sent_at
        if sent is None:
            return self.shared.clock.now()
        return sent + self.ledger.next_seq * self.start.frame_ms / 1000.0

    def _send_hint(self, seg: Segment) -> None:
        stats = self.stats
        hints = self.shared.hint_config
        now = self.shared.clock.now()
        rtf = stats.rtf_estimate(hints.percentile, now)
        at_start = self.ledger.next_seq == 0  # before the context's first audio
        chunks, cost = hint_chunks(self.voice.info, self.heard, at_start=at_start,
                                   segment_chars=len(seg.text), index=seg.index,
                                   audio_ms_per_char=stats.audio_ms_per_char,
                                   limit=self.shared.segmenter_config.limit)
        jitter = hints.jitter_ms
        queued = 0.0
        if at_start:  # others' first chunks come first
            others = self.shared.load.starting_ahead(self.voice.info.name, now) - (
                id(self.ledger) in self.shared.load.starting)
            queued = queued_ahead_ms(others, rtf, chunks, self.voice.info)
            jitter += queued
        hint = prebuffer_ms(rtf, chunks, jitter, cost_ms=cost)
        if at_start:
            self._start_plan = _StartPlan(rtf, chunks, cost, jitter, queued, hint)
        if self.first_hint_ms is None:
            self.first_hint_ms = hint
        elapsed = 0.0
        if self.ledger.first_sent_at is not None:
            elapsed = 1000.0 * (now - self.ledger.first_sent_at)
        self.sink.control(BufferHint(
            context=self.start.context, prebuffer_ms=round(hint, 1), rtf=round(rtf, 4),
            ahead_ms=round(ahead_ms(self.ledger.next_seq * self.start.frame_ms, elapsed), 1)))

    def _check_start(self, waited_ms: float) -> None:
        """The first chunk came ``waited_ms`` after synthesis began. Where that
        is ``slow_start_factor`` times the voice's usual (plus the planned
        wait for starts queued ahead), the host is that much slower than the
        rates say: hint again, before any audio, at r times the slowdown.
        The listener starts on the latest hint, so it waits for more."""
        plan, self._start_plan = self._start_plan, None
        times = self.stats.first_chunk
        usual = times.usual_ms()
        times.observe(waited_ms)
        if plan is None or usual is None:
            return
        expected = usual + plan.queued_ms
        if not (expected > 0 and waited_ms >= self.shared.hint_config.slow_start_factor * expected):
            return
        rtf = plan.rtf * waited_ms / expected
        hint = prebuffer_ms(rtf, plan.chunks, plan.jitter_ms, cost_ms=plan.cost)
        self.shared.metrics.slow_starts.labels(self.voice.info.name).inc()
        log.info("slow start %s: first chunk after %.0f ms, usually %.0f; hint %.0f -> %.0f ms",
                 self.start.context, waited_ms, expected, plan.hint_ms, hint)
        if hint <= plan.hint_ms:
            return
        self.first_hint_ms = hint
        self.sink.control(BufferHint(context=self.start.context, prebuffer_ms=round(hint, 1),
                                     rtf=round(rtf, 4), ahead_ms=0.0))


@dataclass(frozen=True, slots=True)
class _StartPlan:
    """What a context's first-audio hint planned with (``Speaker._check_start``)."""

    rtf: float
    chunks: list[float]
    cost: list[float] | None
    jitter_ms: float  # with the wait for starts queued ahead
    queued_ms: float  # that wait
    hint_ms: float


__all__ = ["FIRST_SEND_FRAMES", "MAX_GUESSES", "OFFLOAD_FRAMES", "Speaker"]
