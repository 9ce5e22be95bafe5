"""The SSML subset (rtserver.text.ssml): what it honours, what it refuses, and
how a document becomes segments."""

from __future__ import annotations

import pytest

from rtserver.errors import BadMessage, ErrorCode, RtError, UnsupportedSsml
from rtserver.text.lexicon import PhonemeSpan
from rtserver.text.segmenter import SegmenterConfig
from rtserver.text.ssml import Break, Run, parse_ssml, ssml_segments

NS = 'xmlns="http://www.w3.org/2001/10/synthesis" version="1.1" xml:lang="en-US"'


def parse(doc: str, *, phonemes: bool = True, rate: bool = True) -> list[Run | Break]:
    return parse_ssml(doc, phonemes=phonemes, rate=rate, voice="piper:test")


def test_breaks_subs_and_phonemes_become_runs_and_pauses() -> None:
    doc = (f'<speak {NS}>Hello <sub alias="World Wide Web Consortium">W3C</sub>.'
           '<break time="1.5s"/><break time="250ms"/>I like '
           '<phoneme alphabet="ipa" ph="təmˈɑːtoʊ">tomato</phoneme> soup.'
           '<break strength="weak"/></speak>')
    assert parse(doc) == [
        Run("Hello World Wide Web Consortium."),
        Break(1750.0),
        Run("I like tomato soup.", phonemes=(PhonemeSpan(7, 13, "təmˈɑːtoʊ"),)),
        Break(250.0),
    ]


def test_prosody_rates_split_runs_and_nest_by_multiplying() -> None:
    doc = ('<speak>Normal <prosody rate="slow">slow <prosody rate="200%">fast'
           '</prosody></prosody> again <prosody rate="+20%">up</prosody></speak>')
    assert parse(doc) == [Run("Normal ", 1.0), Run("slow ", 0.75), Run("fast", 1.5),
                          Run(" again ", 1.0), Run("up", 1.2)]


@pytest.mark.parametrize(("doc", "code"), [
    ("<speak><emphasis>no</emphasis></speak>", ErrorCode.UNSUPPORTED_SSML),
    ("<speak><audio src='x.wav'/></speak>", ErrorCode.UNSUPPORTED_SSML),
    ('<speak><prosody pitch="high">no</prosody></speak>', ErrorCode.UNSUPPORTED_SSML),
    ('<speak><break time="1s" foo="x"/></speak>', ErrorCode.UNSUPPORTED_SSML),
    ('<speak><phoneme alphabet="x-sampa" ph="@">a</phoneme></speak>',
     ErrorCode.UNSUPPORTED_SSML),
    ("<p>not speak</p>", ErrorCode.UNSUPPORTED_SSML),
    ('<speak xmlns="urn:other">x</speak>', ErrorCode.UNSUPPORTED_SSML),
    ("<speak>unclosed", ErrorCode.BAD_MESSAGE),
    ('<speak><break time="11s"/></speak>', ErrorCode.BAD_MESSAGE),
    ('<speak><break time="loud"/></speak>', ErrorCode.BAD_MESSAGE),
    ('<speak><prosody rate="9000%">x</prosody></speak>', ErrorCode.BAD_MESSAGE),
    ('<speak><sub>no alias</sub></speak>', ErrorCode.BAD_MESSAGE),
    ('<speak><sub alias="[laugh]">x</sub></speak>', ErrorCode.BAD_MESSAGE),
    ('<!DOCTYPE speak [<!ENTITY a "b">]><speak>&a;</speak>', ErrorCode.BAD_MESSAGE),
])
def test_anything_outside_the_subset_is_an_error_with_a_code(doc: str, code: ErrorCode
                                                             ) -> None:
    with pytest.raises(RtError) as info:
        parse(doc)
    assert info.value.code is code


def test_a_voice_without_phonemes_or_speed_refuses_those_elements() -> None:
    with pytest.raises(UnsupportedSsml, match="piper:test does not take phonemes"):
        parse('<speak><phoneme ph="a">a</phoneme></speak>', phonemes=False)
    with pytest.raises(UnsupportedSsml, match="no speed control"):
        parse('<speak><prosody rate="fast">a</prosody></speak>', rate=False)
    # what every voice honours
    assert parse('<speak>a<break time="1s"/><sub alias="b">c</sub></speak>',
                 phonemes=False, rate=False) == [Run("a"), Break(1000.0), Run("b")]


def test_segments_carry_speed_pauses_and_phonemes_in_their_own_text() -> None:
    doc = ('<speak><break time="300ms"/>Hello there, friend. '
           '<prosody rate="x-fast">I like <phoneme ph="təmˈɑːtoʊ">tomato</phoneme> soup.'
           '</prosody><break time="2s"/></speak>')
    segments = ssml_segments(parse(doc), SegmenterConfig(), (0, len(doc)))
    assert [s.text for s in segments] == ["Hello there,", "friend.", "I like tomato soup."]
    assert [s.index for s in segments] == [0, 1, 2]
    assert [s.speed for s in segments] == [1.0, 1.0, 1.5]
    assert [(s.pause_before_ms, s.pause_after_ms) for s in segments] == [
        (300.0, 0.0), (0.0, 0.0), (0.0, 2000.0)]
    last = segments[2]
    assert [(last.text[p.start:p.end], p.phoneme) for p in last.phonemes] == [
        ("tomato", "təmˈɑːtoʊ")]
    assert all(s.source == (0, len(doc)) for s in segments)


def test_a_phoneme_that_normalization_changes_is_refused() -> None:
    doc = '<speak>I like <phoneme ph="x">**tomato**</phoneme> soup.</speak>'
    with pytest.raises(BadMessage, match="normalization"):
        ssml_segments(parse(doc), SegmenterConfig(), (0, len(doc)))
