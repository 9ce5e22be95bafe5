"""Incremental segmenter: streamed LLM text -> speakable segments (pure, sans-I/O).

Text arrives in fragments of any size (single characters, LLM tokens). It is
normalized as it streams (:mod:`rtserver.text.normalize`) and cut into
segments:

- **First segment, eager** (it decides time to first audio): the first clause
  (``,`` ``;`` ``:`` a dash, an ellipsis, ``，、；：``) or sentence end, else
  ``first_max_words`` complete words, else, when the text stalls, the complete
  words received so far once ``first_wait_s`` passed since the last word
  boundary (the timer: :meth:`Segmenter.deadline` / :meth:`Segmenter.poll`).
- **Later segments**: whole sentences; one longer than ``max_chars`` is cut at
  its last clause break, else its last space (between CJK characters where
  there are no spaces), else hard at ``max_chars``.
- A line break (paragraph, list item, heading, ``<br>``) always ends a segment.

When a cut is decided (each decision needs at most the next character or word):

- Latin ``,;:.!?`` only break when white space follows (after any closing
  quotes or brackets), so ``1,000``, ``3.14``, ``$3.50``, ``5:30``,
  ``www.example.com/path?x=1.2`` and ``a.b@example.com`` never split, and
  ``Hello there,`` goes out as soon as the space after the comma arrives.
- A ``.`` after a title (``Dr.`` ``Mr.`` ``e.g.`` ``i.e.`` ``vs.`` an initial
  ``J.``) never ends a sentence. After an abbreviation that may end one
  (``etc.`` ``a.m.`` ``U.S.`` ``Inc.`` ``Jr.``), after an ellipsis, or after
  punctuation closed by a quote, the sentence ends only if the next word
  starts with a capital letter, an opening quote or CJK (or a line break, a
  flush, the end).
- CJK ``。！？`` end a sentence and ``，、；：`` break a clause without white
  space; the cut waits for the character after them (a closing bracket or
  quote stays with its sentence).

A segment is never cut before its first letter or digit (a lone ``...`` or
``—`` line joins the next text). Everything is fragmentation-independent:
with the timer never firing, any cutting of the same text yields the same
segments (text and source), and the segments' texts are ``normalize(text)``
cut at white space (dropped) or between characters without one.

Cost: each character is scanned once, plus once more when a cut leaves it in
the buffer (amortized linear); the buffer never holds more than the segment
being built (at most ``max_chars``) and the character that decides its cut,
and the normalizer holds back at most ``MAX_HOLD`` raw characters.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from rtserver.text.lexicon import PhonemeSpan
from rtserver.text.normalize import Normalizer, NormBuffer


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of text to speak, in order."""

    index: int  # 0, 1, 2, ... over emitted segments
    text: str  # normalized text, as spoken
    source: tuple[int, int]  # [start, end) into the raw received text
    # How it is to be spoken (a lexicon, SSML): IPA for spans of ``text``
    # (voices that take phonemes), a speed factor, silence before and after.
    phonemes: tuple[PhonemeSpan, ...] = ()
    speed: float = 1.0
    pause_before_ms: float = 0.0
    pause_after_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class SegmenterConfig:
    # The first segment goes out after this many complete words when no clause
    # or sentence punctuation came first; 0 turns the word limit off. Six
    # English words are about 2 s of speech (~3 words/s), enough to cover the
    # synthesis of the next sentence; at LLM speeds (>= 20 tokens/s) they
    # arrive within ~0.4 s.
    first_max_words: int = 6
    # When the text stalls, the first segment goes out this long after the
    # last word boundary, with the complete words received so far; 0 turns the
    # timer off. Measured from the *last* boundary, it never cuts text that is
    # still flowing word by word (the word limit covers a steady stream) and
    # fires only on a real pause (a slow or stalled LLM, a tool call, a person
    # typing). 250 ms is a few LLM decode steps and well under the pause a
    # listener notices.
    first_wait_s: float = 0.25
    # A first clause or sentence that ends the text so far (``Sure thing,``
    # with nothing after the comma yet) goes out this long after its
    # punctuation arrived, without waiting for the next token's space. Only
    # ``, ; ! ?`` and a sentence-ending ``.`` after a letter qualify (never a
    # ``:``, which may be ``https:``, nor one after a digit, which may be
    # ``1,000``); more text within the wait decides as usual. Text already
    # queued is read before a timer fires, so a burst is never cut early; the
    # wait only has to cover messages of one burst that arrive a moment apart
    # (one connection is one ordered TCP stream: back-to-back sends arrive
    # microseconds apart). 1 ms, one tick of the event loop's timer clock
    # (libuv counts milliseconds), covers that and costs every first clause
    # ending in punctuation 1 ms of TTFA (5 ms before: 4 ms of the H200's
    # 45 ms goal); a token at 40 tokens/s is 25 ms away. 0 turns it off.
    first_punct_wait_s: float = 0.001
    # Longest segment, in characters of normalized text. 250 is about 15 s of
    # speech: long enough for whole sentences, short enough that one segment
    # does not hold back a voice's next request.
    max_chars: int = 250
    # Segments after the first grow towards ``max_chars``: segment k (k >= 1)
    # holds at most ``second_max_chars * growth**(k-1)`` characters. A voice
    # that synthesizes a segment whole (Piper) must finish segment k+1 while
    # segment k plays; a long sentence right after a short first clause would
    # otherwise need a long prebuffer. Growing limits keep each synthesis
    # shorter than the audio ahead of it (with r < 1/growth the buffer never
    # runs dry; the chunk schedule of DESIGN.md, applied to segments). 80
    # characters (~5 s of speech) keeps most sentences whole (prosody) while
    # a Piper voice at rtf <= 0.1 makes it within a first clause's audio;
    # 0 turns the schedule off.
    second_max_chars: int = 80
    growth: float = 2.0
    # For the word limit, this many CJK characters (no spaces between words)
    # count as one word: a CJK character is about one syllable.
    cjk_chars_per_word: int = 2
    # More abbreviations after which a "." never ends a sentence, e.g. "Approx.".
    extra_abbreviations: tuple[str, ...] = ()
    # Start synthesizing the first segment as soon as white space would cut
    # it (``Segmenter.tentative``), before the next fragment confirms the cut;
    # its audio is held until then and dropped if the word goes on. Saves the
    # wait for the next token (~25 ms at 40 tokens/s) from time to first
    # audio; a wrong guess costs the voice's work until the cut.
    speculate_first: bool = True

    def __post_init__(self) -> None:
        if self.max_chars < 1:
            raise ValueError("max_chars must be >= 1")
        if self.second_max_chars < 0:
            raise ValueError("second_max_chars must be >= 0")
        if self.growth < 1:
            raise ValueError("growth must be >= 1")

        if self.first_max_words < 0:
            raise ValueError("first_max_words must be >= 0")
        if self.first_wait_s < 0:
            raise ValueError("first_wait_s must be >= 0")
        if self.first_punct_wait_s < 0:
            raise ValueError("first_punct_wait_s must be >= 0")
        if self.cjk_chars_per_word < 1:
            raise ValueError("cjk_chars_per_word must be >= 1")

    def limit(self, index: int) -> int:
        """Most characters segment ``index`` may hold."""
        if index == 0 or self.second_max_chars == 0:
            return self.max_chars
        grown = self.second_max_chars * self.growth ** min(index - 1, 64)
        return max(1, min(self.max_chars, int(grown)))


