"""The incremental segmenter: eager first segment, whole sentences, safe cut points."""

from __future__ import annotations

import dataclasses

import pytest

from rtserver.text.segmenter import Segment, Segmenter, SegmenterConfig
from rtserver.tools.bench.corpus import CORPUS, llm_tokens

NO_TIMER = SegmenterConfig(first_wait_s=0)


def texts(segments: list[Segment]) -> list[str]:
    return [s.text for s in segments]


def run(text: str, config: SegmenterConfig = NO_TIMER, by: str = "char") -> list[Segment]:
    """Feed ``text`` (by character, LLM-like token, or whole) at t=0, then end."""
    seg = Segmenter(config)
    pieces = list(text) if by == "char" else llm_tokens(text) if by == "token" else [text]
    out: list[Segment] = []
    for piece in pieces:
        out += seg.feed(piece, 0.0)
    out += seg.end(0.0)
    return out


def later(sentence: str, config: SegmenterConfig = NO_TIMER) -> list[str]:
    """Segments of ``sentence`` when it is not the first segment (those cut eagerly)."""
    out = texts(run("Okay. " + sentence, config))
    assert out[0] == "Okay."
    return out[1:]


# --- the first segment ------------------------------------------------------------------------

def test_first_clause_goes_out_as_soon_as_the_comma_is_followed_by_a_space() -> None:
    seg = Segmenter(NO_TIMER)
    assert seg.feed("Hello there,", 0.0) == []  # "," might still be "1,000"-like
    out = seg.feed(" ", 0.0)
    assert out == [Segment(0, "Hello there,", (0, 12))]
    assert seg.feed("how are you today, my friend", 0.0) == []  # later: whole sentences
    assert texts(seg.feed("? Fine.", 0.0)) == ["how are you today, my friend?"]
    assert texts(seg.end(0.0)) == ["Fine."]


@pytest.mark.parametrize(("text", "first"), [
    ("Sure! I can help.", "Sure!"),
    ("Really? Yes.", "Really?"),
    ("Note: this matters.", "Note:"),
    ("First; second.", "First;"),
    ("Well — maybe not.", "Well —"),
    ("Hmm... let me think.", "Hmm..."),
    ("Hmm… let me think.", "Hmm…"),
    ("## Heading\nBody text.", "Heading"),
    ("你好，我可以帮你。", "你好，"),
])
def test_first_segment_is_the_first_clause(text: str, first: str) -> None:
    assert texts(run(text))[0] == first


def test_first_segment_after_a_few_words_without_punctuation() -> None:
    seg = Segmenter(dataclasses.replace(NO_TIMER, first_max_words=4))
    assert seg.feed("one two three four", 0.0) == []  # "four" may continue
    assert texts(seg.feed(" five six", 0.0)) == ["one two three four"]
    assert texts(seg.end(0.0)) == ["five six"]


def test_the_word_limit_never_cuts_after_a_title() -> None:
    cfg = dataclasses.replace(NO_TIMER, first_max_words=3)
    assert texts(run("I met Dr. Smith at the market today", cfg))[0] == "I met Dr. Smith"


def test_the_word_limit_can_be_turned_off() -> None:
    cfg = dataclasses.replace(NO_TIMER, first_max_words=0)
    assert texts(run("one two three four five six seven eight nine ten", cfg)) == \
        ["one two three four five six seven eight nine ten"]


def test_cjk_characters_count_as_half_words() -> None:
    cfg = dataclasses.replace(NO_TIMER, first_max_words=3)
    out = texts(run("今天我们一起去公园散步然后吃饭", cfg))
    assert out[0] == "今天我们一起" and "".join(out) == "今天我们一起去公园散步然后吃饭"


def test_first_segment_timer_fires_after_the_last_word_boundary() -> None:
    seg = Segmenter(SegmenterConfig(first_wait_s=0.25))
    assert seg.deadline() is None
    assert seg.feed("Hello", 1.0) == [] and seg.deadline() is None  # no complete word yet
    assert seg.feed(" big", 1.1) == []
    assert seg.deadline() == pytest.approx(1.35)
    assert seg.feed(" wor", 1.2) == []
    assert seg.deadline() == pytest.approx(1.45)  # each new word boundary moves it
    assert seg.poll(1.44) == []
    out = seg.poll(1.45)
    assert out == [Segment(0, "Hello big", (0, 9))]  # complete words only, not "wor"
    assert seg.deadline() is None  # the timer is for the first segment only
    assert seg.feed("ld and more", 5.0) == []
    assert texts(seg.end(5.0)) == ["world and more"]


def test_a_due_timer_fires_before_new_text_is_taken() -> None:
    seg = Segmenter(SegmenterConfig(first_wait_s=0.25))
    seg.feed("Hello ", 0.0)
    assert texts(seg.feed("world, again", 1.0)) == ["Hello"]
    assert texts(seg.end(1.0)) == ["world, again"]


def test_no_timer_when_turned_off_or_after_the_first_segment() -> None:
    seg = Segmenter(NO_TIMER)
    seg.feed("Hello there ", 0.0)
    assert seg.deadline() is None and seg.poll(100.0) == []
    seg = Segmenter(SegmenterConfig(first_wait_s=0.25))
    seg.feed("Yes. And then ", 0.0)
    assert seg.deadline() is None


