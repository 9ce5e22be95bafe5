"""The SSML subset rtserver honours (pure): parse a document, cut it into
segments.

A context opened with ``"text_format": "ssml"`` takes one SSML document,
sent in any number of ``text`` fragments; it is parsed when ``end`` arrives
(tags may be split anywhere between fragments, and nothing is spoken before
the document is whole: a document cannot be checked before its last tag).
The subset (SSML 1.1, https://www.w3.org/TR/speech-synthesis11/):

- ``<speak>``: the root (``version`` and ``xml:lang`` accepted, the SSML
  namespace or none).
- ``<break time="500ms"|"1.5s" strength="...">``: that much silence in the
  audio (``strength``: none 0, x-weak 100, weak 250, medium 500, strong 750,
  x-strong 1000 ms; neither attribute: medium), at most ``MAX_BREAK_MS``.
- ``<sub alias="...">text</sub>``: speaks the alias; ``segment.text`` shows it.
- ``<phoneme alphabet="ipa" ph="...">text</phoneme>``: speaks the IPA (a voice
  that takes phonemes only; Piper).
- ``<prosody rate="...">``: ``x-slow`` 0.5, ``slow`` 0.75, ``medium`` 1,
  ``fast`` 1.25, ``x-fast`` 1.5, ``default`` 1, a percentage (``150%``, or a
  change, ``+20%``) or a multiplier (``1.2``); nested rates multiply (a voice
  that has a speed only).

Any other element or attribute, a ``<phoneme>`` or ``<prosody>`` the voice
cannot honour, or a DOCTYPE is refused (``unsupported_ssml``, or
``bad_message`` for XML that is not well-formed or a value out of range):
never silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from xml.etree import ElementTree

from rtserver.errors import BadMessage, UnsupportedSsml
from rtserver.text.lexicon import ALIAS_REFUSED, PhonemeSpan, refuse_dtd
from rtserver.text.segmenter import Segment, Segmenter, SegmenterConfig

SSML_NAMESPACE = "http://www.w3.org/2001/10/synthesis"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
MAX_BREAK_MS = 10_000.0
BREAK_STRENGTH_MS = {"none": 0.0, "x-weak": 100.0, "weak": 250.0, "medium": 500.0,
                     "strong": 750.0, "x-strong": 1000.0}
RATE_WORDS = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "fast": 1.25, "x-fast": 1.5,
              "default": 1.0}
MIN_RATE, MAX_RATE = 0.25, 4.0
_ALLOWED = {"speak": {"version", XML_LANG}, "break": {"time", "strength"}, "sub": {"alias"},
            "phoneme": {"alphabet", "ph"}, "prosody": {"rate"}}


@dataclass(frozen=True, slots=True)
class Run:
    """Text spoken at one rate; ``phonemes`` index into ``text``."""

    text: str
    rate: float = 1.0
    phonemes: tuple[PhonemeSpan, ...] = ()


@dataclass(frozen=True, slots=True)
class Break:
    ms: float


Item = Run | Break


def _duration_ms(value: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*", value)
    if m is None:
        raise BadMessage(f"SSML <break time={value[:20]!r}>: write it as '500ms' or '1.5s'")
    ms = float(m.group(1)) * (1.0 if m.group(2) == "ms" else 1000.0)
    if ms > MAX_BREAK_MS:
        raise BadMessage(f"SSML <break>: at most {MAX_BREAK_MS:.0f} ms")
    return ms


def _rate(value: str) -> float:
    text = value.strip().lower()
    if text in RATE_WORDS:
        return RATE_WORDS[text]
    m = re.fullmatch(r"([+-]?)(\d+(?:\.\d+)?)(%?)", text)
    if m is None:
        raise BadMessage(f"SSML <prosody rate={value[:20]!r}>: a word (slow, fast, ...), "
                         "a percentage or a multiplier")
    number = float(m.group(2))
    if m.group(3):
        rate = 1.0 + (number if m.group(1) == "+" else -number) / 100.0 if m.group(1) \
            else number / 100.0
    elif m.group(1):
        raise BadMessage(f"SSML <prosody rate={value[:20]!r}>: a signed rate needs '%'")
    else:
        rate = number
    if not MIN_RATE <= rate <= MAX_RATE:
        raise BadMessage(f"SSML <prosody rate={value[:20]!r}>: {MIN_RATE}x to {MAX_RATE}x")
    return rate


class _Builder:
    def __init__(self) -> None:
        self.items: list[Item] = []
        self.text: list[str] = []
        self.length = 0
        self.spans: list[PhonemeSpan] = []
        self.rate = 1.0

    def add(self, text: str | None) -> None:
        if text:
            self.text.append(text)
            self.length += len(text)

    def close(self) -> None:
        text = "".join(self.text)
        if text.strip():
            self.items.append(Run(text, self.rate, tuple(self.spans)))
        self.text, self.length, self.spans = [], 0, []

    def pause(self, ms: float) -> None:
        self.close()
        if self.items and isinstance(self.items[-1], Break):
            self.items[-1] = Break(self.items[-1].ms + ms)
        else:
            self.items.append(Break(ms))


def parse_ssml(document: str, *, phonemes: bool, rate: bool, voice: str = "this voice"
               ) -> list[Item]:
    """The runs and breaks of ``document``, in order; raises as the module says.

    ``phonemes``/``rate``: whether the voice takes ``<phoneme>`` /
    ``<prosody rate>``.
    """
    refuse_dtd(document, "SSML")
    try:
        root = ElementTree.fromstring(document.strip())
    except ElementTree.ParseError as exc:
        raise BadMessage(f"SSML: not well-formed XML ({exc})") from None
    out = _Builder()

    def name_of(el: ElementTree.Element) -> str:
        tag = el.tag
        if tag.startswith(f"{{{SSML_NAMESPACE}}}"):
            tag = tag[len(SSML_NAMESPACE) + 2:]
        if tag not in _ALLOWED:
            raise UnsupportedSsml(f"SSML <{tag[:40]}> is not supported (the subset: speak, "
                                  "break, sub, phoneme, prosody rate)")
        extra = set(el.attrib) - _ALLOWED[tag]
        if extra:
            raise UnsupportedSsml(f"SSML <{tag}> attribute {sorted(extra)[0][:40]!r} is not "
                                  "supported")
        return tag

    def only_text(el: ElementTree.Element, tag: str) -> str:
        if len(el):
            raise UnsupportedSsml(f"SSML <{tag}> holds text only, no elements")
        text = " ".join((el.text or "").split())
        if not text:
            raise BadMessage(f"SSML <{tag}> is empty")
        return text

    def walk(el: ElementTree.Element, tag: str) -> None:
        out.add(el.text)
        for child in el:
            kind = name_of(child)
            if kind == "speak":
                raise UnsupportedSsml("SSML <speak> is the root only")
            if kind == "break":
                time_ = child.get("time")
                strength = child.get("strength")
                if time_ is not None:
                    ms = _duration_ms(time_)
                elif strength is not None:
                    if strength not in BREAK_STRENGTH_MS:
                        raise BadMessage(f"SSML <break strength={strength[:20]!r}>: one of "
                                         f"{', '.join(BREAK_STRENGTH_MS)}")
                    ms = BREAK_STRENGTH_MS[strength]
                else:
                    ms = BREAK_STRENGTH_MS["medium"]
                if len(child) or (child.text or "").strip():
                    raise UnsupportedSsml("SSML <break> is empty")
                out.pause(ms)
            elif kind == "sub":
                alias = " ".join(child.get("alias", "").split())
                if not alias:
                    raise BadMessage("SSML <sub> needs an 'alias'")
                if ALIAS_REFUSED.search(alias):
                    raise BadMessage("SSML <sub alias>: plain words; no '[', ']', '<', '>'")
                only_text(child, "sub")
                out.add(alias)
            elif kind == "phoneme":
                if not phonemes:
                    raise UnsupportedSsml(f"SSML <phoneme>: {voice} does not take phonemes")
                alphabet = child.get("alphabet", "ipa")
                if alphabet.lower() != "ipa":
                    raise UnsupportedSsml(f"SSML <phoneme alphabet={alphabet[:20]!r}>: only "
                                          "'ipa'")
                ph = " ".join(child.get("ph", "").split())
                if not ph:
                    raise BadMessage("SSML <phoneme> needs 'ph'")
                text = only_text(child, "phoneme")
                start = out.length
                out.add(text)
                out.spans.append(PhonemeSpan(start, start + len(text), ph))
            else:  # prosody
                value = child.get("rate")
                if value is None:
                    raise UnsupportedSsml("SSML <prosody> takes 'rate' only")
                if not rate:
                    raise UnsupportedSsml(f"SSML <prosody rate>: {voice} has no speed control")
                factor = _rate(value)
                out.close()
                outer = out.rate
                out.rate = outer * factor
                walk(child, kind)
                out.close()
                out.rate = outer
            out.add(child.tail)

    if name_of(root) != "speak":
        raise UnsupportedSsml("an SSML document's root is <speak>")
    walk(root, "speak")
    out.close()
    return out.items


def ssml_segments(items: Sequence[Item], config: SegmenterConfig, source: tuple[int, int]
                  ) -> list[Segment]:
    """Segments of the parsed document: each run cut by the segmenter as
    plain text would be (fed whole, then ended), numbered over the document;
    each segment carries its run's ``rate`` as ``speed``, its ``<phoneme>``
    spans (in the segment's text), and the breaks around it as pauses (a
    break before the first text pauses the first segment, after the last
    the last). ``source``: every segment's, the document's range (the
    segmenter's offsets are into the runs, not the received text). Raises
    ``BadMessage`` when normalization changed a ``<phoneme>``'s text (its
    span cannot be placed)."""
    segments: list[Segment] = []
    pause = 0.0
    for item in items:
        if isinstance(item, Break):
            pause += item.ms
            continue
        seg_start = len(segments)
        segmenter = Segmenter(config)
        cut = segmenter.feed(item.text, 0.0) + segmenter.end(0.0)
        for seg in cut:
            segments.append(replace(seg, index=len(segments), source=source, speed=item.rate,
                                    phonemes=_place(item, seg)))
        if len(segments) > seg_start and pause:
            first = segments[seg_start]
            segments[seg_start] = replace(first, pause_before_ms=first.pause_before_ms + pause)
            pause = 0.0
    if pause and segments:
        segments[-1] = replace(segments[-1], pause_after_ms=pause)
    return segments


def _place(run: Run, seg: Segment) -> tuple[PhonemeSpan, ...]:
    """``run``'s phoneme spans that fall in ``seg``, in the segment's text."""
    a, b = seg.source
    placed: list[PhonemeSpan] = []
    cursor = 0
    for span in run.phonemes:
        if span.end <= a or span.start >= b:
            continue
        word = run.text[span.start:span.end]
        at = seg.text.find(word, cursor)
        if not (a <= span.start and span.end <= b) or at < 0:
            raise BadMessage(f"SSML <phoneme> text {word[:40]!r} was changed or split by "
                             "normalization; write it as plain words")
        placed.append(PhonemeSpan(at, at + len(word), span.phoneme))
        cursor = at + len(word)
    return tuple(placed)


__all__ = ["MAX_BREAK_MS", "Break", "Item", "Run", "parse_ssml", "ssml_segments"]
