"""One context: its input, its segments and its audio out, run together.

``SpeechContext`` puts three parts together, each with one job:
``ContextInput`` holds what the transport gave (``feed``/``flush``/``end``,
never blocking, bounded by ``max_text_chars``); ``SegmentLoop`` cuts it into
segments on time into a bounded ``SegmentQueue``; the ``Speaker`` speaks
them into the ``Sink``. ``run()`` drives the loop and the speaker;
``cancel()`` is the fence: it stops both, waits for them, drops what the
sink has not delivered, and puts ``cancelled`` with the last delivered seq;
nothing of the context follows it. Order (PROTOCOL.md, "Order and
guarantees"): ``segment`` before its first frame, ``buffer`` hints before the
audio they describe, ``done``/``cancelled``/``error`` after the last frame.
"""

from __future__ import annotations

import asyncio
import logging

from rtserver.audio.framer import Framer
from rtserver.core.events import Finished, Ledger, Sink, SinkClosed
from rtserver.core.heard import FirstHeard
from rtserver.core.inputs import ContextInput
from rtserver.core.pronounce import Pronouncer
from rtserver.core.segments import SegmentLoop, SegmentQueue
from rtserver.core.shared import Shared
from rtserver.core.speaker import Speaker
from rtserver.core.stats import VoiceStats
from rtserver.errors import InternalError, RtError
from rtserver.protocol.messages import Cancelled, Done, Start
from rtserver.protocol.session import error_message
from rtserver.voices.base import MODEL_OUTPUT_MARK, Voice

log = logging.getLogger("rtserver.context")


