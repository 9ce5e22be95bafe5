"""Word times: Piper's phonemes to words (pure), the core's ``words`` events in
the context's timeline (fake voices, a recording sink), the message on the wire."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import msgspec
import numpy as np

from rtserver.audio.pcm import PcmChunk, WordTime
from rtserver.clock import ManualClock
from rtserver.core.stats import DEFAULT_AUDIO_MS_PER_CHAR
from rtserver.core.words import estimated_times, word_source
from rtserver.protocol.messages import (
    AudioFormat,
    SegmentStarted,
    Start,
    Words,
    WordSpan,
    encode_server_message,
    parse_server_message,
)
from rtserver.text.segmenter import Segment
from rtserver.voices.base import SynthesisRequest, VoiceInfo, WordTimingKind
from rtserver.voices.piper.words import WordPlan, align_words, phoneme_frames
from tests.unit.test_core_guarantees import RecordingSink, audio_of, core_with

RATE = 16000


def test_words_espeak_joined_are_split_where_the_words_alone_meet() -> None:
    """espeak speaks "in the house" as ``ɪnðə hˈaʊs``: "in" and "the" still
    get their own phonemes."""
    spoken = list("ɪnðə hˈaʊs.")
    ranges = align_words(spoken, [list("ˈɪn"), list("ðˈə"), list("hˈaʊs.")])
    assert ["".join(spoken[a:b]) for a, b in ranges] == ["ɪn", "ðə", "hˈaʊs"]


def test_a_number_spelled_out_as_several_words_stays_one_word() -> None:
    spoken = list("pˈeɪ tˈuː θˈaʊzənd nˈaʊ")
    alone = [list("pˈeɪ"), list("tˈuː θˈaʊzənd"), list("nˈaʊ")]
    ranges = align_words(spoken, alone)
    assert ["".join(spoken[a:b]) for a, b in ranges] == ["pˈeɪ", "tˈuː θˈaʊzənd", "nˈaʊ"]


def test_a_word_without_sounds_gets_an_empty_range_in_place() -> None:
    spoken = list("jˈɛs nˈoʊ")
    ranges = align_words(spoken, [list("jˈɛs"), [], list("nˈoʊ")])
    assert ranges[1][0] == ranges[1][1] and ranges[0][1] <= ranges[1][0] <= ranges[2][0]


def test_phoneme_frames_follow_pipers_id_layout() -> None:
    """BOS, PAD, then each phoneme's ids and a PAD, then EOS (piper.phoneme_ids)."""
    id_map = {"^": [1], "_": [0], "$": [2], "a": [10], "b": [11], " ": [3]}
    # ids: ^ _ a _ " " _ b _ $  -> 9 durations
    durations = np.asarray([1, 0, 3, 1, 2, 0, 4, 1, 5], dtype=np.float32)
    edges = phoneme_frames(list("a b"), id_map, durations)
    assert edges.tolist() == [1, 5, 7, 12]  # a: frames 1-5 (its id and pad), " ": 5-7, b: 7-12
    try:
        phoneme_frames(list("ab"), id_map, durations[:-1])
    except ValueError:
        pass
    else:
        raise AssertionError("a mismatch of ids and durations must raise")


def test_word_plan_times_each_sentences_words_from_the_segment_start() -> None:
    id_map = {"^": [1], "_": [0], "$": [2], "a": [10], "b": [11], " ": [3], ".": [4]}
    sentences = [list("a."), list("b b")]
    plan = WordPlan.of("A. B B", sentences, lambda w: [c for c in w.lower() if c.isalpha()])
    first = plan.sentence_words(0, phoneme_frames(sentences[0], id_map, np.asarray(
        [1, 0, 2, 0, 3, 1, 0], dtype=np.float32)), offset_s=0.0, frame_s=0.01)
    assert [(w.start_char, w.end_char) for w in first] == [(0, 2)]
    assert (first[0].start_s, first[0].end_s) == (0.01, 0.03)
    durations = np.asarray([1, 0, 2, 1, 1, 0, 2, 1, 3], dtype=np.float32)
    second = plan.sentence_words(1, phoneme_frames(sentences[1], id_map, durations),
                                 offset_s=0.5, frame_s=0.01)
    assert [(w.start_char, w.end_char) for w in second] == [(3, 4), (5, 6)]
    assert [(w.start_s, w.end_s) for w in second] == [(0.51, 0.54), (0.55, 0.58)]


