"""A text's words, as word timings count them (pure)."""

from __future__ import annotations

import re

_WORD = re.compile(r"\S+")


def text_words(text: str) -> list[tuple[int, int]]:
    """``[start, end)`` of each word of ``text``: its runs of non-space
    characters, punctuation included ("Sure," is one word)."""
    return [m.span() for m in _WORD.finditer(text)]


__all__ = ["text_words"]
