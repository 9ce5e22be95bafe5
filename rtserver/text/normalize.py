"""Incremental normalization of LLM text for speech (pure, sans-I/O).

Removes what a chat model emits that must not be read aloud: markdown
(emphasis ``* ** _ __ ~~``, headings, bullets and ``1.`` list markers, block
quotes, rules, fenced code blocks, inline-code backticks, ``[text](url)``
links, ``![alt](url)`` images), HTML tags and comments, emoji, control and
format characters. Keeps everything else verbatim.

Output is a stream of characters, each with the ``[start, end)`` span of raw
characters that produced it, appended to a :class:`NormBuffer`. White space is
collapsed as it streams: at most one ``" "`` between visible characters, or a
``"\\n"`` where the raw text had a line break (or a block tag such as
``<br>``); the segmenter treats ``"\\n"`` as a hard boundary.

Incremental contract: :meth:`Normalizer.feed` takes fragments of any size and
emits every character it can already decide; an undecidable tail (a ``_`` run
before the next character, ``<b`` before its ``>``, ``1`` at a line start
before the ``.``, a backtick run before its end, ...) is held back, at most
:data:`MAX_HOLD` raw characters. Decisions depend only on the text, never on
how it was cut, so any fragmentation yields the same output; :meth:`finish`
resolves the held tail as if the text ended there.

Source attribution: dropped markup is given to a neighbouring character, so a
segment's span covers the raw characters that produced it: material glued to
the previous visible character (no white space between: a closing ``**``, a
link's ``](url)``) extends that character's span; otherwise (an opening
``**``, ``## ``, ``- ``) it widens the next visible character's span. Code
blocks and lines of pure markup belong to nobody.
"""

from __future__ import annotations

import re
from html.entities import html5

# Longest raw tail held back for one decision: an HTML tag or an autolink must
# close within this many characters (real tags are far shorter).
MAX_HOLD = 256

# A horizontal rule line ("---", "- - -") is decided within this many characters.
_RULE_SCAN = 64

_NEWLINES = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
_ASCII_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_BULLETS = frozenset("-+*•◦‣")

# Characters dropped wherever they occur. Emoji: the blocks that hold
# Extended_Pictographic code points (Unicode 15.1 emoji-data.txt), reduced to
# whole blocks where the block is pictographic and to single code points in
# blocks shared with text symbols; plus the emoji modifiers (variation
# selectors, ZWJ, keycap, tag characters; skin tones and regional indicators
# lie inside U+1F000-U+1FAFF). Then control/format characters that speak as
# nothing (soft hyphen, zero-width space/joiners, bidi marks, BOM).
_DROP_CLASS = (
    "\U0001F000-\U0001FAFF"  # mahjong .. symbols & pictographs ext-A (incl. flags, skin tones)
    "\u2600-\u27bf"  # misc symbols, dingbats
    "\u231a\u231b\u2328\u23cf\u23e9-\u23f3\u23f8-\u23fa"  # watch, hourglass, keyboard, media
    "\u25aa\u25ab\u25b6\u25c0\u25fb-\u25fe"  # geometric shapes with emoji presentation
    "\u2934\u2935\u2b05-\u2b07\u2b1b\u2b1c\u2b50\u2b55"  # arrows, squares, star, circle
    "\u3030\u303d\u3297\u3299"  # wavy dash, part alternation mark, circled ideographs
    "\ufe0e\ufe0f\u200d\u20e3\U000E0020-\U000E007F"  # VS15/16, ZWJ, keycap, tags
    "\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f"  # C0/C1 controls that are not white space
    "\u00ad\u061c\u180e\u200b\u200c\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f"
    "\ufeff\ufff9-\ufffb"
)
_DROP_RE = re.compile(f"[{_DROP_CLASS}]")
# A run of characters with nothing to decide (the fast path).
_PLAIN_RE = re.compile(f"[^\\s*_~`!\\[\\]<&\\\\{_DROP_CLASS}]+")
_CODE_PLAIN_RE = re.compile(f"[^\\s`{_DROP_CLASS}]+")
_ENTITY_RE = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
_ENTITY_PREFIX_RE = re.compile(
    r"&(?:#[0-9]{0,7}|#[xX][0-9A-Fa-f]{0,6}|[A-Za-z][A-Za-z0-9]{0,31})?\Z")
_NEWLINE_RE = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")

# Both are bounded so that a match, if there is one, lies within MAX_HOLD.
_TAG_RE = re.compile(
    rf"</?([A-Za-z][A-Za-z0-9]{{0,15}})(?:[ \t/][^<>\r\n]{{0,{MAX_HOLD - 24}}})?>")
