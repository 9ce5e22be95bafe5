"""The segmenter's starvation release: complete words go out when the listener
would otherwise run dry while a sentence is still arriving."""

from __future__ import annotations

from rtserver.text.segmenter import Segmenter


def test_release_words_speaks_complete_words_and_keeps_the_partial_one() -> None:
    seg = Segmenter()
    [first] = seg.feed("Sure! ", 0.0)
    assert first.text == "Sure!"
    assert seg.feed("The next sentence is still arr", 0.0) == []
    [released] = seg.release_words(0.1)
    assert released.text == "The next sentence is still" and released.index == 1
    assert [s.text for s in seg.end(0.2)] == ["arr"]


def test_release_words_with_no_complete_word_does_nothing() -> None:
    seg = Segmenter()
    seg.feed("Sure! ", 0.0)
    seg.feed("Incompre", 0.0)
    assert seg.release_words(0.1) == []
    assert [s.text for s in seg.end(0.2)] == ["Incompre"]
