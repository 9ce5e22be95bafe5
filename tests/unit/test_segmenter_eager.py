"""The eager first cut: punctuation that ends the text so far goes out after
``first_punct_wait_s`` without waiting for the next token's space."""

from __future__ import annotations

import pytest

from rtserver.text.segmenter import Segmenter, SegmenterConfig

W = SegmenterConfig().first_punct_wait_s  # the eager wait


def feed_all(seg: Segmenter, parts: list[str], now: float = 0.0) -> list[str]:
    out: list[str] = []
    for p in parts:
        out += [s.text for s in seg.feed(p, now)]
    return out


@pytest.mark.parametrize("parts", [["Sure", " thing", ","], ["Really", "?"],
                                   ["Okay", ";"], ["Hello", " there", "."]])
def test_punctuation_at_the_end_fires_after_the_short_wait(parts: list[str]) -> None:
    seg = Segmenter()
    assert feed_all(seg, parts) == []
    assert seg.deadline() == pytest.approx(W)
    assert seg.poll(0.8 * W) == []
    [first] = seg.poll(W)
    assert first.text == "".join(parts).strip()
    assert first.index == 0


@pytest.mark.parametrize("text", ["It costs 1,", "See https:", "Dr.", "Call Mr.", "e.g.",
                                  "U.S.", "Wait..."])
def test_ambiguous_endings_are_not_cut_eagerly(text: str) -> None:
    seg = Segmenter()
    assert seg.feed(text, 0.0) == []
    at = seg.deadline()
    assert at is None or at >= 0.25  # only the stall timer, never the eager one


def test_more_text_within_the_wait_decides_as_usual() -> None:
    seg = Segmenter()
    assert seg.feed("Visit example.", 0.0) == []
    assert seg.feed("com today", 0.5 * W) == []  # the "." was not a sentence end
    assert (seg.deadline() or 0) > W
    assert [s.text for s in seg.end(0.1)] == ["Visit example.com today"]


def test_only_the_first_segment_is_eager() -> None:
    seg = Segmenter()
    assert [s.text for s in seg.feed("First, ", 0.0)] == ["First,"]
    assert seg.feed("then more,", 0.0) == []
    assert seg.deadline() is None


def test_off_when_wait_is_zero() -> None:
    seg = Segmenter(SegmenterConfig(first_punct_wait_s=0.0))
    seg.feed("Sure thing,", 0.0)
    assert seg.deadline() == pytest.approx(0.25)


def test_a_trailing_bang_is_cut_eagerly_unless_an_image_follows_in_time() -> None:
    # the normalizer holds a trailing "!" (it may open a markdown image "![");
    # the eager deadline decides it as text
    seg = Segmenter()
    assert feed_all(seg, ["Good", " question", "!"]) == []
    assert seg.deadline() == pytest.approx(W)
    [first] = seg.poll(W)
    assert first.text == "Good question!"
    # "![" within the wait: an image, whose alt text is spoken
    seg = Segmenter()
    assert feed_all(seg, ["Look", "!"]) == []
    seg.feed("[a cat](cat.png) here.", 0.5 * W)
    [text] = [s.text for s in seg.end(2 * W)]
    assert "!" not in text and text.endswith("a cat here.")


def test_an_emoji_before_the_bang_leaves_no_space() -> None:
    seg = Segmenter()
    assert feed_all(seg, ["Great", " launch", " \U0001F389!"]) == []
    [first] = seg.poll(W)
    assert first.text == "Great launch!"