_AUTOLINK_RE = re.compile(
    rf"<((?:[A-Za-z][A-Za-z0-9+.-]{{1,31}}:|www\.)[^\s<>]{{0,{MAX_HOLD - 40}}}"
    rf"|[^\s<>@]{{1,64}}@[^\s<>@]{{1,{MAX_HOLD - 72}}})>")
# What may still grow into a tag or an autolink once more text arrives: a run
# without white space (a tag name, a URL, an address), or a known tag's
# attributes before their ">".
_LINK_PREFIX_RE = re.compile(r"<[^\s<>]*\Z")
_ATTR_PREFIX_RE = re.compile(r"</?([A-Za-z][A-Za-z0-9]{0,15})[ \t/][^<>\r\n]*\Z")
_BLOCK_TAGS = frozenset(
    "br p div li ul ol dl dt dd h1 h2 h3 h4 h5 h6 tr table thead tbody tfoot blockquote hr pre "
    "section article header footer nav aside figure figcaption details summary".split())
_INLINE_TAGS = frozenset(
    "a b i u s em strong code span sup sub small big mark del ins kbd abbr q cite font img "
    "samp var tt strike center td th caption label time dfn bdi bdo wbr".split())

_TAGS = _BLOCK_TAGS | _INLINE_TAGS

# Emission kinds.
_NONE, _VIS, _SP, _NL = range(4)
# Modes.
_NORMAL, _CODE, _DEST, _FENCE_INFO, _FENCE, _COMMENT = range(6)


class NormBuffer:
    """Normalized characters with the raw span of each (parallel lists).

    A consumer (the segmenter) may delete a prefix once it has used it and may
    turn a ``"\\n"`` into ``" "``; the normalizer only appends and widens the
    last span.
    """

    __slots__ = ("chars", "ends", "starts")

    def __init__(self) -> None:
        self.chars: list[str] = []
        self.starts: list[int] = []
        self.ends: list[int] = []

    def text(self) -> str:
        return "".join(self.chars)


