"""Properties of the segmenter over generated LLM-like text and arbitrary fragmentation.

Invariants (``N = normalize(text)``, segments from any fragmentation):

1. With the timer never firing (``now=0`` throughout), every fragmentation of
   the same text yields the same segments, text and source; ending with
   ``flush`` then ``end`` gives the same as ``end`` alone.
2. ``N`` is the segments' texts joined in order, each join being one space
   where the text had white space at the cut and nothing where it had none
   (a cut between CJK characters, after CJK punctuation and its closing
   quotes, or a hard cut of a word longer than ``max_chars``, made just
   before a combining mark if one falls there). Texts are
   non-empty, stripped, without line breaks or double spaces.
   With timers firing, the first cut may also fall right after ``, ; ! ? .``
   with no white space (the eager first cut fires before the space arrives).
3. No segment is longer than its limit (``config.limit(index)`` <= ``max_chars``).
4. Sources are non-empty, inside the text, increasing and non-overlapping;
   each segment's non-space characters appear, in order, in its source slice.
   Indices are 0, 1, 2, ...

2-4 also hold when the first-segment timer fires at arbitrary times.
"""

from __future__ import annotations

import unicodedata

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rtserver.text.normalize import normalize
from rtserver.text.segmenter import Segment, Segmenter, SegmenterConfig, tidy_spaces

ATOMS = [
    # words and punctuation
    "hello", "World", "the", "quick", "Fox", "i", "a", "Then", "and",
    ",", ".", "!", "?", ";", ":", "...", "…", "—", "-", '"', "'", "(", ")",
    # numbers, money, times
    "3.14", "$3.50", "1,000", "1,000,000.50", "5:30", "2.10.3", "25–30", "12.", "7",
    # abbreviations
    "Dr.", "Mr.", "Mrs.", "e.g.", "i.e.", "etc.", "a.m.", "p.m.", "U.S.", "Inc.", "J.",
    # markdown and HTML
    "*", "**", "_", "__", "~~", "~", "`", "```", "```py\nx = 1\n```", "# ", "## ", "- ", "* ",
    "1. ", "> ", "[", "]", "(", "[link](http://x.com/a_(b))", "![alt](i.png)", "<b>", "</b>",
    "<br>", "<!-- c -->", "&amp;", "&", "<", "\\*", "- [ ] ", "---",
    # URLs, e-mail
    "http://example.com/a?b=1.2", "www.example.com/path?x=1.2", "a.b@example.com",
    "<https://x.io>",
    # CJK
    "你好", "世界", "。", "，", "、", "！", "？", "「", "」", "こんにちは", "です",
    # emoji
    "🎉", "😊", "👍🏽", "🇺🇸", "👨‍👩‍👧", "1️⃣",
    # white space
    " ", " ", " ", "\n", "\n\n", "  ", "\t", "\r\n",
]
SEPARATORS = st.sampled_from(["", " ", " ", " ", "\n"])

texts_strategy = st.one_of(
    st.lists(st.tuples(st.sampled_from(ATOMS), SEPARATORS), max_size=60).map(
        lambda pairs: "".join(a + s for a, s in pairs)),
    st.text(max_size=80),  # anything at all
)
configs = st.builds(
    SegmenterConfig,
    first_max_words=st.integers(0, 8),
    first_wait_s=st.just(0.25),
    max_chars=st.sampled_from([1, 2, 5, 12, 30, 80, 250]),
    cjk_chars_per_word=st.integers(1, 3),
    second_max_chars=st.sampled_from([0, 1, 7, 20, 80]),
    growth=st.sampled_from([1.0, 1.5, 2.0]),
)


def cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c for c in cuts if 0 < c < len(text)})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def segment(fragments: list[str], config: SegmenterConfig, flush_first: bool = False
            ) -> list[Segment]:
    seg = Segmenter(config)
    out: list[Segment] = []
    for fragment in fragments:
        out += seg.feed(fragment, 0.0)
    if flush_first:
        out += seg.flush(0.0)
    out += seg.end(0.0)
    assert seg.pending_chars == 0
    return out


CLOSERS = "\"')]}»”’」』】）〕〉》〗〙〛'"