# --- later segments ---------------------------------------------------------------------------

def test_later_segments_are_whole_sentences() -> None:
    assert later("The first one, with a comma; and more. The second!") == \
        ["The first one, with a comma; and more.", "The second!"]


def test_a_long_sentence_is_cut_at_its_last_clause_break() -> None:
    cfg = dataclasses.replace(NO_TIMER, max_chars=60)
    sentence = ("We looked at the numbers for the quarter, and the totals in the table "
                "do not match the summary.")
    out = later(sentence, cfg)
    assert out == ["We looked at the numbers for the quarter,",
                   "and the totals in the table do not match the summary."]


def test_a_long_sentence_without_clauses_is_cut_at_a_space() -> None:
    cfg = dataclasses.replace(NO_TIMER, max_chars=40)
    sentence = "one two three four five six seven eight nine ten eleven twelve thirteen"
    out = later(sentence, cfg)
    assert all(len(s) <= 40 for s in out) and " ".join(out) == sentence
    assert out[0] == "one two three four five six seven eight"


def test_an_early_clause_break_gives_way_to_a_fuller_cut() -> None:
    cfg = dataclasses.replace(NO_TIMER, max_chars=60)
    out = later("So, we looked at all the numbers for the quarter and the totals in "
                "the table.", cfg)
    assert out[0] == "So, we looked at all the numbers for the quarter and the"


def test_a_word_longer_than_max_chars_is_cut_hard() -> None:
    cfg = dataclasses.replace(NO_TIMER, max_chars=20)
    url = "https://example.com/" + "a" * 50
    out = later(f"Open {url} now.", cfg)
    assert all(len(s) <= 20 for s in out)
    assert "".join(out).replace(" ", "") == f"Open{url}now."


# --- never split inside ... -------------------------------------------------------------------

@pytest.mark.parametrize("sentence", [
    "I met Dr. Smith and Mr. Brown today.",
    "Mrs. Green and Ms. White met Prof. Black.",
    "We drove to St. Louis vs. Chicago.",
    "Bring fruit, e.g. apples, i.e. something sweet.",
    "It was 10:30 a.m. on Monday.",
    "Call after 6 p.m. tomorrow.",
    "U.S. users and U.K. users agree.",
    "Apples, pears, etc. are fruit.",
    "Acme Inc. is big.",
    "John Smith Jr. was there.",
    "Pi is 3.14 and e is 2.718.",
    "It costs $3.50 or $1,000 or 1,000,000.50 dollars.",
    "Meet at 5:30 sharp.",
    "Wait... what is that?",
    "Wait… what is that?",
    "Visit http://example.com/a.b?c=1.5&d=2 today.",
    "Visit www.example.com/path?x=1.2 today.",
    "Write to john.doe@example.co.uk today.",
    "Version 2.10.3 is out.",
    "He wrote J. R. R. Tolkien books.",
])
def test_never_split_inside(sentence: str) -> None:
    for by in ("char", "token", "whole"):
        out = texts(run("Okay. " + sentence, by=by))
        assert out == ["Okay.", sentence], by


@pytest.mark.parametrize(("text", "expected"), [
    ("Apples, pears, etc. Then we left.", ["Apples, pears, etc.", "Then we left."]),
    ("We left at 6 p.m. The end.", ["We left at 6 p.m.", "The end."]),
    ("I live in the U.S. It is big.", ["I live in the U.S.", "It is big."]),
    ("Wait... What was that?", ["Wait...", "What was that?"]),
    ('He said "Call me." Then he left.', ['He said "Call me."', "Then he left."]),
    ('"Why?" he asked.', ['"Why?" he asked.']),
    ("It was 3. Then 4.", ["It was 3.", "Then 4."]),
    ("See example.com. Then go.", ["See example.com.", "Then go."]),
])
def test_sentence_ends_after_abbreviations_and_quotes(text: str, expected: list[str]) -> None:
    assert later(text) == expected


def test_a_period_waits_for_the_next_character() -> None:
    seg = Segmenter(NO_TIMER)
    assert texts(seg.feed("Yes. ", 0.0)) == ["Yes."]
    assert seg.feed("It costs 3.", 0.0) == []  # "3." may be "3.50"
    assert seg.feed("50", 0.0) == []
    assert texts(seg.feed(" now. ", 0.0)) == ["It costs 3.50 now."]
    assert seg.feed("Dr. ", 0.0) == []  # a title never ends a sentence
    assert seg.feed("Who etc. ", 0.0) == []  # may end one: the next word decides
    assert texts(seg.feed("Then", 0.0)) == ["Dr. Who etc."]


# --- CJK --------------------------------------------------------------------------------------

def test_cjk_sentences_split_without_spaces() -> None:
    assert texts(run("你好，我可以帮你。明天天气晴朗，最高气温二十四度。")) == \
        ["你好，", "我可以帮你。", "明天天气晴朗，最高气温二十四度。"]
    assert texts(run("こんにちは、お手伝いします！明日は晴れです？はい。")) == \
        ["こんにちは、", "お手伝いします！", "明日は晴れです？", "はい。"]


