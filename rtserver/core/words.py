"""A segment's ``words`` events: word times in the context's audio timeline
(PROTOCOL-EXTENSIONS.md, ``words``). Pure: no asyncio.

The timeline is the one a listener hears: ms from the context's first
sample. The core's resampler is exact across chunks and segments (its
output is the one-shot conversion of the voice's concatenated audio) and
the Opus decoder, once it drops ``pre_skip``, gives every input sample in
place (``audio.opus``), so a time on the voice's audio is the same time on
the decoded audio: the segment's start is the voice's samples before it
(every earlier segment's audio, their silences included) over its rate.

Two sources: a voice that times words itself (``VoiceInfo.word_timing``
"model") puts them on its chunks (``PcmChunk.words``, from the segment's
first sample); for the others the words are spread over the segment's
expected audio (the voice's measured audio per character, ``VoiceStats``)
by the character offset each starts and ends at, "estimated", sent before
the segment's first frame like the model's (a listener needs them before
it hears the words).

``source`` maps a word back into the context's text as received: exact
where the segment's text has the length of the text it came from (the
normalizer changed nothing in it: the usual case), else scaled within the
segment's ``source``.
"""

from __future__ import annotations

from collections.abc import Iterable

from rtserver.audio.pcm import WordTime
from rtserver.protocol.messages import Words, WordSpan, WordTiming
from rtserver.text.segmenter import Segment
from rtserver.text.words import text_words


def word_source(seg: Segment, start_char: int, end_char: int) -> tuple[int, int]:
    """``[start, end)`` in the context's text of ``seg.text[start_char:end_char]``."""
    a, b = seg.source
    n = len(seg.text)
    if b - a == n or n == 0:
        return (a + start_char, a + end_char)
    scale = (b - a) / n
    return (a + round(start_char * scale), a + round(end_char * scale))


def timed_words(context: str, seg: Segment, times: Iterable[WordTime], start_s: float, *,
                timing: WordTiming) -> Words:
    """The ``words`` event of ``times`` (from the segment's first sample),
    the segment starting ``start_s`` into the context's audio."""
    return Words(context=context, segment=seg.index, timing=timing, words=tuple(
        WordSpan(text=seg.text[w.start_char:w.end_char],
                 start_ms=round(1000.0 * (start_s + w.start_s), 1),
                 end_ms=round(1000.0 * (start_s + w.end_s), 1),
                 source=word_source(seg, w.start_char, w.end_char))
        for w in times))


def estimated_times(text: str, audio_s: float) -> list[WordTime]:
    """The words of ``text`` spread over ``audio_s`` seconds by the
    character offsets each starts and ends at."""
    n = max(1, len(text))
    return [WordTime(a, b, audio_s * a / n, audio_s * b / n) for a, b in text_words(text)]


__all__ = ["estimated_times", "timed_words", "word_source"]
