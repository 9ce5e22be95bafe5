"""One context: text fragments -> segmenter -> voice -> resampler -> framer ->
pacer -> a ``Sink``.

``run()`` drives two coroutines: the segment loop owns the segmenter (its
first-segment and starvation timers included) and the speak loop synthesizes
segments in order, frames their audio and puts it into the sink with seqs
from 0, no gaps. Input (``feed``/``flush``/``end``) never blocks. ``cancel()``
is the fence: it stops both loops, waits for them, drops what the sink has
not delivered, and puts ``cancelled`` with the last delivered seq; nothing of
the context follows it. Order (PROTOCOL.md, "Order and guarantees"):
``segment`` before its first frame, ``buffer`` hints before the audio they
describe, ``done``/``cancelled``/``error`` after the last frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rtserver.audio.framer import Framer
from rtserver.audio.pcm import FloatArray
from rtserver.audio.resample import Resampler
from rtserver.core.events import AudioFrames, Finished, Ledger, Sink, SinkClosed
from rtserver.core.first_heard import hint_chunks
from rtserver.core.framing import HeardFormat, encode_rate, make_framer
from rtserver.core.stats import VoiceStats
from rtserver.errors import EngineFailed, InternalError, RtError
from rtserver.pacing.hints import ahead_ms, prebuffer_ms
from rtserver.protocol.messages import BufferHint, Cancelled, Done, SegmentStarted, Start
from rtserver.protocol.session import error_message
from rtserver.text.segmenter import Segment, Segmenter
from rtserver.voices.base import MODEL_OUTPUT_MARK, Marks, SynthesisRequest, Voice

if TYPE_CHECKING:
    from rtserver.core.speech import SpeechCore

log = logging.getLogger("rtserver.context")
_request_ids = itertools.count()

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
    at: float = 0.0  # when it was received
    end: int = 0  # characters received in the context up to and including it


class SpeechContext:
    """One context of a ``SpeechCore`` (``core.open(...)``) writing into ``sink``."""

    def __init__(self, core: SpeechCore, start: Start, voice: Voice, sink: Sink,
                 stream: int = 0) -> None:
        self.core = core
        self.context = start.context
        self.start = start
        self.voice = voice
        self.sink = sink
        self.clock = core.clock
        self.voice_stats: VoiceStats = core.stats_for(voice.info.name)
        self.ledger = Ledger(context=start.context, stream=stream, frame_ms=start.frame_ms,
                             clock=core.clock, voice=voice.info.name)
        self._inputs: asyncio.Queue[_Input] = asyncio.Queue()
        self._segments: asyncio.Queue[Segment | None] = asyncio.Queue()
        self.first_segment_at: float | None = None
        self._busy = False  # the speaker is synthesizing a segment
        self._blocked_s = 0.0  # time the current segment waited on a full sink
        self._starve_checked = -1  # pending chars at the last starvation release
        # (characters received so far, arrival time) per fragment, until the first segment
        self._arrivals: list[tuple[int, float]] = []
        self.chars_in = 0
        self.spoken: list[str] = []
        self.heard_ms = 0.0  # what the listener reported hearing (``played``)
        self.outcome: str | None = None  # "done" | "failed" | "cancelled" | "closed"
        self._first_hint_ms: float | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = False
        # the first segment's way to its first frame: cut, synthesis start, first
        # PCM, first frames queued; the voice's own marks (see SynthesisRequest)
        self._first_cut_at: float | None = None
        self._first_times: dict[str, float] = {}
        self._first_marks = Marks(core.clock)
        self.framer = make_framer(start, self.encode_rate(), core.opus_config)
        self.heard = HeardFormat.of(voice.info, self.framer)
        core.load.active += 1

    # --- input (never blocks) ----------------------------------------------------

    def feed(self, text: str) -> None:
        self.chars_in += len(text)
        self._inputs.put_nowait(_Input("text", text, self.clock.now(), self.chars_in))

    def flush(self) -> None:
        self._inputs.put_nowait(_Input("flush", at=self.clock.now(), end=self.chars_in))

    def end(self) -> None:
        self._inputs.put_nowait(_Input("end", at=self.clock.now(), end=self.chars_in))

    # --- format ------------------------------------------------------------------

    def encode_rate(self) -> int:
        """The rate audio is framed at (``framing.encode_rate``)."""
        return encode_rate(self.voice.info, self.start)

    # --- running -----------------------------------------------------------------

    async def run(self) -> str:
        """Speak until done, failed or cancelled; returns the outcome. A failure
        puts its ``error`` into the sink and touches no other context."""
        self._task = asyncio.current_task()
        if self._cancelling:  # cancelled before it began
            return "cancelled"
        failure: RtError | None = None
        closed = False
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._segment_loop())
                group.create_task(self._speak_loop())
        except* RtError as eg:
            err = eg.exceptions[0]
            assert isinstance(err, RtError)
            err.context = self.context
            log.warning("context failed: %s (%s)", err.message, err.code.value)
            failure = err
        except* SinkClosed:  # the client left; any other error is reported below
            closed = True
        except* Exception as eg:
            log.exception("context crashed", exc_info=eg.exceptions[0])
            failure = InternalError("internal error", context=self.context)
        if closed and failure is None:
            self.release()  # the sink closed: nobody to tell
            return "closed"
        if failure is None:
            return "done"  # the sink finishes it when it delivers ``done``
        self._finish("failed")
        self.core.metrics.errors.labels(failure.code.value).inc()
        self.sink.control(error_message(failure))
        return "failed"

    async def cancel(self) -> None:
        """The fence: stop, drop what the sink holds, put ``cancelled``."""
        if self.outcome is not None or self._cancelling:
            return
        self._cancelling = True
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])
        self.sink.fence(self.context)
        self.ledger.fenced = True
        self._finish("cancelled")
        self.sink.control(Cancelled(context=self.context, last_seq=self.ledger.last_sent_seq),
                          urgent=True)

    def release(self) -> None:
        """The transport is gone: stop counting this context (no outcome metric)."""
        if self.outcome is None:
            self.outcome = "closed"
            self.core.load.active -= 1

    # --- the two loops -------------------------------------------------------------

    async def _segment_loop(self) -> None:
        segmenter = Segmenter(self.core.segmenter_config)
        now = self.clock.now
        while True:
            timer = segmenter.deadline()
            starve = self._starvation_at(segmenter)
            deadline = min((t for t in (timer, starve) if t is not None), default=None)
            try:
                if deadline is None:
                    item = await self._inputs.get()
                else:
                    item = await asyncio.wait_for(self._inputs.get(), max(0.0, deadline - now()))
            except TimeoutError:
                t = now()
                if timer is not None and t >= timer:
                    self._emit(segmenter.poll(t))
                elif starve is not None and t >= starve:
                    # the listener is about to run dry while the sentence still
                    # arrives: speak its complete words now rather than stall
                    self._starve_checked = segmenter.pending_chars
                    self._emit(segmenter.release_words(t))
                continue
            t = now()
            if item.kind == "text":
                if self.first_segment_at is None:
                    self._arrivals.append((item.end, item.at))
                self._emit(segmenter.feed(item.text, t))
            elif item.kind == "flush":
                self._emit(segmenter.flush(t), item)
            elif item.kind == "end":
                self._emit(segmenter.end(t), item)
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
        hints = self.core.hint_config
        audio_end = sent + self.ledger.next_seq * self.start.frame_ms / 1000.0
        rtf = self.voice_stats.rtf_estimate(hints.percentile, self.clock.now())
        synth_s = rtf * pending * self.voice_stats.audio_ms_per_char / 1000.0
        return audio_end - synth_s - hints.jitter_ms / 1000.0 - STARVATION_MARGIN_S

    def _emit(self, segments: list[Segment], item: _Input | None = None) -> None:
        for seg in segments:
            if self.first_segment_at is None:
                self.first_segment_at = self._completed_at(seg, item)
                self._first_cut_at = self.clock.now()
            self._segments.put_nowait(seg)

    def _completed_at(self, seg: Segment, item: _Input | None) -> float:
        """When the core had the text that completes ``seg`` (PROTOCOL.md, TTFA):
        the arrival of the fragment holding its last character, or of the
        ``flush``/``end`` that released it. A segment the first-segment timer
        released counts from its last fragment too, so the wait is included.
        """
        if item is not None and item.kind != "text":
            return item.at
        for end, at in self._arrivals:
            if end >= seg.source[1]:
                return at
        return self.clock.now()

    async def _speak_loop(self) -> None:
        framer = self.framer
        ledger = self.ledger
        now = self.clock.now
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
            self.sink.control(SegmentStarted(
                context=self.context, index=seg.index, text=seg.text, source=seg.source,
                seq=ledger.next_seq))
            pending_start = True
            self._send_hint(seg)  # fresh rtf for a resume after underrun
            first_audio = ledger.next_seq == 0
            request = SynthesisRequest(
                text=seg.text, request_id=f"{self.context}-{next(_request_ids)}",
                first=seg.index == 0, deadline=self._deadline(),
                marks=self._first_marks if first_audio else None, clock=self.clock)
            began = now()
            if first_audio:
                self._first_times = {"began": began}
            seg_samples = 0
            live = self.voice_stats.live
            live.begin(request.request_id, began)
            try:
                async with contextlib.aclosing(self.voice.synthesize(request)) as chunks:
                    async for chunk in chunks:
                        if first_audio and "pcm" not in self._first_times:
                            self._first_times["pcm"] = now()
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
                            frames = await self._encode(framer, part)
                            if frames:
                                if first_audio and "queued" not in self._first_times:
                                    self._first_times["queued"] = now()
                                await self._put(frames, segment_start=pending_start,
                                                last=False)
                                pending_start = False
                                if head:
                                    await asyncio.sleep(0)  # let the sink deliver them now
            except (RtError, SinkClosed):
                raise
            except Exception as exc:  # a voice bug fails this context only
                raise EngineFailed(f"voice failed: {exc}", context=self.context) from exc
            finally:
                live.end(request.request_id)
            # generation time: without the waits on a full sink, which are the
            # client's pace, not the voice's
            gen_s = max(0.0, now() - began - self._blocked_s)
            self._blocked_s = 0.0
            audio_ms = 1000.0 * seg_samples / self.voice.info.sample_rate
            self.voice_stats.observe_segment(len(seg.text), audio_ms, gen_s, now())
            self.core.metrics.observe_rtf(self.voice.info.name, gen_s * 1000.0 / audio_ms
                                          if audio_ms else 0.0)
            self.spoken.append(seg.text)
        tail: list[bytes] = []
        if resampler is not None:
            tail.extend(framer.push(resampler.flush()))
        tail.extend(framer.finish())
        if tail:
            await self._put(tail, segment_start=pending_start, last=True)
        self._observe_first_audio()
        self.sink.finish(Finished(self.context, self._done_message))

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
        hist = self.core.metrics.first_audio_stage_ms
        for stage, a, b in points:
            hist.labels(self.voice.info.name, stage).observe(max(0.0, 1000.0 * (b - a)))

    async def _encode(self, framer: Framer, pcm: FloatArray) -> list[bytes]:
        """Frame ``pcm``: inline when short, else on the encode threads (libopus
        is called through ctypes, which releases the GIL), so that many
        streams' encoding spreads over the cores instead of the event loop."""
        pool = self.core.encode_pool
        if pool is None or len(pcm) < OFFLOAD_FRAMES * framer.frame_samples:
            return framer.push(pcm)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, framer.push, pcm)

    async def _put(self, frames: list[bytes], *, segment_start: bool, last: bool) -> None:
        """Number the frames and put them into the sink (waiting while it is full)."""
        ledger = self.ledger
        seq = ledger.next_seq
        ledger.next_seq = seq + len(frames)
        t = self.clock.now()
        await self.sink.audio(AudioFrames(ledger, seq, tuple(frames), segment_start, last))
        self._blocked_s += self.clock.now() - t

    # --- hints -----------------------------------------------------------------

    def _deadline(self) -> float:
        """When the listener needs the next audio: start of play + audio queued."""
        sent = self.ledger.first_sent_at
        if sent is None:
            return self.clock.now()
        return sent + self.ledger.next_seq * self.start.frame_ms / 1000.0

    def _send_hint(self, seg: Segment) -> None:
        stats = self.voice_stats
        hints = self.core.hint_config
        rtf = stats.rtf_estimate(hints.percentile, self.clock.now())
        chunks, cost = hint_chunks(self.voice.info, self.heard,
                                   at_start=self.ledger.next_seq == 0,
                                   segment_chars=len(seg.text), index=seg.index,
                                   audio_ms_per_char=stats.audio_ms_per_char,
                                   limit=self.core.segmenter_config.limit)
        hint = prebuffer_ms(rtf, chunks, hints.jitter_ms, cost_ms=cost)
        if self._first_hint_ms is None:
            self._first_hint_ms = hint
        elapsed = 0.0
        if self.ledger.first_sent_at is not None:
            elapsed = 1000.0 * (self.clock.now() - self.ledger.first_sent_at)
        self.sink.control(BufferHint(
            context=self.context, prebuffer_ms=round(hint, 1), rtf=round(rtf, 4),
            ahead_ms=round(ahead_ms(self.ledger.next_seq * self.start.frame_ms, elapsed), 1)))

    # --- the end -----------------------------------------------------------------

    def ttfa_ms(self) -> float | None:
        if self.first_segment_at is None or self.ledger.first_sent_at is None:
            return None
        return max(0.0, 1000.0 * (self.ledger.first_sent_at - self.first_segment_at))

    def _done_message(self) -> Done:
        self._finish("done")
        ttfa = self.ttfa_ms()
        return Done(
            context=self.context, frames=self.ledger.next_seq,
            audio_ms=float(self.ledger.next_seq * self.start.frame_ms),
            ttfa_ms=None if ttfa is None else round(ttfa, 2),
            spoken_text=" ".join(self.spoken))

    def _finish(self, outcome: str) -> None:
        """Count the context's end once: load, outcome, TTFA, the log line."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        core = self.core
        core.load.active -= 1
        metrics = core.metrics
        metrics.contexts_total.labels(outcome).inc()
        name = self.voice.info.name
        ttfa = self.ttfa_ms()
        if ttfa is not None and outcome == "done":
            metrics.ttfa_ms.labels(name).observe(ttfa)
            if self._first_hint_ms is not None:
                metrics.first_heard_ms.labels(name).observe(ttfa + self._first_hint_ms)
        log.info("context %s voice=%s chars=%d audio_ms=%d ttfa_ms=%s rtf=%.3f heard_ms=%.0f",
                 outcome, name, self.chars_in, self.ledger.next_seq * self.start.frame_ms,
                 "-" if ttfa is None else f"{ttfa:.1f}",
                 self.voice_stats.rtf.percentile(0.5), self.heard_ms)
