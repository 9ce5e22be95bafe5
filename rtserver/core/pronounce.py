"""How a context's segments are to be spoken: its lexicon (the voice's and its
own), its speed, and the checks that the voice can honour them.

``Pronouncer.of(start, voice info, voice lexicon)`` is built when a context
opens and raises there (``bad_message``, ``lexicon_too_large``) for what the
voice cannot honour: a phoneme-only entry or an SSML document on a voice
without phonemes is never spoken as if it were plain text. ``prepare(seg)``
gives the segment the speaker speaks: aliases applied (what ``segment.text``
shows), phoneme spans for a voice that takes them, the speed.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rtserver.errors import BadMessage, ConfigError, RtError
from rtserver.protocol.messages import Start
from rtserver.text.lexicon import (
    MAX_FILE_ENTRIES,
    MAX_PLS_BYTES,
    Entry,
    Lexicon,
    PhonemeSpan,
    parse_pls,
)
from rtserver.text.segmenter import Segment
from rtserver.voices.base import SpeechControls, VoiceInfo


def unknown_symbols(phoneme: str, controls: SpeechControls) -> str:
    """The symbols of ``phoneme`` (NFD, as espeak's output is split) the voice
    does not know, in order, once each; "" when it knows them all."""
    known = controls.phoneme_symbols
    if not known:
        return ""
    seen: list[str] = []
    for ch in unicodedata.normalize("NFD", phoneme):
        if ch not in known and ch not in seen:
            seen.append(ch)
    return "".join(seen)


def check_phonemes(segments: Sequence[Segment], controls: SpeechControls, voice: str) -> None:
    """``BadMessage`` for an SSML ``<phoneme>`` with a symbol ``voice`` lacks."""
    for seg in segments:
        for span in seg.phonemes:
            if bad := unknown_symbols(span.phoneme, controls):
                raise BadMessage(f"SSML <phoneme>: {voice} has no phoneme {bad[:10]!r}")


@dataclass(frozen=True, slots=True)
class Pronouncer:
    """A context's lexicon and speed, checked against its voice."""

    lexicon: Lexicon
    controls: SpeechControls
    voice: str
    speed: float = 1.0
    ssml: bool = False

    @classmethod
    def of(cls, start: Start, info: VoiceInfo, voice_lexicon: Lexicon | None = None
           ) -> Pronouncer:
        """Raises ``BadMessage`` / ``LexiconTooLarge`` (naming the entry) for
        what ``info``'s voice cannot honour. ``voice_lexicon``: the voice's own,
        compiled once (``compile_voice_lexicon``); the context's entries come
        before it."""
        controls = info.controls
        own = [Entry(e.grapheme, e.phoneme, e.alias, e.case_sensitive) for e in start.lexicon]
        try:
            lexicon = Lexicon(own, phonemes=controls.phonemes)
        except RtError as exc:  # bad_message, lexicon_too_large
            exc.context = start.context
            raise
        if controls.phonemes:
            for i, entry in enumerate(own):
                if entry.phoneme is not None and (bad := unknown_symbols(entry.phoneme,
                                                                         controls)):
                    raise BadMessage(f"lexicon entry {i}: {info.name} has no phoneme "
                                     f"{bad[:10]!r}", context=start.context)
        if voice_lexicon is not None:
            lexicon = lexicon.over(voice_lexicon) if own else voice_lexicon
        speed = 1.0 if start.speed is None else start.speed
        if start.speed is not None and start.speed != 1.0:
            if controls.speed_range is None:
                raise BadMessage(f"{info.name} has no speed control ('speed')",
                                 context=start.context)
            lo, hi = controls.speed_range
            if not lo <= speed <= hi:
                raise BadMessage(f"{info.name} speaks at speed {lo} to {hi}",
                                 context=start.context)
        return cls(lexicon, controls, info.name, speed, start.text_format == "ssml")

    def prepare(self, seg: Segment) -> Segment:
        """``seg`` as the voice speaks it: aliases applied, phoneme spans (the
        lexicon's and SSML's), speed (the context's times SSML's rate, within
        the voice's range)."""
        said = self.lexicon.apply(seg.text, seg.phonemes)
        speed = self.speed * seg.speed
        if self.controls.speed_range is not None:
            lo, hi = self.controls.speed_range
            speed = min(hi, max(lo, speed))
        else:
            speed = 1.0
        spans: tuple[PhonemeSpan, ...] = said.phonemes if self.controls.phonemes else ()
        return replace(seg, text=said.text, phonemes=spans, speed=speed)


def compile_voice_lexicon(entries: Sequence[Entry], info: VoiceInfo) -> Lexicon:
    """A voice's own lexicon (``[voice] lexicons``), compiled for it once;
    ``ConfigError`` for what it cannot honour."""
    try:
        lexicon = Lexicon(entries, phonemes=info.controls.phonemes,
                          max_entries=MAX_FILE_ENTRIES)
    except RtError as exc:
        raise ConfigError(f"the lexicon of {info.name}: {exc.message}") from None
    if info.controls.phonemes:
        for entry in entries:
            if entry.phoneme is not None and (bad := unknown_symbols(entry.phoneme,
                                                                     info.controls)):
                raise ConfigError(f"the lexicon of {info.name}: {entry.grapheme!r} has a "
                                  f"phoneme {info.name} lacks: {bad[:10]!r}")
    return lexicon


def voice_lexicons(items: Sequence[str], voices: Sequence[str]
                   ) -> dict[str, tuple[Entry, ...]]:
    """``[voice] lexicons`` read: each voice's entries, in the order given.
    ``items``: "VOICE=FILE" (a full name or the part after the colon) or
    "FILE" (every voice). Raises ``ConfigError`` naming the item."""
    found: dict[str, list[Entry]] = {}
    for item in items:
        name, sep, path = item.rpartition("=")
        if not sep:
            targets = list(voices)
        else:
            targets = [v for v in voices if name in (v, v.partition(":")[2])]
            if not targets:
                raise ConfigError(f"voice.lexicons {item!r}: no loaded voice {name!r}")
        try:
            with open(path, encoding="utf-8") as f:
                document = f.read(MAX_PLS_BYTES + 1)
            entries = parse_pls(document)
        except OSError as exc:
            raise ConfigError(f"voice.lexicons {item!r}: {exc}") from None
        except RtError as exc:
            raise ConfigError(f"voice.lexicons {item!r}: {exc.message}") from None
        for voice in targets:
            found.setdefault(voice, []).extend(entries)
    return {voice: tuple(entries) for voice, entries in found.items()}


__all__ = ["Pronouncer", "check_phonemes", "compile_voice_lexicon", "unknown_symbols",
           "voice_lexicons"]