class Normalizer:
    """Streams raw text into a :class:`NormBuffer` (see the module docstring)."""

    __slots__ = (
        "_adjacent", "_after_bullet", "_depth", "_fence_bol", "_fence_char", "_fence_len",
        "_gap", "_last", "_line_start", "_mode", "_off", "_prev", "_raw", "_run_len", "out",
    )

    def __init__(self, out: NormBuffer | None = None) -> None:
        self.out = out if out is not None else NormBuffer()
        self._raw = ""  # undecided raw tail
        self._off = 0  # absolute offset of _raw[0] in the text as received
        self._prev = ""  # the raw character before _raw[0]
        self._mode = _NORMAL
        self._line_start = True
        self._after_bullet = False
        self._last = _NONE  # kind of the last emitted character
        self._adjacent = False  # last emitted is visible, no raw white space since
        self._gap = -1  # raw start of dropped markup waiting for the next character
        self._run_len = 0  # backtick run that opened inline code
        self._fence_char = ""
        self._fence_len = 0
        self._fence_bol = False
        self._depth = 0  # parentheses open in a link destination

    @property
    def pending(self) -> int:
        """Raw characters received but not yet decided."""
        return len(self._raw)

    @property
    def holds_bang(self) -> bool:
        """The only undecided character is a ``!`` waiting to see if ``[`` (a
        markdown image) follows."""
        return self._raw == "!" and self._mode == _NORMAL

    @property
    def in_markup(self) -> bool:
        """Inside markup that decides white space itself (a link destination,
        which drops it; inline or fenced code; a comment): the next space is not
        plain text's."""
        return self._mode != _NORMAL

    def settle_bang(self) -> None:
        """Decide a held lone ``!`` as text now (see ``holds_bang``): the
        segmenter's eager first cut does not wait for the next fragment."""
        if self.holds_bang:
            self._run(final=True)

    @property
    def consumed(self) -> int:
        """Raw characters decided so far (offset of the first held one)."""
        return self._off

    def feed(self, fragment: str) -> None:
        if fragment:
            self._raw = self._raw + fragment if self._raw else fragment
            self._run(final=False)

    def finish(self) -> None:
        """Decide the held tail as if the text ended here (for flush and end)."""
        self._run(final=True)

    # --- driver -------------------------------------------------------------

    def _run(self, final: bool) -> None:
        raw = self._raw
        n = len(raw)
        j = 0
        while j < n:
            mode = self._mode
            if mode == _NORMAL:
                if self._line_start:
                    k = self._line(raw, j, n, final)
                else:
                    k = self._inline(raw, j, n, final)
            elif mode == _CODE:
                k = self._code(raw, j, n, final)
            elif mode == _DEST:
                k = self._dest(raw, j, n)
            elif mode == _COMMENT:
                k = self._comment(raw, j, n, final)
            else:
                k = self._fence(raw, j, n, final)
            if k < 0:
                break
            j = k
        if j:
            self._prev = raw[j - 1]
            self._off += j
            self._raw = raw[j:]

    # --- emission -------------------------------------------------------------

    def _vis(self, ch: str, a: int, b: int) -> None:
        out = self.out
        start = self._off + a
        if self._gap >= 0:
            start = self._gap
            self._gap = -1
        out.chars.append(ch)
        out.starts.append(start)
        out.ends.append(self._off + b)
        self._last = _VIS
        self._adjacent = True

    def _vis_run(self, raw: str, a: int, b: int) -> None:
        out = self.out
        o = self._off
        first = len(out.starts)
        out.chars.extend(raw[a:b])
        out.starts.extend(range(o + a, o + b))
        out.ends.extend(range(o + a + 1, o + b + 1))
        if self._gap >= 0:
            out.starts[first] = self._gap
            self._gap = -1
        self._last = _VIS
        self._adjacent = True

    def _drop(self, a: int, b: int) -> None:
        if b <= a:
            return
        out = self.out
        if self._adjacent and out.chars and out.chars[-1] not in " \n":
            out.ends[-1] = self._off + b
        elif self._gap < 0:
            self._gap = self._off + a

    def _space(self, a: int) -> None:
        self._adjacent = False
        self._gap = -1
        if self._last == _VIS:
            self._append_ws(" ", a)
            self._last = _SP

    def _newline(self, a: int) -> None:
        self._adjacent = False
        self._gap = -1
        if self._last in (_VIS, _SP):
            self._append_ws("\n", a)
            self._last = _NL

    def _append_ws(self, ch: str, a: int) -> None:
        out = self.out
        out.chars.append(ch)
        out.starts.append(self._off + a)
        out.ends.append(self._off + a + 1)

    # --- NORMAL mode ------------------------------------------------------------

    def _line_break(self, raw: str, j: int, n: int, final: bool) -> int:
        if raw[j] == "\r":
            if j + 1 >= n and not final:
                return -1  # "\r\n" is one break
            self._newline(j)
            end = j + 2 if j + 1 < n and raw[j + 1] == "\n" else j + 1
        else:
            self._newline(j)
            end = j + 1
        self._line_start = True
        self._after_bullet = False
        return end

    def _line(self, raw: str, j: int, n: int, final: bool) -> int:
        """At a line start: block markers (heading, quote, bullet, list, rule, fence)."""
        c = raw[j]
        if c == " " or c == "\t":
            self._space(j)
            return j + 1
        if c in _NEWLINES:
            return self._line_break(raw, j, n, final)
        if c == "#":
            k = j
            while k < n and k - j <= 6 and raw[k] == "#":
                k += 1
            if k >= n and not final:
                return -1
            if k - j <= 6 and (k >= n or raw[k] in " \t" or raw[k] in _NEWLINES):
                end = k + 1 if k < n and raw[k] in " \t" else k
                self._drop(j, end)
                self._line_start = False
                return end
        elif c == ">":
            self._drop(j, j + 1)  # block quote; nested quotes and bullets may follow
            return j + 1
        elif c in _BULLETS or c == "=":
            if c in "-=":  # a rule (---) or a setext underline (===): drop the line
                k = j
                count = 0
                # a rule is short: past _RULE_SCAN characters the line is text
                while k < n and k - j < _RULE_SCAN and (raw[k] == c or raw[k] in " \t"):
                    count += raw[k] == c
                    k += 1
                if k >= n and not final:
                    return -1
                if (k >= n or raw[k] in _NEWLINES) and count >= 3:
                    self._drop(j, k)
                    self._line_start = False
                    return k
            if c != "=":
                if j + 1 >= n and not final:
                    return -1
                if j + 1 < n and raw[j + 1] in " \t":
                    self._drop(j, j + 2)
                    self._after_bullet = True
                    return j + 2
        elif "0" <= c <= "9":
            k = j
            while k < n and k - j < 4 and "0" <= raw[k] <= "9":
                k += 1
            if k >= n and not final:
                return -1
            # "1." or "12)" then a space: an ordered-list marker (up to 3 digits,
            # so a year such as "2026." starting a line stays text).
            if k < n and k - j <= 3 and raw[k] in ".)":
                if k + 1 >= n and not final:
                    return -1
                if k + 1 >= n or raw[k + 1] in " \t" or raw[k + 1] in _NEWLINES:
                    end = k + 2 if k + 1 < n and raw[k + 1] in " \t" else k + 1
                    self._drop(j, end)
                    self._after_bullet = True
                    return end
        elif c == "`" or c == "~":
            k = j
            while k < n and raw[k] == c:
                k += 1
            if k >= n and not final:
                return -1
            if k - j >= 3:
                self._fence_char = c
                self._fence_len = k - j
                self._drop(j, k)
                self._mode = _FENCE_INFO
                self._line_start = False
                return k
        elif c == "[" and self._after_bullet:  # task list box "[ ]" / "[x]"
            if n - j < 4 and not final:
                return -1
            if (raw[j + 1:j + 2] in (" ", "x", "X") and raw[j + 2:j + 3] == "]"
                    and (j + 3 >= n or raw[j + 3].isspace())):
                self._drop(j, j + 3)
                self._after_bullet = False
                return j + 3
        self._line_start = False
        self._after_bullet = False
        return j  # not a marker: the same character again, as inline text

    def _inline(self, raw: str, j: int, n: int, final: bool) -> int:
        m = _PLAIN_RE.match(raw, j)
        if m is not None:
            self._vis_run(raw, j, m.end())
            return m.end()
        c = raw[j]
        if c.isspace():
            if c in _NEWLINES:
                return self._line_break(raw, j, n, final)
            self._space(j)
            return j + 1
        if c == "*":
            self._drop(j, j + 1)
            return j + 1
        if c == "_" or c == "~" or c == "`":
            k = j
            while k < n and raw[k] == c:
                k += 1
            if k >= n and not final:
                return -1
            if c == "`":
                self._run_len = k - j
                self._mode = _CODE
                self._drop(j, k)
                return k
            nxt = raw[k] if k < n else ""
            before = raw[j - 1] if j > 0 else self._prev
            if (c == "~" and k - j == 1) or (c == "_" and before.isalnum() and nxt.isalnum()):
                self._vis_run(raw, j, k)  # "~5 min", "snake_case": text, not markup
            else:
                self._drop(j, k)
            return k
        if c == "!":
            if j + 1 >= n and not final:
                return -1
            if j + 1 < n and raw[j + 1] == "[":
                self._drop(j, j + 1)  # image: its alt text is spoken
            else:
                self._vis(c, j, j + 1)
            return j + 1
        if c == "[":
            self._drop(j, j + 1)
            return j + 1
        if c == "]":
            if j + 1 >= n and not final:
                return -1
            if j + 1 < n and raw[j + 1] == "(":
                self._drop(j, j + 2)
                self._mode = _DEST
                self._depth = 1
                return j + 2
            self._drop(j, j + 1)
            return j + 1
        if c == "<":
            return self._angle(raw, j, n, final)
        if c == "&":
            return self._entity(raw, j, n, final)
        if c == "\\":
            if j + 1 >= n:
                if not final:
                    return -1
                self._vis(c, j, j + 1)
                return j + 1
            d = raw[j + 1]
            if d in _ASCII_PUNCT:
                self._vis(d, j, j + 2)
                return j + 2
            if d in _NEWLINES:  # markdown hard line break
                self._drop(j, j + 1)
                return j + 1
            self._vis(c, j, j + 1)
            return j + 1
        # what is left of the slow path: dropped characters (emoji, format)
        self._drop(j, j + 1)
        return j + 1

    def _angle(self, raw: str, j: int, n: int, final: bool) -> int:
        """``<``: an HTML tag or comment (dropped), an autolink (its text), or text."""
        if j + 1 >= n:
            if not final:
                return -1
            self._vis("<", j, j + 1)
            return j + 1
        if raw[j + 1] == "!":
            if raw.startswith("<!--", j):
                self._drop(j, j + 4)
                self._mode = _COMMENT
                return j + 4
            if not final and n - j < 4 and "<!--".startswith(raw[j:n]):
                return -1
            self._vis("<", j, j + 1)
            return j + 1
        m = _TAG_RE.match(raw, j)
        if m is not None:
            name = m.group(1).lower()
            if name in _BLOCK_TAGS:
                self._drop(j, m.end())
                self._newline(j)
                return m.end()
            if name in _INLINE_TAGS:
                self._drop(j, m.end())
                return m.end()
        m = _AUTOLINK_RE.match(raw, j)
        if m is not None:
            self._drop(j, j + 1)
            self._vis_run(raw, j + 1, m.end() - 1)
            self._drop(m.end() - 1, m.end())
            return m.end()
        if not final and n - j < MAX_HOLD:
            if _LINK_PREFIX_RE.match(raw, j):
                return -1
            m = _ATTR_PREFIX_RE.match(raw, j)
            if m is not None and m.group(1).lower() in _TAGS:
                return -1
        self._vis("<", j, j + 1)
        return j + 1

    def _entity(self, raw: str, j: int, n: int, final: bool) -> int:
        """An HTML character reference (``&amp;`` ``&#39;`` ``&nbsp;``): its character."""
        m = _ENTITY_RE.match(raw, j)
        if m is not None:
            ref = m.group(0)
            text: str | None
            if ref[1] == "#":
                cp = int(ref[3:-1], 16) if ref[2] in "xX" else int(ref[2:-1])
                text = chr(cp) if 0 < cp <= 0x10FFFF and not 0xD800 <= cp <= 0xDFFF else None
            else:
                text = html5.get(ref[1:])
            if text is not None:
                if text.isspace():
                    self._drop(j, m.end())
                    self._space(j)
                elif _DROP_RE.search(text) or any(ch in _NEWLINES for ch in text):
                    self._drop(j, m.end())
                else:
                    for ch in text:  # one or two characters, each with the reference's span
                        self._vis(ch, j, m.end())
                return m.end()
        elif not final and _ENTITY_PREFIX_RE.match(raw, j):
            return -1
        self._vis("&", j, j + 1)
        return j + 1

    # --- other modes -------------------------------------------------------------

    def _code(self, raw: str, j: int, n: int, final: bool) -> int:
        """Inside inline code: text verbatim until a backtick run of the same length."""
        c = raw[j]
        if c == "`":
            k = j
            while k < n and raw[k] == "`":
                k += 1
            if k >= n and not final:
                return -1
            if k - j == self._run_len:
                self._drop(j, k)
                self._mode = _NORMAL
            else:
                self._vis_run(raw, j, k)
            return k
        if c in _NEWLINES:  # inline code ends with its line
            self._mode = _NORMAL
            return j
        if c.isspace():
            self._space(j)
            return j + 1
        m = _CODE_PLAIN_RE.match(raw, j)
        if m is not None:
            self._vis_run(raw, j, m.end())
            return m.end()
        self._drop(j, j + 1)
        return j + 1

    def _dest(self, raw: str, j: int, n: int) -> int:
        """A link destination ``(url "title")``: dropped up to its closing parenthesis."""
        depth = self._depth
        k = j
        while k < n:
            c = raw[k]
            if c in _NEWLINES:
                self._drop(j, k)
                self._mode = _NORMAL
                return k
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    self._drop(j, k + 1)
                    self._mode = _NORMAL
                    return k + 1
            k += 1
        self._depth = depth
        self._drop(j, n)
        return n

    def _comment(self, raw: str, j: int, n: int, final: bool) -> int:
        k = raw.find("-->", j)
        if k >= 0:
            self._drop(j, k + 3)
            self._mode = _NORMAL
            return k + 3
        end = n if final else n - 2  # "-->" may straddle the next fragment
        if end <= j:
            return -1
        self._drop(j, end)
        return end

    def _fence(self, raw: str, j: int, n: int, final: bool) -> int:
        """A fenced code block, from its info string to its closing fence: dropped."""
        if self._mode == _FENCE_INFO or not self._fence_bol:
            m = _NEWLINE_RE.search(raw, j)
            if m is None:
                self._drop(j, n)
                return n
            self._drop(j, m.end())
            self._mode = _FENCE
            self._fence_bol = True
            return m.end()
        k = j
        while k < n and raw[k] in " \t":
            k += 1
        r = k
        while r < n and raw[r] == self._fence_char:
            r += 1
        if r >= n and not final:
            return -1
        if r - k >= self._fence_len:
            e = r
            while e < n and raw[e] in " \t":
                e += 1
            if e >= n and not final:
                return -1
            if e >= n or raw[e] in _NEWLINES:
                self._drop(j, e)
                self._mode = _NORMAL
                self._line_start = False
                self._fence_bol = False
                return e
        self._fence_bol = False
        return j


def normalize(text: str) -> str:
    """The whole of ``text`` normalized: what the segmenter's segments speak, joined.

    White space collapses to single spaces (line breaks included) and the
    result is stripped.
    """
    norm = Normalizer()
    norm.feed(text)
    norm.finish()
    return " ".join(norm.out.text().split())
