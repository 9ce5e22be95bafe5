"""Word times from Piper's own phoneme durations (pure: no I/O).

Piper speaks a segment as espeak-ng's phonemes, sentence by sentence; the
front's duration predictor gives each phoneme id a whole number of latent
frames (VITS ``w_ceil``, ``graph.find_durations``), and the decoder turns
each frame into ``hop`` samples. So the time of every phoneme is exact; what
needs work is which phonemes belong to which word of the text:

- espeak-ng joins unstressed words to the next one (``ɪnðə`` for "in the",
  ``fɚðə`` for "for the") and spells numbers and symbols out as several
  words ("$1,234.56": ``dˈɑːlɚ wˈʌn θˈaʊzənd ...``), so the spaces of the
  phoneme string do not match the words of the text;
- each word is therefore phonemized alone as well (~0.04 ms a word), and
  the sentence's phonemes are aligned with the concatenation of the words'
  (``difflib.SequenceMatcher`` over the phonemes without stress marks,
  spaces and punctuation); a word's boundary falls where the alignment puts
  the boundary between its phonemes and the next word's. Differences
  between a word alone and in context (a reduced vowel, a linking ``ʲ``)
  fall inside the aligned spans.

A word starts at the first frame of its first phoneme and ends at the last
frame of its last phoneme, the pad id Piper puts after every phoneme
included (``piper.phoneme_ids.phonemes_to_ids``: BOS, PAD, then each
phoneme's ids followed by PAD, then EOS). The pause of a comma or the
silence at a sentence's end is not part of any word.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rtserver.audio.pcm import WordTime
from rtserver.text.words import text_words

# Not sounds of a word: spaces, stress marks, punctuation Piper keeps, espeak's
# language-switch parentheses.
_SKIP = frozenset(" \tˈˌ,.!?;:-'\"()¡¿…")
BOS, EOS, PAD = "^", "$", "_"


def _keys(phonemes: Sequence[str]) -> tuple[list[str], list[int]]:
    """The phonemes that are sounds, and the index of each in ``phonemes``."""
    keys: list[str] = []
    at: list[int] = []
    for i, p in enumerate(phonemes):
        if p not in _SKIP:
            keys.append(p)
            at.append(i)
    return keys, at


def align_words(phonemes: Sequence[str], word_phonemes: Sequence[Sequence[str]]
                ) -> list[tuple[int, int]]:
    """For each word, the ``[first, last + 1)`` indices into ``phonemes`` (a
    segment's phonemes, every sentence's in order) that it is spoken with,
    given each word's phonemes when phonemized alone. A word with no
    sounds (a lone dash) gets an empty range where it stands."""
    keys, at = _keys(phonemes)
    cum = [0]
    flat: list[str] = []
    for word in word_phonemes:
        flat.extend(_keys(word)[0])
        cum.append(len(flat))
    ops = difflib.SequenceMatcher(None, keys, flat, autojunk=False).get_opcodes()

    def to_keys(j: int) -> int:
        """The position in ``keys`` that position ``j`` of ``flat`` aligns with."""
        for tag, i1, i2, j1, j2 in ops:
            if j1 <= j < j2:
                if tag == "equal":
                    return i1 + (j - j1)
                return i1 + round((j - j1) * (i2 - i1) / (j2 - j1))  # replace, insert
        return len(keys)

    bounds = [to_keys(j) for j in cum]
    bounds[0] = 0  # sounds before the first word's (none, or a mismatch) are its own
    bounds[-1] = len(keys)  # and after the last word's, the last word's
    ranges: list[tuple[int, int]] = []
    for a, b in itertools.pairwise(bounds):
        b = max(a, b)
        if b > a:
            ranges.append((at[a], at[b - 1] + 1))
        else:
            pos = at[a] if a < len(at) else len(phonemes)
            ranges.append((pos, pos))
    return ranges


def phoneme_frames(phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]],
                   durations: npt.NDArray[np.float32]) -> npt.NDArray[np.int64]:
    """``[n + 1]`` frame boundaries of a sentence's ``n`` phonemes: phoneme
    ``i`` is spoken over frames ``[edges[i], edges[i + 1])``, its own ids and
    the pad after it (the layout of ``phonemes_to_ids``). ``durations``: the
    front's frames per id. Raises ``ValueError`` when they do not match."""
    d = np.rint(np.asarray(durations, dtype=np.float64).reshape(-1)).astype(np.int64)
    pad = len(id_map[PAD])
    pos = len(id_map[BOS]) + pad
    count = [0]
    for p in phonemes:
        n = len(id_map[p]) + pad if p in id_map else 0  # unknown: skipped by Piper
        count.append(n)
    ends = pos + np.cumsum(np.asarray(count, dtype=np.int64))
    if int(ends[-1]) + len(id_map[EOS]) != d.size:
        raise ValueError(f"{d.size} durations for {int(ends[-1]) + len(id_map[EOS])} ids")
    frames = np.concatenate([[0], np.cumsum(d)])
    return np.asarray(frames[ends], dtype=np.int64)


@dataclass(frozen=True, slots=True)
class WordPlan:
    """A segment's words and the phonemes each is spoken with."""

    spans: list[tuple[int, int]]  # each word's [start, end) in the segment's text
    ranges: list[tuple[int, int]]  # each word's phonemes, indices over every sentence
    # index of each sentence's first phoneme, then the number of phonemes
    sentence_starts: list[int]

    @classmethod
    def of(cls, text: str, sentences: Sequence[Sequence[str]],
           phonemize_word: Callable[[str], Sequence[str]]) -> WordPlan:
        """The plan of ``text``, spoken as ``sentences``; ``phonemize_word``
        gives one word's phonemes when phonemized alone."""
        spans = text_words(text)
        flat = [p for s in sentences for p in s]
        starts = [0]
        for s in sentences:
            starts.append(starts[-1] + len(s))
        ranges = align_words(flat, [phonemize_word(text[a:b]) for a, b in spans])
        return cls(spans, ranges, starts)

    def sentence_words(self, k: int, edges: npt.NDArray[np.int64], offset_s: float,
                       frame_s: float) -> tuple[WordTime, ...]:
        """The words that start in sentence ``k``, timed: ``edges`` from
        ``phoneme_frames`` for that sentence, ``offset_s`` when the sentence's
        audio starts in the segment, ``frame_s`` the audio of one frame. A
        word that runs on into the next sentence ends with this one."""
        first, after = self.sentence_starts[k], self.sentence_starts[k + 1]
        last = k + 2 == len(self.sentence_starts)
        n = len(edges) - 1
        words: list[WordTime] = []
        for (a, b), (c0, c1) in zip(self.ranges, self.spans, strict=True):
            if not (first <= a < after or (last and a == after)):
                continue
            start = a - first
            end = min(max(b - first, start), n)
            t0 = offset_s + float(edges[min(start, n)]) * frame_s
            t1 = offset_s + float(edges[end]) * frame_s if end > start else t0
            words.append(WordTime(c0, c1, round(t0, 4), round(t1, 4)))
        return tuple(words)


__all__ = ["WordPlan", "align_words", "phoneme_frames"]
