"""``Segmenter.tentative``: the first segment white space would cut, asked
without cutting (the speaker's speculative first segment).

Its contract, over generated LLM-like text and arbitrary fragmentation (the
timers never firing): whenever it names a segment, a space arriving next cuts
exactly that segment; asking never changes what the segmenter cuts; it names
nothing after the first segment.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_segmenter_properties import configs, cut, texts_strategy

from rtserver.text.segmenter import Segment, Segmenter, SegmenterConfig


def test_the_word_that_reaches_the_limit() -> None:
    seg = Segmenter(SegmenterConfig(first_max_words=3))
    assert seg.feed("One two", 0.0) == []
    assert seg.tentative() is None  # two words: a space would cut nothing
    assert seg.feed(" three", 0.0) == []
    guess = seg.tentative()
    assert guess == Segment(0, "One two three", (0, 13))
    assert seg.feed(" four", 0.0) == [guess]  # the space confirms it
    assert seg.tentative() is None  # after the first segment: nothing


def test_a_word_that_goes_on_is_another_segment() -> None:
    seg = Segmenter(SegmenterConfig(first_max_words=3))
    seg.feed("One two won", 0.0)
    guess = seg.tentative()
    assert guess is not None and guess.text == "One two won"
    assert seg.feed("der", 0.0) == []
    assert seg.tentative() == Segment(0, "One two wonder", (0, 14))
    assert seg.feed(" if", 0.0)[0].text == "One two wonder"


def test_clause_punctuation_and_what_waits() -> None:
    seg = Segmenter(SegmenterConfig(first_max_words=6))
    seg.feed("Sure thing,", 0.0)
    assert seg.tentative() == Segment(0, "Sure thing,", (0, 11))
    for held in ("Ask Dr.", "It was 3", "Call us at $3", "Wait etc."):
        s = Segmenter(SegmenterConfig(first_max_words=3))
        s.feed(held, 0.0)
        assert s.tentative() is None, held  # a title, a number, an abbreviation


def test_nothing_is_guessed_inside_a_link_destination() -> None:
    """``](url)`` drops its white space, so a space there cuts nothing: the
    words before it are not guessed until the destination is closed."""
    seg = Segmenter(SegmenterConfig(first_max_words=2))
    seg.feed("hello [link](", 0.0)
    assert seg.tentative() is None
    assert seg.feed(" ", 0.0) == []  # inside the destination: dropped
    seg.feed("http://x.com/a_(b))", 0.0)
    guess = seg.tentative()
    assert guess is not None and guess.text == "hello link"
    assert seg.feed(" ", 0.0) == [guess]


def test_cjk_characters_reaching_the_limit() -> None:
    seg = Segmenter(SegmenterConfig(first_max_words=2, cjk_chars_per_word=2))
    seg.feed("你好世", 0.0)
    assert seg.tentative() is None
    seg.feed("界", 0.0)
    guess = seg.tentative()
    assert guess is not None and guess.text == "你好世界"
    assert seg.feed("再", 0.0) == [guess]


def run(fragments: list[str], config: SegmenterConfig, ask: bool
        ) -> tuple[list[Segment], list[tuple[int, Segment]]]:
    """Segments of ``fragments``; with ``ask``, the guesses after each feed
    before the first segment, with the index of the fragment they follow."""
    seg = Segmenter(config)
    out: list[Segment] = []
    guesses: list[tuple[int, Segment]] = []
    for i, fragment in enumerate(fragments):
        out += seg.feed(fragment, 0.0)
        if ask and not out:
            guess = seg.tentative()
            if guess is not None:
                guesses.append((i, guess))
    out += seg.end(0.0)
    return out, guesses


@settings(max_examples=400, deadline=None)
@given(text=texts_strategy, cuts=st.lists(st.integers(0, 400), max_size=40), config=configs)
def test_a_guess_is_what_a_space_would_cut(text: str, cuts: list[int],
                                           config: SegmenterConfig) -> None:
    fragments = cut(text, cuts)
    plain, _ = run(fragments, config, ask=False)
    asked, guesses = run(fragments, config, ask=True)
    assert asked == plain  # asking changes nothing
    for i, guess in guesses:
        spaced, _ = run([*fragments[:i + 1], " "], config, ask=False)
        assert spaced[0] == guess, (fragments[:i + 1], guess, spaced[0])
