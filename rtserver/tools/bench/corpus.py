"""The benchmark's text corpus and how it is cut into LLM-like fragments (pure).

Replies are chatbot-shaped: a short first clause, then sentences. The hard
cases are the ones a streaming segmenter and normalizer get wrong: numbers
and money, abbreviations with dots, times, markdown an LLM emits, URLs,
emoji, a long sentence without a comma, and CJK (tagged by language, so an
English voice is not asked to speak Chinese unless ``--lang all``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Utterance:
    id: str
    text: str
    lang: str = "en"
    tags: tuple[str, ...] = ()


CORPUS: tuple[Utterance, ...] = (
    Utterance("greet", "Sure, I can help with that. What would you like to know first?",
              tags=("plain",)),
    Utterance("weather", "Good question! Tomorrow looks sunny, with a high of 24 degrees and "
              "a light breeze in the afternoon.", tags=("plain", "numbers")),
    Utterance("money", "Okay, the total comes to $1,234.56, which includes 8.5% tax. "
              "Your card ending in 4321 will be charged on 12/05/2026.",
              tags=("numbers", "money", "dates")),
    Utterance("doctor", "Well, Dr. Smith said the results are fine, i.e. nothing to worry "
              "about. You can see her at 10:30 a.m. on Monday, e.g. before work.",
              tags=("abbreviations", "times")),
    Utterance("markdown", "Here are the steps:\n\n1. **Open** the settings menu.\n"
              "2. Choose `Network`, then *Wi-Fi*.\n3. Tap [Forget](https://example.com/help) "
              "and reconnect.", tags=("markdown", "lists", "urls")),
    Utterance("heading", "## Summary\n\nIn short, the plan works. The second option costs "
              "about 3.5 times more, so I would pick the first one.",
              tags=("markdown", "numbers")),
    Utterance("long", "I looked through everything you sent me this morning and the main "
              "thing that stands out is that the numbers for the third quarter do not match "
              "the totals in the summary table which probably means one of the formulas "
              "refers to the wrong range of cells.", tags=("long",)),
    Utterance("version", "Yes. Version 2.10.3 fixed it; before that, U.S. users on iOS 17 "
              "saw the error about 1 in 20 times.", tags=("numbers", "abbreviations")),
    Utterance("emoji", "Great job on the launch 🎉! The team shipped 3 features in 2 weeks, "
              "and the feedback so far is very positive 😊.", tags=("emoji", "numbers")),
    Utterance("quote", "He said, \"Call me at 555-0142 after 6 p.m.\" Then he hung up, "
              "without saying goodbye.", tags=("quotes", "numbers", "abbreviations")),
    Utterance("short", "No problem.", tags=("plain", "short")),
    Utterance("recipe", "First, preheat the oven to 180°C. Then mix 250 g of flour with "
              "2 eggs, and bake for 25–30 minutes.", tags=("numbers", "units")),
    Utterance("zh-greet", "你好，我可以帮你。明天天气晴朗，最高气温二十四度。", lang="zh",
              tags=("cjk",)),
    Utterance("ja-greet", "こんにちは、お手伝いします。明日は晴れです。", lang="ja",
              tags=("cjk",)),
)


def select(lang: str = "en", tags: Sequence[str] = ()) -> tuple[Utterance, ...]:
    """Utterances in ``lang`` (``"all"`` for every language) carrying any of ``tags``."""
    chosen = tuple(u for u in CORPUS if (lang == "all" or u.lang == lang)
                   and (not tags or set(tags) & set(u.tags)))
    if not chosen:
        raise ValueError(f"no utterance for lang={lang!r} tags={list(tags)!r}")
    return chosen


# --- fragments -------------------------------------------------------------------------

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef\u3000-\u303f"
# Close to GPT-style pre-tokenization: a leading space sticks to the next word,
# digits come in runs of at most 3, punctuation runs are their own tokens, CJK
# characters one by one.
_TOKEN_RE = re.compile(
    rf"[{_CJK}]| ?[^\W\d_{_CJK}]+| ?\d{{1,3}}| ?[^\w\s{_CJK}]+|\s+(?!\S)|\s+")
_MAX_PIECE = 6  # long words are cut like BPE would, into pieces of <= 6 characters


def llm_tokens(text: str) -> list[str]:
    """Cut ``text`` into LLM-like tokens; they join back to ``text`` exactly."""
    out: list[str] = []
    for m in _TOKEN_RE.finditer(text):
        tok = m.group(0)
        while len(tok) > _MAX_PIECE and tok.strip().isalpha():
            out.append(tok[:_MAX_PIECE])
            tok = tok[_MAX_PIECE:]
        out.append(tok)
    return out


def words(text: str) -> list[str]:
    """Cut ``text`` into words, each carrying the white space before it."""
    return re.findall(r"\s*\S+|\s+$", text)


def fragments(text: str, mode: str) -> list[str]:
    """``mode``: ``whole`` (one fragment), ``word``, or ``token`` (LLM-like)."""
    if mode == "whole":
        return [text]
    if mode == "word":
        return words(text)
    if mode == "token":
        return llm_tokens(text)
    raise ValueError(f"unknown fragment mode '{mode}'")


def token_offsets(count: int, rate_per_s: float, jitter: float, rng: random.Random
                  ) -> list[float]:
    """Send times (seconds from the first fragment) of ``count`` fragments.

    Gaps are gamma-distributed with mean ``1/rate`` and coefficient of
    variation ``jitter`` (0 = a metronome), a common model of decode-step
    time; the first fragment goes at 0.
    """
    if count <= 0:
        return []
    if rate_per_s <= 0:
        return [0.0] * count
    mean = 1.0 / rate_per_s
    offsets = [0.0]
    for _ in range(count - 1):
        if jitter <= 0:
            gap = mean
        else:
            shape = 1.0 / (jitter * jitter)
            gap = rng.gammavariate(shape, mean / shape)
        offsets.append(offsets[-1] + gap)
    return offsets