class SpeechContext:
    """One context of a core (``SpeechCore.open``) writing into ``sink``."""

    def __init__(self, shared: Shared, start: Start, voice: Voice, stats: VoiceStats,
                 sink: Sink, stream: int = 0, predicted_ms: float | None = None,
                 pronouncer: Pronouncer | None = None) -> None:
        self.shared = shared
        self.context = start.context
        self.start = start
        self.voice = voice
        self.sink = sink
        self.ledger = Ledger(context=start.context, stream=stream, frame_ms=start.frame_ms,
                             clock=shared.clock, voice=voice.info.name)
        self.input = ContextInput(start.context, shared.clock, shared.max_text_chars)
        queue = SegmentQueue(shared.max_text_chars, on_idle=self.input.wake)
        if pronouncer is None:
            pronouncer = Pronouncer.of(start, voice.info)
        self.speaker = Speaker(shared, start, voice, stats, sink, self.ledger, queue,
                               pronouncer)
        self.segments = SegmentLoop(self.input, queue, shared.segmenter_config,
                                    shared.hint_config, stats, self.ledger, shared.clock,
                                    ssml=pronouncer.controls if pronouncer.ssml else None,
                                    voice=voice.info.name, report=self._report,
                                    speculate=(self.speaker.speculate
                                               if shared.segmenter_config.speculate_first
                                               else None))
        self.heard_ms = 0.0  # what the listener reported hearing (``played``)
        hist = shared.metrics.time_to_first_heard
        self.first_heard = FirstHeard(  # ``predicted_ms``: admission's, at the start
            voice=voice.info.name, predicted_ms=predicted_ms, correction=stats.heard,
            report=lambda name, seconds: hist.labels(name).observe(seconds))
        self.outcome: str | None = None  # "done" | "failed" | "cancelled" | "closed"
        self._task: asyncio.Task[object] | None = None
        self._cancelling = False
        shared.load.active += 1
        shared.load.starting[id(self.ledger)] = shared.clock.now()

    @property
    def framer(self) -> Framer:
        return self.speaker.framer

    # --- input (never blocks) ----------------------------------------------------

    def feed(self, text: str) -> None:
        """Append text; ``TextTooLong`` past the context's ``max_text_chars``."""
        self.input.feed(text)

    def flush(self) -> None:
        self.input.flush()

    def end(self) -> None:
        self.input.end()

    def played(self, audio_ms: float) -> float | None:
        """The listener reports hearing ``audio_ms`` of the context; its first
        report gives the time to first heard audio (seconds, else None)."""
        self.heard_ms = audio_ms
        self._heard_facts()
        return self.first_heard.played(audio_ms, self.shared.clock.now())

    def _heard_facts(self) -> None:
        """What ``first_heard`` needs of the context, as it stands."""
        heard = self.first_heard
        heard.text_complete_at = self.segments.first_segment_at
        heard.first_sent_at = self.ledger.first_sent_at
        heard.sent_ms = float((self.ledger.last_sent_seq + 1) * self.start.frame_ms)

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
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self.segments.run())
                    group.create_task(self._speak())
            finally:  # no speculative first segment outlives the context
                await self.speaker.drop_guesses()
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
        self.shared.metrics.errors.labels(failure.code.value).inc()
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
            self.shared.load.active -= 1
            self.shared.load.starting.pop(id(self.ledger), None)

    def _report(self, err: RtError) -> None:
        """An error about the context's input that ends nothing (bad SSML)."""
        err.context = self.context
        self.shared.metrics.errors.labels(err.code.value).inc()
        self.sink.control(error_message(err))

    async def _speak(self) -> None:
        await self.speaker.run()
        self._observe_first_audio()
        self.sink.finish(Finished(self.context, self._done_message))

    def _observe_first_audio(self) -> None:
        """TTFA's parts (``metrics.FIRST_AUDIO_STAGES``), those that are known."""
        t = self.speaker.first_times
        completed, cut = self.segments.first_segment_at, self.segments.first_cut_at
        if completed is None or cut is None or "began" not in t:
            return
        points = [("segmenter", completed, cut), ("queue", cut, t["began"])]
        model_at = self.speaker.first_marks.get(MODEL_OUTPUT_MARK)
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
        hist = self.shared.metrics.first_audio_stage_seconds
        for stage, a, b in points:
            hist.labels(self.voice.info.name, stage).observe(max(0.0, b - a))

    # --- the end -----------------------------------------------------------------

    def ttfa_ms(self) -> float | None:
        first = self.segments.first_segment_at
        if first is None or self.ledger.first_sent_at is None:
            return None
        return max(0.0, 1000.0 * (self.ledger.first_sent_at - first))

    def _done_message(self) -> Done:
        self._finish("done")
        ttfa = self.ttfa_ms()
        return Done(
            context=self.context, frames=self.ledger.next_seq,
            audio_ms=float(self.ledger.next_seq * self.start.frame_ms),
            ttfa_ms=None if ttfa is None else round(ttfa, 2),
            spoken_text=" ".join(self.speaker.spoken))

    def _finish(self, outcome: str) -> None:
        """Count the context's end once: load, outcome, TTFA, the log line."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        self._heard_facts()  # a ``played`` may come after the end
        shared = self.shared
        shared.load.active -= 1
        shared.load.starting.pop(id(self.ledger), None)
        metrics = shared.metrics
        metrics.contexts_total.labels(outcome).inc()
        name = self.voice.info.name
        ttfa = self.ttfa_ms()
        first_hint = self.speaker.first_hint_ms
        if ttfa is not None and outcome == "done":
            metrics.ttfa_seconds.labels(name).observe(ttfa / 1000.0)
            if first_hint is not None:
                metrics.first_heard_seconds.labels(name).observe((ttfa + first_hint) / 1000.0)
        log.info("context %s voice=%s chars=%d audio_ms=%d ttfa_ms=%s rtf=%.3f heard_ms=%.0f",
                 outcome, name, self.input.chars_in, self.ledger.next_seq * self.start.frame_ms,
                 "-" if ttfa is None else f"{ttfa:.1f}",
                 self.speaker.stats.rtf.percentile(0.5), self.heard_ms)


__all__ = ["SpeechContext"]
