"""Pronunciation lexicons (pure): entries named as in W3C PLS 1.0, compiled
into one matcher that rewrites a segment's text.

An entry is a ``grapheme`` (the written form: a word or several) with an
``alias`` (a respelling every voice can speak: ``"SQL"`` -> ``"sequel"``)
and/or a ``phoneme`` (IPA, for voices that take phonemes: Piper's espeak
IPA). Rules (docs/PROTOCOL-EXTENSIONS.md, "Pronunciation"):

- **Whole words only.** A grapheme matches where neither the character
  before nor the one after it is a letter, digit or ``_`` (``\\w``):
  ``rtserver`` matches in ``rtserver's``, ``(rtserver)`` and ``rtserver.``,
  never in ``rtservers`` or ``myrtserver``. Punctuation inside a grapheme
  is matched literally (``C++``, ``AT&T``, ``Dr.``); white space inside it
  matches any run of white space (``New York`` matches ``New\\nYork``).
- **Case-insensitive** unless the entry says ``case_sensitive: true``
  (``US`` the country, not ``us``). PLS graphemes have no case rule of
  their own; the field is rtserver's.
- **Longest match first:** where two graphemes match at the same place the
  longer wins (``New York City`` before ``New York``); otherwise the
  leftmost match wins and matches never overlap. Text an alias produced is
  not matched again (no loops).
- **The first entry for a grapheme wins** (PLS: the first pronunciation is
  the preferred one); a context's entries come before its voice's, so a
  context overrides its voice's lexicon.
- An entry with both a phoneme and an alias gives its phoneme to a voice
  that takes phonemes and its alias to the others; a phoneme-only entry on a
  voice without phonemes is refused (``bad_message``) when the context opens.

Bounds (``lexicon_too_large``): ``MAX_ENTRIES`` entries in a context's
lexicon (``MAX_FILE_ENTRIES`` in a voice's PLS file),
``MAX_GRAPHEME_CHARS`` per grapheme, ``MAX_VALUE_CHARS`` per alias or
phoneme. PLS files are parsed with the standard library's ``xml.etree``
after refusing any ``<!DOCTYPE``/``<!ENTITY`` (no entity expansion, no
external references): a PLS document needs neither.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from xml.etree import ElementTree

from rtserver.errors import BadMessage, LexiconTooLarge

MAX_ENTRIES = 1000  # a context's lexicon (``start.lexicon``)
MAX_FILE_ENTRIES = 100_000  # a voice's, from PLS files (config)
MAX_GRAPHEME_CHARS = 100
MAX_VALUE_CHARS = 200
MAX_PLS_BYTES = 4 * 1024 * 1024
PLS_NAMESPACE = "http://www.w3.org/2005/01/pronunciation-lexicon"
# what a PLS file may name in ``alphabet``: IPA only (what espeak and Piper read)
IPA_ALPHABETS = ("ipa",)
# An alias is spoken as text after normalization, so brackets would reach a
# voice as its own syntax (piper's ``[[ ]]`` phonemes, ChatTTS's ``[laugh]``).
ALIAS_REFUSED = re.compile(r"[\[\]<>]")


@dataclass(frozen=True, slots=True)
class Entry:
    """One lexicon entry (a PLS ``<lexeme>`` with one grapheme)."""

    grapheme: str
    phoneme: str | None = None
    alias: str | None = None
    case_sensitive: bool = False


@dataclass(frozen=True, slots=True)
class PhonemeSpan:
    """``text[start:end]`` is to be spoken as ``phoneme`` (IPA)."""

    start: int
    end: int
    phoneme: str


@dataclass(frozen=True, slots=True)
class Pronounced:
    """A text with its aliases applied and the spans its phonemes cover."""

    text: str
    phonemes: tuple[PhonemeSpan, ...] = ()


def check_entry(entry: Entry, index: int = 0) -> Entry:
    """``entry`` with its strings NFC-normalized and trimmed, or ``BadMessage``
    / ``LexiconTooLarge`` naming what is wrong."""
    where = f"lexicon entry {index}"
    grapheme = " ".join(unicodedata.normalize("NFC", entry.grapheme).split())
    if not re.search(r"\w", grapheme):
        raise BadMessage(f"{where}: 'grapheme' must hold a letter or digit")
    if len(grapheme) > MAX_GRAPHEME_CHARS:
        raise LexiconTooLarge(f"{where}: 'grapheme' is longer than {MAX_GRAPHEME_CHARS} "
                              "characters")
    values: dict[str, str | None] = {}
    for name in ("phoneme", "alias"):
        value = getattr(entry, name)
        if value is None:
            values[name] = None
            continue
        value = " ".join(unicodedata.normalize("NFC", value).split())
        if not value:
            raise BadMessage(f"{where}: '{name}' is empty")
        if len(value) > MAX_VALUE_CHARS:
            raise LexiconTooLarge(f"{where}: '{name}' is longer than {MAX_VALUE_CHARS} "
                                  "characters")
        if name == "alias" and ALIAS_REFUSED.search(value):
            raise BadMessage(f"{where}: an alias is plain words; '[', ']', '<' and '>' "
                             "(control tokens, phoneme blocks, markup) are not accepted")
        values[name] = value
    if values["phoneme"] is None and values["alias"] is None:
        raise BadMessage(f"{where}: needs a 'phoneme' or an 'alias'")
    return Entry(grapheme, values["phoneme"], values["alias"], entry.case_sensitive)


class Lexicon:
    """Compiled entries: ``apply(text)`` rewrites a text by them.

    ``phonemes``: the voice takes phonemes (an entry with one gives it);
    otherwise entries give their aliases, and one with a phoneme only is
    refused here (``BadMessage`` naming it).
    """

    def __init__(self, entries: Iterable[Entry], *, phonemes: bool,
                 max_entries: int = MAX_ENTRIES) -> None:
        chosen: dict[tuple[str, bool], tuple[str | None, str | None]] = {}
        count = 0
        for i, raw in enumerate(entries):
            count += 1
            if count > max_entries:
                raise LexiconTooLarge(f"a lexicon holds at most {max_entries} entries")
            entry = check_entry(raw, i)
            if not phonemes and entry.alias is None:
                raise BadMessage(f"lexicon entry {i} ({entry.grapheme!r}) has only a phoneme; "
                                 "this voice takes aliases, not phonemes")
            key = (entry.grapheme if entry.case_sensitive else entry.grapheme.casefold(),
                   entry.case_sensitive)
            if key in chosen:
                continue  # the first entry for a grapheme wins
            use_phoneme = phonemes and entry.phoneme is not None
            chosen[key] = (entry.phoneme if use_phoneme else None,
                           None if use_phoneme else entry.alias)
        self.size = len(chosen)
        # By first token; longest grapheme first (then case-sensitive first).
        # Matching compares tokens, not one regex of every grapheme: a
        # regex alternation of 1,000 graphemes cost 26 ms to compile and
        # 2.7 ms per 80-character segment, on the event loop.
        self._by_first: dict[str, list[_Candidate]] = {}
        self._layers = [self._by_first]
        for (grapheme, case_sensitive), (phoneme, alias) in chosen.items():
            tokens = [m.group() for m in _TOKEN.finditer(grapheme)]
            first = tokens[0].casefold()
            self._by_first.setdefault(first, []).append(_Candidate(
                len(grapheme), case_sensitive,
                tokens if case_sensitive else [t.casefold() for t in tokens], phoneme, alias))
        for candidates in self._by_first.values():
            candidates.sort(key=lambda c: (-c.chars, not c.case_sensitive))

    def __len__(self) -> int:
        return self.size

    def over(self, base: Lexicon) -> Lexicon:
        """This lexicon's entries before ``base``'s (a context's over its
        voice's), without compiling ``base`` again: where both have a
        grapheme, this one's wins."""
        merged = Lexicon((), phonemes=True)
        merged.size = self.size + base.size
        merged._layers = self._layers + base._layers
        return merged

    def _candidates(self, first: str) -> list[_Candidate]:
        if len(self._layers) == 1:
            return self._by_first.get(first, [])
        found = [c for layer in self._layers for c in layer.get(first, ())]
        found.sort(key=lambda c: (-c.chars, not c.case_sensitive))  # stable: layers in order
        return found

    def apply(self, text: str, fixed: Sequence[PhonemeSpan] = ()) -> Pronounced:
        """``text`` with aliases applied and phoneme spans found; ``fixed``
        spans (from SSML ``<phoneme>``) are kept, moved with the text, and
        never matched inside."""
        if not any(self._layers):
            return Pronounced(text, tuple(fixed))
        found = list(_TOKEN.finditer(text))
        raw = [" " if m.lastgroup == "s" else m.group() for m in found]
        folded = [t.casefold() for t in raw]
        word = [m.lastgroup == "w" for m in found]
        n = len(found)
        out: list[str] = []
        spans: list[PhonemeSpan] = []
        shifts: list[tuple[int, int]] = []  # (position in text, length change after it)
        pos = 0
        delta = 0
        i = 0
        while i < n:
            hit = None
            for c in self._candidates(folded[i]):
                k = len(c.tokens)
                if (i + k > n or (raw if c.case_sensitive else folded)[i:i + k] != c.tokens
                        or (not word[i] and i > 0 and word[i - 1])  # whole words only
                        or (not word[i + k - 1] and i + k < n and word[i + k])):
                    continue
                start, end = found[i].start(), found[i + k - 1].end()
                if any(f.start < end and start < f.end for f in fixed):
                    continue
                hit = c
                break
            if hit is None:
                i += 1
                continue
            i += len(hit.tokens)
            out.append(text[pos:start])
            at = start + delta
            if hit.alias is not None:
                out.append(hit.alias)
                delta += len(hit.alias) - (end - start)
                shifts.append((end, delta))
            else:
                assert hit.phoneme is not None
                out.append(text[start:end])
                spans.append(PhonemeSpan(at, at + end - start, hit.phoneme))
            pos = end
        out.append(text[pos:])
        for f in fixed:
            moved = next((d for p, d in reversed(shifts) if p <= f.start), 0)
            spans.append(PhonemeSpan(f.start + moved, f.end + moved, f.phoneme))
        spans.sort(key=lambda s: s.start)
        return Pronounced("".join(out), tuple(spans))


# A text's tokens: runs of word characters, runs of white space, and single
# other characters (punctuation). A grapheme is matched token by token.
_TOKEN = re.compile(r"(?P<w>\w+)|(?P<s>\s+)|(?P<p>[^\w\s])")


@dataclass(frozen=True, slots=True)
class _Candidate:
    chars: int
    case_sensitive: bool
    tokens: list[str]  # casefolded unless case-sensitive; white space as " "
    phoneme: str | None
    alias: str | None


# --- W3C PLS ----------------------------------------------------------------------

def refuse_dtd(document: str, what: str) -> None:
    """XML documents here need no DTD: refuse one before parsing, so no entity is
    ever expanded (the "billion laughs") and nothing external is fetched."""
    if re.search(r"<!\s*(DOCTYPE|ENTITY)", document, re.IGNORECASE):
        raise BadMessage(f"{what}: a DOCTYPE or ENTITY declaration is not accepted")


def parse_pls(document: str) -> list[Entry]:
    """The entries of a W3C PLS 1.0 document (https://www.w3.org/TR/pronunciation-lexicon/).

    Each ``<lexeme>`` gives one entry per ``<grapheme>``, with its first
    ``<phoneme>`` and first ``<alias>``. The lexicon's ``alphabet`` (or a
    phoneme's own) must be IPA (``ipa``). A lexeme may carry
    ``case_sensitive="true"`` (rtserver's attribute; PLS has no case rule).
    Raises ``BadMessage`` for a document that is not PLS, ``LexiconTooLarge``
    past the bounds.
    """
    if len(document) > MAX_PLS_BYTES:
        raise LexiconTooLarge(f"a PLS document is at most {MAX_PLS_BYTES} characters")
    refuse_dtd(document, "PLS")
    try:
        root = ElementTree.fromstring(document)
    except ElementTree.ParseError as exc:
        raise BadMessage(f"PLS: not well-formed XML ({exc})") from None
    ns = f"{{{PLS_NAMESPACE}}}"
    if root.tag not in ("lexicon", f"{ns}lexicon"):
        raise BadMessage(f"PLS: the root element is {root.tag!r}, not 'lexicon'")

    def children(el: ElementTree.Element, name: str) -> list[ElementTree.Element]:
        return [c for c in el if c.tag in (name, f"{ns}{name}")]

    alphabet = root.get("alphabet", "ipa")
    entries: list[Entry] = []
    for lexeme in children(root, "lexeme"):
        phonemes = children(lexeme, "phoneme")
        phoneme = None
        if phonemes:
            kind = phonemes[0].get("alphabet", alphabet)
            if kind.lower() not in IPA_ALPHABETS:
                raise BadMessage(f"PLS: alphabet {kind!r} is not supported (only 'ipa')")
            phoneme = (phonemes[0].text or "").strip() or None
        aliases = children(lexeme, "alias")
        alias = (aliases[0].text or "").strip() or None if aliases else None
        case = lexeme.get("case_sensitive", "false").lower() in ("true", "1")
        for grapheme in children(lexeme, "grapheme"):
            entries.append(Entry((grapheme.text or "").strip(), phoneme, alias, case))
            if len(entries) > MAX_FILE_ENTRIES:
                raise LexiconTooLarge(f"a PLS file holds at most {MAX_FILE_ENTRIES} entries")
    return entries


__all__ = [
    "ALIAS_REFUSED",
    "MAX_ENTRIES",
    "MAX_FILE_ENTRIES",
    "MAX_GRAPHEME_CHARS",
    "MAX_VALUE_CHARS",
    "Entry",
    "Lexicon",
    "PhonemeSpan",
    "Pronounced",
    "check_entry",
    "parse_pls",
    "refuse_dtd",
]