def _cjk_edge(ch: str) -> bool:
    cp = ord(ch)
    return (0x3000 <= cp <= 0x30FF or 0x3400 <= cp <= 0x4DBF or 0x4E00 <= cp <= 0x9FFF
            or 0xF900 <= cp <= 0xFAFF or 0xFF00 <= cp <= 0xFFEF or 0x20000 <= cp <= 0x3134F)


def check_invariants(text: str, out: list[Segment], config: SegmenterConfig) -> None:
    # 4: indices, sources
    assert [s.index for s in out] == list(range(len(out)))
    prev_end = 0
    for s in out:
        a, b = s.source
        assert prev_end <= a < b <= len(text), (s, prev_end)
        prev_end = b
        raw = iter(text[a:b])
        assert all(ch in raw for ch in s.text if ch != " "), s  # a subsequence
    # 3: length
    assert all(len(s.text) <= config.limit(s.index) <= config.max_chars for s in out)
    # 2: the segments are normalize(text), cut
    whole = normalize(text)
    pos = 0
    cut_len = 0  # the previous segment's length as cut, before tidy_spaces
    for k, s in enumerate(out):
        assert s.text and s.text == s.text.strip() and "\n" not in s.text and "  " not in s.text
        if k:
            if whole.startswith(" ", pos):
                pos += 1
            else:  # no white space at this cut: only where text has none to give
                left, right = out[k - 1].text, s.text
                bare = left.rstrip(CLOSERS) or left
                # a hard cut moved back by a combining mark; measured on the text
                # as cut (tidy_spaces may shorten a segment after its cut)
                back = config.limit(k - 1) - cut_len
                # the eager first cut (a timer) may fire before the space arrives
                eager = k == 1 and bare[-1] in ",;!?."
                assert (eager or _cjk_edge(bare[-1]) or _cjk_edge(right[0]) or back == 0
                        or (0 < back < len(right) and unicodedata.combining(right[back]))
                        ), (left, right)
        # each segment is its piece of the whole, spaces before punctuation
        # tidied away ("launch !" -> "launch!", tidy_spaces)
        for extra in range(len(s.text) + 1):
            if tidy_spaces(whole[pos:pos + len(s.text) + extra]) == s.text:
                cut_len = len(s.text) + extra
                pos += cut_len
                break
        else:
            raise AssertionError((whole, pos, s.text))
    assert pos == len(whole)


@settings(max_examples=400, deadline=None)
@given(text=texts_strategy, cuts=st.lists(st.integers(0, 400), max_size=40), config=configs)
def test_any_fragmentation_gives_the_same_segments(text: str, cuts: list[int],
                                                   config: SegmenterConfig) -> None:
    whole = segment([text], config)
    check_invariants(text, whole, config)
    assert segment(cut(text, cuts), config) == whole
    assert segment(list(text), config) == whole
    assert segment(cut(text, cuts), config, flush_first=True) == whole


@settings(max_examples=200, deadline=None)
@given(text=texts_strategy, cuts=st.lists(st.integers(0, 400), max_size=40),
       gaps=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=40),
       polls=st.lists(st.booleans(), min_size=1, max_size=40), config=configs)
# found in CI: a hard cut at 12 characters, then tidy_spaces dropped " " before ","
@example(text=",# , hellohello", cuts=[], gaps=[0.0], polls=[False],
         config=SegmenterConfig(first_max_words=0, first_wait_s=0.25, max_chars=12,
                                second_max_chars=0, growth=1.0, cjk_chars_per_word=1))
def test_invariants_hold_when_the_timer_fires(text: str, cuts: list[int], gaps: list[float],
                                              polls: list[bool], config: SegmenterConfig
                                              ) -> None:
    seg = Segmenter(config)
    out: list[Segment] = []
    now = 0.0
    for k, fragment in enumerate(cut(text, cuts)):
        now += gaps[k % len(gaps)]
        deadline = seg.deadline()
        if polls[k % len(polls)] and deadline is not None:
            out += seg.poll(max(now, deadline))
            now = max(now, deadline)
        out += seg.feed(fragment, now)
    out += seg.end(now)
    check_invariants(text, out, config)