def test_word_source_is_exact_when_normalization_changed_nothing() -> None:
    seg = Segment(1, "Hello there.", (20, 32))
    assert word_source(seg, 6, 12) == (26, 32)
    squeezed = Segment(1, "bold word", (0, 13))  # "**bold** word" -> "bold word"
    a, b = word_source(squeezed, 5, 9)
    assert 0 <= a < b <= 13


def test_estimated_words_are_spread_by_character_offsets() -> None:
    times = estimated_times("ab cd", 1.0)
    assert [(t.start_s, t.end_s) for t in times] == [(0.0, 0.4), (0.6, 1.0)]


def test_words_round_trip_through_the_wire() -> None:
    msg = Words(context="c", segment=2, timing="model", words=(
        WordSpan(text="Hi,", start_ms=10.5, end_ms=200.0, source=(0, 3)),))
    text = encode_server_message(msg)
    assert msgspec.json.decode(text)["type"] == "words"
    assert parse_server_message(text) == msg


@dataclass
class TimedVoice:
    """Each segment: two chunks of ``chunk_ms``; a "model" voice puts one
    word time per word on its first chunk (word i at [0.1 i, 0.1 i + 0.05) s)."""

    timing: WordTimingKind
    chunk_ms: int = 300
    info: VoiceInfo = field(init=False)

    def __post_init__(self) -> None:
        self.info = VoiceInfo(name="fake:w", family="fake", sample_rate=RATE,
                              word_timing=self.timing)

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        words: tuple[WordTime, ...] = ()
        if self.timing == "model":
            spans = [(i, w) for i, w in enumerate(request.text.split())]
            at = 0
            out = []
            for i, w in spans:
                a = request.text.index(w, at)
                at = a + len(w)
                out.append(WordTime(a, at, 0.1 * i, 0.1 * i + 0.05))
            words = tuple(out)
        n = RATE * self.chunk_ms // 1000
        yield PcmChunk(np.full(n, 0.1, np.float32), RATE, words=words)
        yield PcmChunk(np.full(n, 0.1, np.float32), RATE)


async def _spoken(timing: WordTimingKind, fmt: AudioFormat = "pcm_s16le",
                  ) -> tuple[RecordingSink, list[Words]]:
    clock = ManualClock(10.0)
    voice = TimedVoice(timing)
    core = core_with(voice, clock)  # type: ignore[arg-type]
    sink = RecordingSink()
    ctx = core.open(Start(context="c", format=fmt, sample_rate=48000 if fmt == "opus"
                          else RATE, frame_ms=20), sink)
    ctx.feed("Hello there. How are you today?")
    ctx.end()
    assert await ctx.run() == "done"
    return sink, [e for e in sink.events if isinstance(e, Words)]


async def test_model_words_are_placed_in_the_contexts_timeline_before_their_audio() -> None:
    sink, words = await _spoken("model")
    assert [w.segment for w in words] == [0, 1] and {w.timing for w in words} == {"model"}
    # segment 1 starts after segment 0's 600 ms of audio: its words are offset by it
    assert [(s.text, s.start_ms, s.end_ms) for s in words[1].words[:2]] == [
        ("How", 600.0, 650.0), ("are", 700.0, 750.0)]
    assert words[1].words[0].source == (13, 16)  # "How" in the text as sent
    frames = audio_of(sink.events)
    segments = [e for e in sink.events if isinstance(e, SegmentStarted)]
    for event, seg in zip(words, segments, strict=True):
        first = next(f for f in frames if f.seq + len(f.frames) > seg.seq)
        assert sink.events.index(seg) < sink.events.index(event) < sink.events.index(first)


async def test_a_voice_without_word_times_gets_estimated_words_before_its_audio() -> None:
    sink, words = await _spoken("estimated")
    assert {w.timing for w in words} == {"estimated"}
    texts = [s.text for w in words for s in w.words]
    assert texts == "Hello there. How are you today?".split()
    # segment 0 spread over its expected audio (the voice's audio per character
    # before any segment was measured), segment 1 from where segment 0 really ended
    expected_s = len("Hello there.") * DEFAULT_AUDIO_MS_PER_CHAR
    assert words[0].words[-1].end_ms == round(expected_s, 1)
    assert words[1].words[0].start_ms == 600.0
    frames = audio_of(sink.events)
    assert sink.events.index(words[0]) < sink.events.index(frames[0])


async def test_word_times_do_not_move_with_the_opus_encoder_delay() -> None:
    """Opus drops ``pre_skip`` at the decoder: the timeline is the voice's."""
    _, pcm_words = await _spoken("model", "pcm_s16le")
    _, opus_words = await _spoken("model", "opus")
    assert [w.words for w in pcm_words] == [w.words for w in opus_words]