def test_cjk_closing_brackets_and_punctuation_runs_stay_with_their_sentence() -> None:
    assert texts(run("好。「你好。」他说？！真的。")) == \
        ["好。", "「你好。」", "他说？！", "真的。"]


def test_long_cjk_text_is_cut_between_characters() -> None:
    cfg = dataclasses.replace(NO_TIMER, max_chars=10)
    text = "一二三四五六七八九十" * 3 + "。"
    out = texts(run("好。" + text, cfg))
    assert out[0] == "好。" and all(len(s) <= 10 for s in out) and "".join(out[1:]) == text


# --- markup, line breaks, sources -------------------------------------------------------------

def test_line_breaks_end_segments() -> None:
    text = "Here are the steps:\n\n1. **Open** the menu\n2. Choose `Network`\n- Tap [it](http://x.y)"
    assert texts(run(text)) == ["Here are the steps:", "Open the menu", "Choose Network", "Tap it"]


def test_markup_only_pieces_never_become_segments() -> None:
    assert run("**  __\n```\ncode\n```\n🎉 <br>") == []
    out = run("🎉\n**Hi.**\n\n---\n\n```\nx\n```\nBye.")
    assert texts(out) == ["Hi.", "Bye."] and [s.index for s in out] == [0, 1]


def test_a_line_without_letters_joins_the_next_text() -> None:
    assert later("...\nAnd then we left.") == ["... And then we left."]


def test_sources_cover_the_raw_characters() -> None:
    raw = "## Title\n**Hi.** There [you](http://x.y).\n"
    out = run(raw)
    assert texts(out) == ["Title", "Hi.", "There you."]
    assert [raw[a:b] for a, b in (s.source for s in out)] == \
        ["## Title", "**Hi.**", "There [you](http://x.y)."]


# --- flush, end, state ------------------------------------------------------------------------

def test_flush_speaks_what_is_buffered() -> None:
    seg = Segmenter(NO_TIMER)
    assert seg.feed("Hello wor", 0.0) == []
    assert seg.pending_chars == 9
    assert seg.flush(0.0) == [Segment(0, "Hello wor", (0, 9))]
    assert seg.pending_chars == 0 and seg.flush(0.0) == []
    assert seg.feed("ld. Next", 0.0) == [Segment(1, "ld.", (9, 12))]
    assert seg.end(0.0) == [Segment(2, "Next", (13, 17))]


def test_pending_chars_counts_held_markup() -> None:
    seg = Segmenter(NO_TIMER)
    seg.feed("Hi <b", 0.0)
    assert seg.pending_chars == 5  # "Hi " normalized plus "<b" undecided
    seg.feed(">there</b>", 0.0)
    assert seg.pending_chars == len("Hi there")


def test_end_returns_the_rest_and_closes() -> None:
    seg = Segmenter(NO_TIMER)
    seg.feed("Almost done", 0.0)
    assert texts(seg.end(0.0)) == ["Almost done"]
    assert seg.end(0.0) == [] and seg.flush(0.0) == [] and seg.poll(9.0) == []
    assert seg.deadline() is None
    with pytest.raises(ValueError):
        seg.feed("more", 0.0)


def test_config_is_frozen_and_validated() -> None:
    cfg = SegmenterConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_chars = 3  # type: ignore[misc]
    for bad in ({"max_chars": 0}, {"first_max_words": -1}, {"first_wait_s": -1.0},
                {"cjk_chars_per_word": 0}):
        with pytest.raises(ValueError):
            SegmenterConfig(**bad)


def test_extra_abbreviations() -> None:
    assert later("It weighs abt. Ten kilos.") == ["It weighs abt.", "Ten kilos."]
    cfg = dataclasses.replace(NO_TIMER, extra_abbreviations=("Abt.",))
    assert later("It weighs abt. Ten kilos.", cfg) == ["It weighs abt. Ten kilos."]


# --- the benchmark corpus ---------------------------------------------------------------------

EXPECTED = {
    "doctor": ["Well,", "Dr. Smith said the results are fine, i.e. nothing to worry about.",
               "You can see her at 10:30 a.m. on Monday, e.g. before work."],
    "money": ["Okay,", "the total comes to $1,234.56, which includes 8.5% tax.",
              "Your card ending in 4321 will be charged on 12/05/2026."],
    "markdown": ["Here are the steps:", "Open the settings menu.", "Choose Network, then Wi-Fi.",
                 "Tap Forget and reconnect."],
    "quote": ["He said,", '"Call me at 555-0142 after 6 p.m."',
              "Then he hung up, without saying goodbye."],
    "zh-greet": ["你好，", "我可以帮你。", "明天天气晴朗，最高气温二十四度。"],
}


@pytest.mark.parametrize("uid", sorted(EXPECTED))
def test_corpus_replies_streamed_as_llm_tokens(uid: str) -> None:
    text = next(u.text for u in CORPUS if u.id == uid)
    assert texts(run(text, SegmenterConfig(), by="token")) == EXPECTED[uid]
