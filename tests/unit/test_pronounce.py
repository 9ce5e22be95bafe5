"""A context's lexicon and speed against its voice (rtserver.core.pronounce),
the ``start`` fields that carry them, and each family's part (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rtserver.core.pronounce import (
    Pronouncer,
    check_phonemes,
    compile_voice_lexicon,
    voice_lexicons,
)
from rtserver.errors import BadMessage, ConfigError, ErrorCode, LexiconTooLarge
from rtserver.protocol.messages import (
    LexiconEntry,
    Start,
    encode_client_message,
    parse_client_message,
)
from rtserver.text.lexicon import Entry, PhonemeSpan
from rtserver.text.segmenter import Segment
from rtserver.voices.base import SpeechControls, VoiceInfo

PIPER_LIKE = VoiceInfo(name="piper:x", family="piper", sample_rate=22050,
                       controls=SpeechControls(phoneme_alphabet="ipa",
                                               phoneme_symbols=frozenset("təmˈɑːoʊ "),
                                               speed_range=(0.5, 2.0)))
NO_CONTROLS = VoiceInfo(name="orpheus:tara", family="orpheus", sample_rate=24000)


def start(**fields: object) -> Start:
    return Start(context="c", **fields)  # type: ignore[arg-type]


def test_a_voice_without_speed_refuses_one_and_one_with_it_takes_it() -> None:
    with pytest.raises(BadMessage, match="orpheus:tara has no speed control") as info:
        Pronouncer.of(start(speed=1.5), NO_CONTROLS)
    assert info.value.context == "c"
    assert Pronouncer.of(start(speed=1.0), NO_CONTROLS).speed == 1.0  # 1 asks for nothing
    assert Pronouncer.of(start(speed=1.5), PIPER_LIKE).speed == 1.5
    narrow = VoiceInfo(name="v", family="f", sample_rate=1,
                       controls=SpeechControls(speed_range=(0.8, 1.2)))
    with pytest.raises(BadMessage, match=r"0\.8 to 1\.2"):
        Pronouncer.of(start(speed=1.5), narrow)


def test_phonemes_are_checked_against_the_voices_symbols() -> None:
    lexicon = (LexiconEntry(grapheme="tomato", phoneme="təmˈɑːtoʊ"),)
    Pronouncer.of(start(lexicon=lexicon), PIPER_LIKE)
    with pytest.raises(BadMessage, match="no phoneme 'ʃ'"):
        Pronouncer.of(start(lexicon=(LexiconEntry(grapheme="x", phoneme="ʃtʃ"),)), PIPER_LIKE)
    with pytest.raises(BadMessage, match="only a phoneme"):
        Pronouncer.of(start(lexicon=lexicon), NO_CONTROLS)
    with pytest.raises(LexiconTooLarge) as info:
        Pronouncer.of(start(lexicon=(LexiconEntry(grapheme="x" * 101, alias="y"),)),
                      NO_CONTROLS)
    assert info.value.context == "c"


def test_a_segment_is_prepared_with_aliases_phonemes_and_speed() -> None:
    p = Pronouncer.of(start(speed=1.5, lexicon=(
        LexiconEntry(grapheme="SQL", alias="sequel"),
        LexiconEntry(grapheme="tomato", phoneme="təmˈɑːtoʊ", alias="tomahto"))), PIPER_LIKE,
        voice_lexicon=compile_voice_lexicon(  # the context's entry comes first
            [Entry("sql", alias="S Q L"), Entry("and", alias="plus")], PIPER_LIKE))
    seg = p.prepare(Segment(0, "SQL and tomato.", (0, 15), speed=1.5))
    assert seg.text == "sequel plus tomato."
    assert seg.phonemes == (PhonemeSpan(12, 18, "təmˈɑːtoʊ"),)
    assert seg.speed == 2.0  # 1.5 x 1.5, within the voice's range
    other = Pronouncer.of(start(lexicon=(
        LexiconEntry(grapheme="tomato", phoneme="təmˈɑːtoʊ", alias="tomahto"),)), NO_CONTROLS)
    seg = other.prepare(Segment(0, "tomato", (0, 6), speed=1.5))
    assert (seg.text, seg.phonemes, seg.speed) == ("tomahto", (), 1.0)


def test_an_ssml_phoneme_the_voice_lacks_is_refused() -> None:
    ok = Segment(0, "x", (0, 1), phonemes=(PhonemeSpan(0, 1, "tə"),))
    check_phonemes([ok], PIPER_LIKE.controls, "piper:x")
    bad = Segment(1, "x", (0, 1), phonemes=(PhonemeSpan(0, 1, "ʃ"),))
    with pytest.raises(BadMessage, match="SSML <phoneme>: piper:x has no phoneme 'ʃ'"):
        check_phonemes([ok, bad], PIPER_LIKE.controls, "piper:x")


def test_start_carries_lexicon_speed_and_text_format_both_ways() -> None:
    message = Start(context="c", lexicon=(LexiconEntry(grapheme="a", alias="b"),
                                          LexiconEntry(grapheme="US", phoneme="jˈuːˈɛs",
                                                       case_sensitive=True)),
                    speed=1.25, text_format="ssml")
    assert parse_client_message(encode_client_message(message)) == message
    plain = json.loads(encode_client_message(Start(context="c")))
    assert set(plain) == {"type", "context", "format", "sample_rate", "frame_ms"}


@pytest.mark.parametrize(("body", "what"), [
    ({"speed": 0.25}, "'speed' must be 0.5 to 2.0"),
    ({"speed": "fast"}, "'speed'"),
    ({"speed": True}, "'speed'"),
    ({"text_format": "markdown"}, "text_format"),
    ({"lexicon": {"grapheme": "a"}}, "'lexicon'"),
    ({"lexicon": ["a"]}, "lexicon entry 0 is not an object"),
    ({"lexicon": [{"alias": "a"}]}, "lexicon entry 0: missing field 'grapheme'"),
    ({"lexicon": [{"grapheme": "a", "alias": 3}]}, "lexicon entry 0: field 'alias'"),
])
def test_bad_start_fields_are_bad_messages(body: dict[str, object], what: str) -> None:
    with pytest.raises(BadMessage) as info:
        parse_client_message(json.dumps({"type": "start", "context": "c", **body}))
    assert info.value.code is ErrorCode.BAD_MESSAGE and what in info.value.message


def test_voice_lexicons_come_from_pls_files(tmp_path: Path) -> None:
    pls = tmp_path / "names.pls"
    pls.write_text('<lexicon version="1.0" alphabet="ipa"><lexeme><grapheme>Nguyen</grapheme>'
                   "<alias>Win</alias></lexeme></lexicon>", encoding="utf-8")
    voices = ["piper:en_US-joe-medium", "orpheus:tara"]
    assert voice_lexicons([f"en_US-joe-medium={pls}"], voices) == {
        "piper:en_US-joe-medium": (Entry("Nguyen", alias="Win"),)}
    assert set(voice_lexicons([str(pls)], voices)) == set(voices)
    with pytest.raises(ConfigError, match="no loaded voice 'nobody'"):
        voice_lexicons([f"nobody={pls}"], voices)
    with pytest.raises(ConfigError, match=r"missing\.pls"):
        voice_lexicons([str(tmp_path / "missing.pls")], voices)


def test_chattts_speed_scales_its_speed_token() -> None:
    from rtserver.voices.chattts.text import speed_level

    assert [speed_level(5, s) for s in (0.5, 1.0, 1.5, 2.0)] == [2, 5, 8, 9]
    assert speed_level(0, 2.0) == 0


def test_each_family_says_what_it_honours() -> None:
    from rtserver.voices.chattts.voice import CONTROLS as CHATTTS
    from rtserver.voices.orpheus.voice import CONTROLS as ORPHEUS
    from rtserver.voices.piper.voice import CONTROLS as PIPER

    assert PIPER.capabilities() == {
        "lexicon": ["alias", "phoneme"], "phoneme_alphabet": "ipa",
        "ssml": ["speak", "break", "sub", "phoneme", "prosody"], "speed": [0.5, 2.0]}
    assert CHATTTS.capabilities()["lexicon"] == ["alias"]
    assert CHATTTS.capabilities()["speed"] == [0.5, 2.0]
    assert ORPHEUS.capabilities() == {"lexicon": ["alias"], "phoneme_alphabet": None,
                                      "ssml": ["speak", "break", "sub"], "speed": None}


def test_a_voices_lexicon_is_checked_against_it_at_start_up() -> None:
    with pytest.raises(ConfigError, match="'x' has a phoneme piper:x lacks"):
        compile_voice_lexicon([Entry("x", phoneme="ʃ")], PIPER_LIKE)
    with pytest.raises(ConfigError, match="only a phoneme"):
        compile_voice_lexicon([Entry("x", phoneme="tə")], NO_CONTROLS)