# --- character classes ------------------------------------------------------------

# Spaces before punctuation that ends a word ("launch !" after its emoji was
# dropped): not spoken, and some voices read a lone "!" oddly.
_SPACE_BEFORE_PUNCT = re.compile(r" +(?=[!?,;:.…]+[\"'”’)\]]*(?: |$))")


def tidy_spaces(text: str) -> str:
    """``text`` without spaces before word-ending punctuation ("launch !" -> "launch!")."""
    return _SPACE_BEFORE_PUNCT.sub("", text) if " " in text else text


_CLOSERS = frozenset("\"')]}»”’」』】）〕〉》〗〙〛")
_OPENERS = frozenset("\"'([{«“‘「『【（〔〈《")
_CJK_SENT = frozenset("。！？｡")
_CJK_CLAUSE = frozenset("，、；：､")
_DASHES = frozenset("—–")

# A "." after these (lower case, without the final dot) never ends a sentence:
# titles and words that always precede something (names, numbers, examples).
_NEVER_END = frozenset(
    "mr mrs ms mx dr prof rev fr gen col capt cpt lt sgt maj hon pres gov sen rep st mt ft "
    "vs v e.g i.e cf viz approx ca fig figs eq eqs vol vols ch pp p nos "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split())
# After these a "." may end a sentence or not: it does when a capital follows.
_MAYBE_END = frozenset(
    "etc al inc ltd co corp llc plc bros jr sr esq a.m p.m am pm min sec hr hrs oz lb lbs "
    "no dept univ est".split())
