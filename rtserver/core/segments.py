"""A context's segments: the segment loop cuts the input into segments on
time, and the segment queue holds them, in order, for the speaker.

``SegmentLoop`` owns the segmenter: its first-segment timers, the
starvation release (complete words go out when the listener would run dry
while a sentence still arrives) and the time the first segment's text was
complete (TTFA's start). ``SegmentQueue`` holds at most ``capacity_chars``
of segment text (the context's ``max_text_chars``: a segment's text is
normalized input, never longer than it): past it ``put`` waits (backpressure
on the loop, whose input then waits in ``ContextInput``, bounded there); a
segment alone always fits.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from rtserver.clock import Clock
from rtserver.core.events import Ledger
from rtserver.core.inputs import ContextInput, Input, InputKind
from rtserver.core.pronounce import check_phonemes
from rtserver.core.stats import VoiceStats
from rtserver.errors import RtError
from rtserver.pacing.hints import HintConfig
from rtserver.text.segmenter import Segment, Segmenter, SegmenterConfig
from rtserver.text.ssml import parse_ssml, ssml_segments
from rtserver.voices.base import SpeechControls

# Extra lead for a starvation release: the event loop, framing and the
# first network hop (a few ms each on loopback) plus one 20 ms frame.
STARVATION_MARGIN_S = 0.05


class SegmentQueue:
    """Segments for the speaker, then ``None`` (the end). One producer (the
    segment loop), one consumer (the speaker), which is ``busy`` from taking
    a segment until it asks for the next; ``on_idle`` is called when it asks
    and none is there."""

    def __init__(self, capacity_chars: int, on_idle: Callable[[], None]) -> None:
        if capacity_chars < 1:
            raise ValueError(f"capacity_chars must be >= 1, not {capacity_chars}")
        self.capacity_chars = capacity_chars
        self.busy = False
        self._on_idle = on_idle
        self._items: deque[Segment | None] = deque()
        self._chars = 0
        self._nonempty = asyncio.Event()
        self._space = asyncio.Event()

    @property
    def queued_chars(self) -> int:
        return self._chars

    @property
    def idle(self) -> bool:
        """The speaker waits for a segment: all audio of earlier ones is out."""
        return not self.busy and not self._items

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, segment: Segment | None) -> None:
        """Queue ``segment`` (None: the end), waiting while it would not fit."""
        size = 0 if segment is None else len(segment.text)
        while self._chars and self._chars + size > self.capacity_chars:
            self._space.clear()
            await self._space.wait()
        self._items.append(segment)
        self._chars += size
        self._nonempty.set()

    async def get(self) -> Segment | None:
        """The next segment, waiting for one; None: the end."""
        if not self._items:
            self.busy = False
            self._on_idle()
        while not self._items:
            self._nonempty.clear()
            await self._nonempty.wait()
        segment = self._items.popleft()
        if segment is not None:
            self._chars -= len(segment.text)
            self._space.set()
        self.busy = segment is not None
        return segment


class SegmentLoop:
    """Takes ``inputs``, cuts segments into ``queue`` until the end."""

    def __init__(self, inputs: ContextInput, queue: SegmentQueue, config: SegmenterConfig,
                 hints: HintConfig, stats: VoiceStats, ledger: Ledger, clock: Clock,
                 *, ssml: SpeechControls | None = None, voice: str = "this voice",
                 report: Callable[[RtError], None] | None = None,
                 speculate: Callable[[Segment | None], None] | None = None) -> None:
        self.inputs = inputs
        self.queue = queue
        self.first_segment_at: float | None = None  # its text was complete (TTFA's start)
        self.first_cut_at: float | None = None  # the segmenter cut it
        self._config = config
        self._hints = hints
        self._stats = stats
        self._ledger = ledger
        self._clock = clock
        self._ssml = ssml  # an SSML context: its voice's controls
        self._voice = voice
        self._report = report  # an error about the input that ends nothing
        self._speculate = speculate  # told the first segment's guess after each fragment
        self._starve_checked = -1  # pending chars at the last starvation release
        # (characters received so far, arrival time) per fragment, until the first segment
        self._arrivals: list[tuple[int, float]] = []

    async def run(self) -> None:
        if self._ssml is not None:
            await self._run_ssml(self._ssml)
            return
        segmenter = Segmenter(self._config)
        now = self._clock.now
        while True:
            timer = segmenter.deadline()
            starve = self._starvation_at(segmenter)
            deadline = min((t for t in (timer, starve) if t is not None), default=None)
            item = await self.inputs.next(None if deadline is None else deadline - now())
            t = now()
            if item is None:  # a deadline passed, or woken: the speaker went idle
                if timer is not None and t >= timer:
                    await self._emit(segmenter.poll(t))
                elif starve is not None and t >= starve:
                    # the listener is about to run dry while the sentence still
                    # arrives: speak its complete words now rather than stall
                    self._starve_checked = segmenter.pending_chars
                    await self._emit(segmenter.release_words(t))
                continue
            if item.kind is InputKind.TEXT:
                if self.first_segment_at is None:
                    self._arrivals.append((item.end, item.at))
                await self._emit(segmenter.feed(item.text, t))
                if (self.first_segment_at is None and self._speculate is not None
                        and not len(self.inputs)):  # (queued text decides at once)
                    self._speculate(segmenter.tentative())
            elif item.kind is InputKind.FLUSH:
                await self._emit(segmenter.flush(t), item)
            else:
                await self._emit(segmenter.end(t), item)
                await self.queue.put(None)
                return

    async def _run_ssml(self, controls: SpeechControls) -> None:
        """An SSML context: the document is whole at ``end`` (``flush`` changes
        nothing); then it is parsed and its segments queued
        (``rtserver.text.ssml``). A document that is not well-formed or that
        the voice cannot honour is reported (``error`` about the document, as
        for any bad input) and nothing of it is spoken: the context ends with
        ``done`` and no audio."""
        parts: list[str] = []
        while True:
            item = await self.inputs.next(None)
            if item is None or item.kind is InputKind.FLUSH:
                continue
            if item.kind is InputKind.TEXT:
                parts.append(item.text)
                continue
            document = "".join(parts)
            try:
                items = parse_ssml(document, phonemes=controls.phonemes,
                                   rate=controls.speed_range is not None, voice=self._voice)
                segments = ssml_segments(items, self._config, (0, len(document)))
                check_phonemes(segments, controls, self._voice)
            except RtError as err:
                if self._report is None:
                    raise
                self._report(err)
                segments = []
            await self._emit(segments, item)
            await self.queue.put(None)
            return

    def _starvation_at(self, segmenter: Segmenter) -> float | None:
        """When to release buffered words so the listener does not run dry.

        Only while the speaker is idle (all audio of earlier segments is out)
        and text is buffered: the listener's audio ends at the latest at
        ``first frame sent + audio sent`` (playback cannot start earlier); the
        release must come before that by the time the words take to
        synthesize (measured rtf) plus the jitter allowance.
        """
        ledger = self._ledger
        sent = ledger.first_sent_at
        pending = segmenter.pending_chars
        if (sent is None or not self.queue.idle or pending == 0
                or pending == self._starve_checked):
            return None
        hints = self._hints
        audio_end = sent + ledger.next_seq * ledger.frame_ms / 1000.0
        rtf = self._stats.rtf_estimate(hints.percentile, self._clock.now())
        synth_s = rtf * pending * self._stats.audio_ms_per_char / 1000.0
        return audio_end - synth_s - hints.jitter_ms / 1000.0 - STARVATION_MARGIN_S

    async def _emit(self, segments: list[Segment], item: Input | None = None) -> None:
        for seg in segments:
            if self.first_segment_at is None:
                self.first_segment_at = self._completed_at(seg, item)
                self.first_cut_at = self._clock.now()
            await self.queue.put(seg)

    def _completed_at(self, seg: Segment, item: Input | None) -> float:
        """When the core had the text that completes ``seg`` (PROTOCOL.md, TTFA):
        the arrival of the fragment holding its last character, or of the
        ``flush``/``end`` that released it. A segment the first-segment timer
        released counts from its last fragment too, so the wait is included.
        """
        if item is not None and item.kind is not InputKind.TEXT:
            return item.at
        for end, at in self._arrivals:
            if end >= seg.source[1]:
                return at
        return self._clock.now()


__all__ = ["STARVATION_MARGIN_S", "SegmentLoop", "SegmentQueue"]
