"""Normalization for speech: what an LLM emits that must not be read aloud."""

from __future__ import annotations

import pytest

from rtserver.text.normalize import MAX_HOLD, Normalizer, NormBuffer, normalize


def stream(fragments: list[str]) -> NormBuffer:
    """Feed fragments one by one, then finish; the buffer the segmenter would see."""
    norm = Normalizer()
    for fragment in fragments:
        norm.feed(fragment)
    norm.finish()
    return norm.out


def collapsed(buf: NormBuffer) -> str:
    return " ".join(buf.text().split())


# --- markdown ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "spoken"), [
    ("a *b* c", "a b c"),
    ("a **b** c", "a b c"),
    ("a ***b*** c", "a b c"),
    ("a _b_ c", "a b c"),
    ("a __b__ c", "a b c"),
    ("a ~~b~~ c", "a b c"),
    ("**bold *and italic* inside**", "bold and italic inside"),
    ("snake_case and __init__ names", "snake_case and init names"),
    ("about ~5 minutes", "about ~5 minutes"),
    ("2 * 3 = 6", "2 3 = 6"),
])
def test_emphasis_markers_are_dropped(raw: str, spoken: str) -> None:
    assert normalize(raw) == spoken


@pytest.mark.parametrize(("raw", "spoken"), [
    ("# Title\nText", "Title Text"),
    ("###### Six\nText", "Six Text"),
    ("####### Seven", "####### Seven"),  # more than six is not a heading
    ("#hashtag here", "#hashtag here"),
    ("> quoted\n> > nested", "quoted nested"),
    ("- one\n- two", "one two"),
    ("* star\n+ plus\n• dot", "star plus dot"),
    ("  - indented", "indented"),
    ("1. first\n2. second\n10) tenth", "first second tenth"),
    ("1.5 is a number", "1.5 is a number"),
    ("2026. A year starts the line", "2026. A year starts the line"),
    ("-5 degrees", "-5 degrees"),
    ("- [ ] todo\n- [x] done", "todo done"),
    ("Title\n=====\nBody", "Title Body"),
    ("Above\n---\nBelow\n* * *\nEnd", "Above Below End"),
    ("a line -- with dashes", "a line -- with dashes"),
])
def test_block_markers_at_line_start_are_dropped(raw: str, spoken: str) -> None:
    assert normalize(raw) == spoken


@pytest.mark.parametrize(("raw", "spoken"), [
    ("Run:\n```python\nprint('hi')\n```\nDone.", "Run: Done."),
    ("Run:\n~~~\ncode * here\n~~~\nDone.", "Run: Done."),
    ("Run:\n````\n```\nstill code\n````\nDone.", "Run: Done."),  # a longer fence
    ("Unclosed:\n```\nprint(1)\nmore", "Unclosed:"),
    ("Use `pip install x` now.", "Use pip install x now."),
    ("Keep `a*b_c` literal", "Keep a*b_c literal"),
    ("Double ``a ` b`` ticks", "Double a ` b ticks"),
    ("Inline ```x``` too", "Inline x too"),
])
def test_code(raw: str, spoken: str) -> None:
    assert normalize(raw) == spoken


@pytest.mark.parametrize(("raw", "spoken"), [
    ("See [the docs](https://example.com/a?b=1.2) now", "See the docs now"),
    ("A [link](https://en.wikipedia.org/wiki/Foo_(bar)) with parens", "A link with parens"),
    ('A [titled](https://x.com "Title text") link', "A titled link"),
    ("An ![a chart](chart.png) image", "An a chart image"),
    ("Citation [1] here", "Citation 1 here"),
    ("Wow! Really", "Wow! Really"),
])
def test_links_and_images(raw: str, spoken: str) -> None:
    assert normalize(raw) == spoken


@pytest.mark.parametrize(("raw", "spoken"), [
    ("<b>bold</b> and <i>it</i>", "bold and it"),
    ('<span class="x">styled</span>', "styled"),
    ("line<br>break<br/>again<br />end", "line break again end"),
    ("<!-- a comment --> text <!-- more\nlines --> end", "text end"),
    ("mail <a.b@example.com> or <https://example.com/x>", "mail a.b@example.com or https://example.com/x"),
    ("x < 5 and y<3 and a<b", "x < 5 and y<3 and a<b"),
    ("<unknown>tag</unknown>", "<unknown>tag</unknown>"),
    ("AT&amp;T &lt;3 &quot;q&quot; &#39;s&#x27; a&nbsp;b", "AT&T <3 \"q\" 's' a b"),
    ("R&D and &bogus; and & alone", "R&D and &bogus; and & alone"),
])
def test_html(raw: str, spoken: str) -> None:
    assert normalize(raw) == spoken


def test_block_tags_and_newlines_become_line_breaks() -> None:
    assert stream(["one<br>two</p>three\n\n\nfour\r\nfive"]).text() == \
        "one\ntwo\nthree\nfour\nfive"