_DOTTED = re.compile(r"(?:[A-Za-z]{1,2}\.){2,}")  # U.S. U.K. Ph.D. a.m. U.S.A.

# Word kinds at a word boundary.
_NONE, _CLAUSE, _SENT, _MAYBE, _ELLIPSIS, _NOBREAK = range(6)


def _is_cjk(ch: str) -> bool:
    """Kana or a CJK ideograph: text written without spaces, cut anywhere."""
    cp = ord(ch)
    return (0x3040 <= cp <= 0x30FF or 0x3400 <= cp <= 0x4DBF or 0x4E00 <= cp <= 0x9FFF
            or 0xF900 <= cp <= 0xFAFF or 0xFF66 <= cp <= 0xFF9F or 0x20000 <= cp <= 0x3134F)


def _confirms(ch: str) -> bool:
    """Whether a word starting with ``ch`` starts a new sentence after a maybe-end."""
    return ch.isupper() or ch in _OPENERS or _is_cjk(ch)


class Segmenter:
    """Incremental text -> :class:`Segment` (see the module docstring).

    Every method returns the segments it completed, in order. ``now`` is the
    caller's clock (seconds, monotonic); it only drives the first-segment timer.
    """

    __slots__ = (
        "_buf",
        "_cfg",
        "_cjk",
        "_cjk_kind",
        "_ended",
        "_first_alnum",
        "_index",
        "_last_clause",
        "_last_space",
        "_limit",
        "_maybe",
        "_never",
        "_norm",
        "_pos",
        "_punct_at",
        "_punct_cut",
        "_timer_at",
        "_timer_cut",
        "_units",
        "_word_alnum",
        "_word_start",
    )

    def __init__(self, config: SegmenterConfig = SegmenterConfig()) -> None:
        self._cfg = config
        self._buf = NormBuffer()
        self._norm = Normalizer(self._buf)
        self._never = _NEVER_END | {a.lower().rstrip(".") for a in config.extra_abbreviations}
        self._index = 0
        self._limit = config.limit(0)
        self._ended = False
        self._reset()

    def _reset(self) -> None:
        """Scan state for a buffer that starts a new segment. Cuts: 0 = none."""
        self._pos = 0  # next buffer index to scan
        self._word_start = -1  # buffer index where the current word began
        self._word_alnum = False  # the current word has a (non-CJK) letter or digit
        self._first_alnum = -1  # first letter/digit: no cut before it
        self._units = 0  # words so far, in 1/cjk_chars_per_word units
        self._last_space = 0  # last word boundary usable as a cut
        self._last_clause = 0  # last cut after clause punctuation
        self._maybe = 0  # cut after a maybe-end, waiting for the next word
        self._cjk = 0  # cut after CJK punctuation, waiting for the next character
        self._cjk_kind = _NONE
        self._timer_cut = 0
        self._timer_at: float | None = None
        self._punct_cut = 0  # first segment: punctuation ends the buffer (eager cut)
        self._punct_at: float | None = None

    # --- public API ---------------------------------------------------------------

    @property
    def pending_chars(self) -> int:
        """Characters buffered, not yet segmented (normalized, plus raw ones undecided)."""
        return len(self._buf.chars) + self._norm.pending

    def feed(self, fragment: str, now: float) -> list[Segment]:
        """Append ``fragment``; returns the segments it completed."""
        if self._ended:
            raise ValueError("feed after end")
        out = self.poll(now)
        self._norm.feed(fragment)
        self._scan(now, out)
        return out

    def flush(self, now: float) -> list[Segment]:
        """Speak all buffered text now, punctuation or not."""
        out: list[Segment] = []
        if self._ended:
            return out
        self._norm.finish()
        self._scan(now, out)
        self._emit(len(self._buf.chars), out)
        return out

    def end(self, now: float) -> list[Segment]:
        """No more text: returns the rest. Later ``feed`` raises ``ValueError``."""
        out = self.flush(now)
        self._ended = True
        return out

    def deadline(self) -> float | None:
        """When :meth:`poll` must be called (the first-segment timers), or None."""
        if self._ended or self._index:
            return None
        if self._punct_at is not None and (self._timer_at is None
                                           or self._punct_at < self._timer_at):
            return self._punct_at
        return self._timer_at

    def poll(self, now: float) -> list[Segment]:
        """Fire a first-segment timer if it is due."""
        out: list[Segment] = []
        if self._ended or self._index:
            return out
        if self._punct_at is not None and now >= self._punct_at:
            if self._punct_cut < 0:  # a lone "!" held by the normalizer: text now
                self._punct_at = None
                self._norm.settle_bang()
                self._scan(now, out)  # re-arms the eager cut if the "!" ends a clause
                if self._punct_cut <= 0:
                    return out
            self._emit(self._punct_cut, out)
            self._scan(now, out)
        elif self._timer_at is not None and now >= self._timer_at:
            self._emit(self._timer_cut, out)
            self._scan(now, out)
        return out

    def release_words(self, now: float) -> list[Segment]:
        """Speak the complete words buffered so far, now (the listener is about
        to run dry and the sentence is still arriving). Nothing if no word
        boundary is buffered; a word still arriving stays."""
        out: list[Segment] = []
        if self._ended or not self._last_space or not self._valid(self._last_space):
            return out
        self._emit(self._last_space, out)
        self._scan(now, out)
        return out

    def tentative(self) -> Segment | None:
        """The first segment that white space arriving now would cut, without
        cutting anything: the word in progress completes the first segment (its
        word limit, clause or sentence punctuation), or a CJK character would
        (its limit). None after the first segment, when white space would cut
        nothing, after a digit (numbers arrive in pieces), inside markup that
        swallows white space (a link's ``](url)``), or while the normalizer or a
        CJK or abbreviation cut holds text back. A caller may
        start speaking it early (a speculative start) and must compare it with
        the segment actually cut: more of the word makes another segment."""
        norm = self._norm
        if self._ended or self._index or norm.pending or norm.holds_bang or norm.in_markup:
            return None
        chars = self._buf.chars
        n = len(chars)
        if not n or self._cjk or self._maybe or not self._valid(n):
            return None
        cfg = self._cfg
        limit = cfg.first_max_words * cfg.cjk_chars_per_word
        if _is_cjk(chars[-1]):
            return self._segment_of(n) if limit and self._units >= limit else None
        if self._word_start < 0 or chars[-1].isdigit():  # a number often goes on: "3,000"
            return None
        kind = self._classify(self._word_start, n)
        if kind in (_SENT, _CLAUSE, _ELLIPSIS):
            return self._segment_of(n)
        if kind != _NONE:
            return None
        units = self._units + (cfg.cjk_chars_per_word if self._word_alnum else 0)
        return self._segment_of(n) if limit and units >= limit else None

    # --- scanning -----------------------------------------------------------------

    def _valid(self, cut: int) -> bool:
        return 0 <= self._first_alnum < cut

    def _scan(self, now: float, out: list[Segment]) -> None:
        buf = self._buf
        chars = buf.chars
        cfg = self._cfg
        limit = cfg.first_max_words * cfg.cjk_chars_per_word
        wait = cfg.first_wait_s
        i = self._pos
        while i < len(chars):
            ch = chars[i]
            if ch == " " or ch == "\n":
                if i == 0:  # white space never starts a segment
                    del chars[0], buf.starts[0], buf.ends[0]
                    continue
                if self._word_start >= 0:
                    cut = self._word_end(i, now, limit, wait)
                    if cut:
                        self._emit(cut, out)
                        i = 0
                        continue
                if ch == "\n":
                    if self._first_alnum >= 0:
                        self._emit(i, out)
                        i = 0
                        continue
                    if chars[i - 1] == " ":  # nothing to speak yet: the break is a space
                        del chars[i], buf.starts[i], buf.ends[i]
                        continue
                    chars[i] = " "
                i += 1
                continue
            # a visible character: first settle the cuts that waited for it
            if self._maybe:
                cut = self._maybe
                self._maybe = 0
                if _confirms(ch):
                    self._emit(cut, out)
                    i = 0
                    continue
            more = False  # ch continues the punctuation a CJK cut waits behind
            if self._cjk:
                if ch in _CLOSERS or ch in _CJK_SENT or ch in _CJK_CLAUSE or ch in "!?.…":
                    self._cjk = i + 1
                    if ch in _CJK_SENT or ch in "!?":
                        self._cjk_kind = _SENT
                    more = True
                else:
                    cut = self._cjk
                    self._cjk = 0
                    if self._valid(cut):
                        if self._cjk_kind == _SENT or self._index == 0:
                            self._emit(cut, out)
                            i = 0
                            continue
                        self._last_clause = self._last_space = cut
            if self._word_start < 0:
                self._word_start = i
                self._word_alnum = False
            if _is_cjk(ch):
                if i and _is_cjk(chars[i - 1]) and self._valid(i):
                    self._last_space = i
                    if self._index == 0:
                        if limit and self._units >= limit:
                            self._emit(i, out)
                            i = 0
                            continue
                        if wait > 0:
                            self._timer_cut = i
                            self._timer_at = now + wait
                self._units += 1
                if self._first_alnum < 0:
                    self._first_alnum = i
            elif ch.isalnum():
                self._word_alnum = True
                if self._first_alnum < 0:
                    self._first_alnum = i
            elif more:
                pass
            elif ch in _CJK_SENT:
                self._cjk = i + 1
                self._cjk_kind = _SENT
            elif ch in _CJK_CLAUSE:
                self._cjk = i + 1
                self._cjk_kind = _CLAUSE
            if i >= self._limit:  # this character would make the segment too long
                self._emit(self._split_point(), out)
                i = 0
                continue
            i += 1
        self._pos = i
        self._eager_punct(now)

    def _eager_punct(self, now: float) -> None:
        """Arm the eager cut when the first segment's text ends in punctuation."""
        self._punct_cut = 0
        self._punct_at = None
        wait = self._cfg.first_punct_wait_s
        chars = self._buf.chars
        n = len(chars)
        if self._index or wait <= 0 or n < 2:
            return
        if self._norm.holds_bang:
            # "question!" with the "!" held (it could open "![image]"): decide it
            # at the eager deadline rather than on the next fragment
            if self._valid(n) and (chars[-1].isalpha() or (chars[-1] == " "
                                                           and chars[-2].isalpha())):
                self._punct_cut = -1
                self._punct_at = now + wait
            return
        if self._norm.pending or self._word_start < 0:
            return
        j = n
        while j > self._word_start and chars[j - 1] in _CLOSERS:
            j -= 1
        p = j - 1  # the punctuation
        if p < self._word_start or chars[p] not in ",;!?.":
            return
        if p == self._word_start:
            # punctuation alone after a space: "launch !" once "launch 🎉!" lost its emoji
            if chars[p] == "." or p < 2 or chars[p - 1] != " " or not chars[p - 2].isalpha():
                return
        elif not chars[p - 1].isalpha():
            return
        elif chars[p] == "." and (p - self._word_start < 2 or not chars[p - 2].isalpha()):
            return  # "e." may be "e.g.", "x." an initial: wait for what follows
        if self._classify(self._word_start, n) not in (_SENT, _CLAUSE) or not self._valid(n):
            return
        self._punct_cut = n
        self._punct_at = now + wait

    def _word_end(
            self, i: int, now: float, limit: int, wait: float) -> int:
        """White space at ``i`` ended a word: record cut candidates; returns a cut or 0."""
        kind = self._classify(self._word_start, i)
        if self._word_alnum:
            self._units += self._cfg.cjk_chars_per_word
        self._word_start = -1
        self._cjk = 0  # the white space settles CJK punctuation too (via _classify)
        if not self._valid(i):
            return 0
        if kind == _NOBREAK:
            return 0
        self._last_space = i
        if kind == _SENT:
            return i
        first = self._index == 0
        if kind == _CLAUSE:
            self._last_clause = i
            if first:
                return i
        elif kind == _ELLIPSIS:
            if first:
                return i
            self._maybe = i
        elif kind == _MAYBE:
            self._maybe = i
        if first:
            if limit and self._units >= limit:
                return i
            if wait > 0:
                self._timer_cut = i
                self._timer_at = now + wait
        return 0

    def _classify(self, start: int, end: int) -> int:
        """What the word ``chars[start:end]`` ends with."""
        chars = self._buf.chars
        j = end
        while j > start and chars[j - 1] in _CLOSERS:
            j -= 1
        if j == start:
            return _NONE
        closed = j < end
        p = chars[j - 1]
        if p == "." or p == "…":
            if p == "…" or (j - 2 >= start and chars[j - 2] == "."):
                return _ELLIPSIS
            if j - start > 12:  # a long word ending in ".": "example.com." ends a sentence
                return _MAYBE if closed else _SENT
            word = "".join(chars[start:j - 1]).lstrip("\"'([{«“‘")
            low = word.lower()
            if low in self._never or (len(word) == 1 and word.isupper()):
                return _NOBREAK
            if low in _MAYBE_END or _DOTTED.fullmatch(word + "."):
                return _MAYBE
            return _MAYBE if closed else _SENT
        if p == "!" or p == "?":
            return _MAYBE if closed else _SENT
        if p in _CJK_SENT:
            return _SENT
        if p in ",;:" or p in _CJK_CLAUSE:
            return _CLAUSE
        if p in _DASHES or (p == "-" and j - start == 1):
            return _CLAUSE
        return _NONE

    def _split_point(self) -> int:
        """Where to cut a segment that would exceed its limit (always 1..limit)."""
        max_chars = self._cfg.limit(self._index)
        clause, space = self._last_clause, self._last_space
        # The last clause break, unless it lies in the first third and a later
        # space gives a fuller segment.
        if clause and (3 * clause >= max_chars or space <= clause):
            return clause
        if space:
            return space
        cut = max_chars
        chars = self._buf.chars
        while cut > 1 and unicodedata.combining(chars[cut]):
            cut -= 1  # keep a combining mark with its base character
        return cut

    def _segment_of(self, cut: int) -> Segment | None:
        """The segment ``chars[:cut]`` makes, or None if nothing in it is visible."""
        buf = self._buf
        chars = buf.chars
        a = 0
        while a < cut and chars[a] in " \n":
            a += 1
        b = cut - 1
        while b >= a and chars[b] in " \n":
            b -= 1
        if b < a:
            return None
        text = "".join(chars[a:b + 1])
        if "\n" in text:
            text = " ".join(text.split())
        return Segment(self._index, tidy_spaces(text), (buf.starts[a], buf.ends[b]))

    def _emit(self, cut: int, out: list[Segment]) -> None:
        """Emit ``chars[:cut]`` (if it holds anything visible) and drop it from the buffer."""
        buf = self._buf
        chars = buf.chars
        seg = self._segment_of(cut)
        if seg is not None:
            out.append(seg)
            self._index += 1
            self._limit = self._cfg.limit(self._index)
        while cut < len(chars) and chars[cut] in " \n":
            cut += 1
        del chars[:cut], buf.starts[:cut], buf.ends[:cut]
        self._reset()