@pytest.mark.parametrize(("raw", "spoken"), [
    ("Great job 🎉!", "Great job !"),
    ("thumbs 👍🏽 up", "thumbs up"),
    ("flag 🇺🇸 here", "flag here"),
    ("family 👨‍👩‍👧 done", "family done"),
    ("keycap 1️⃣ stays", "keycap 1 stays"),
    ("sun ☀️ star ⭐ check ✅ heart ❤️", "sun star check heart"),
    ("zero\u200bwidth soft\u00adhyphen", "zerowidth softhyphen"),
    ("© 2024 Acme™ 25°C → done", "© 2024 Acme™ 25°C → done"),
    ("你好，世界。「引号」", "你好，世界。「引号」"),
])
def test_emoji_and_invisible_characters(raw: str, spoken: str) -> None:
    assert normalize(raw) == spoken


def test_escapes_white_space_and_empty_input() -> None:
    assert normalize(r"\*not emphasis\* and a \ backslash") == "*not emphasis* and a \\ backslash"
    assert normalize("  lots \t of\u00a0\u00a0 space  ") == "lots of space"
    assert normalize("") == ""
    assert normalize("**  __ ``` \n") == ""


# --- incremental ------------------------------------------------------------------------------

TRICKY = [
    "**bold** then *it* and __u__ ~~s~~ snake_case",
    "Run:\n```py\nx = 1\n```\nDone. `inline` code",
    "# Head\n> quote\n- item\n12. list\n- [x] box\n---\nEnd",
    "A [link](http://x.com/a_(b)) and ![alt](i.png) <b>t</b> <br/> &amp; <x@y.io>",
    "Hi 👨‍👩‍👧 there\r\nnext \\*x\\* <!-- c -->",
]


@pytest.mark.parametrize("text", TRICKY)
def test_every_two_way_split_gives_the_same_output(text: str) -> None:
    whole = stream([text])
    for cut in range(1, len(text)):
        split = stream([text[:cut], text[cut:]])
        assert split.chars == whole.chars, cut
        assert split.starts == whole.starts and split.ends == whole.ends, cut


@pytest.mark.parametrize("text", TRICKY)
def test_character_by_character_gives_the_same_output(text: str) -> None:
    whole = stream([text])
    single = stream(list(text))
    assert (single.chars, single.starts, single.ends) == (whole.chars, whole.starts, whole.ends)


def test_markers_split_across_fragments() -> None:
    assert collapsed(stream(["*", "*bold**", " rest"])) == "bold rest"
    assert collapsed(stream(["Code:\n`", "``", "py\nx=1\n`", "``\nafter"])) == "Code: after"
    assert collapsed(stream(["[te", "xt](ht", "tp://a.b/c", ") end"])) == "text end"


def test_an_undecidable_tail_is_held_back_and_released() -> None:
    norm = Normalizer()
    norm.feed("Hello <b")
    assert norm.out.text() == "Hello " and norm.pending == 2
    norm.feed(">world</b>")
    assert norm.out.text() == "Hello world" and norm.pending == 0
    norm.feed("\n12")
    assert norm.out.text() == "Hello world\n" and norm.pending == 2  # "12." would be a list
    norm.feed(" apples")
    assert norm.out.text() == "Hello world\n12 apples" and norm.pending == 0


def test_finish_decides_the_tail_as_text_end() -> None:
    norm = Normalizer()
    norm.feed("see snake_")
    assert norm.out.text() == "see snake"
    norm.finish()
    assert norm.out.text() == "see snake" and norm.pending == 0


def test_an_unclosed_angle_bracket_is_held_at_most_max_hold() -> None:
    norm = Normalizer()
    norm.feed("x <b " + "y" * (MAX_HOLD + 10))
    assert norm.out.text().startswith("x <b y") and norm.pending == 0


# --- source spans -----------------------------------------------------------------------------

def test_spans_point_back_to_the_raw_characters() -> None:
    raw = "**Hi** [you](http://x.io) `c`"
    buf = stream([raw])
    assert buf.text() == "Hi you c"
    spans = dict(zip(range(len(buf.chars)), zip(buf.starts, buf.ends, strict=True), strict=True))
    assert spans[0] == (0, 3)  # "H" carries the opening "**"
    assert spans[1] == (3, 6)  # "i" carries the closing "**"
    assert raw[spans[3][0]:spans[3][1]] == "[y"
    assert raw[spans[5][0]:spans[5][1]] == "u](http://x.io)"
    assert raw[spans[7][0]:spans[7][1]] == "`c`"
    for a, b in zip(buf.starts, buf.ends, strict=True):
        assert 0 <= a < b <= len(raw)
    assert all(b <= a for (_, b), (a, _) in zip(list(spans.values()), list(spans.values())[1:],
                                                  strict=False))
