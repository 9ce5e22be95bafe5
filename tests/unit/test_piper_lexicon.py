"""Piper speaks a lexicon's IPA in place of espeak's reading (issue 29): the
phoneme ids its model gets, with the embedded voice (``rtserver[piper]``)."""

from __future__ import annotations

import pytest

from rtserver.text.lexicon import Entry, Lexicon, PhonemeSpan

pytest.importorskip("piper")


def test_a_phoneme_entry_replaces_espeaks_ids_for_that_word_only() -> None:
    from rtserver.voices.piper.synthesis_pool import SynthesisPool
    from rtserver.voices.piper.voice import PiperVoice, embedded_voice_files, with_phonemes

    pool = SynthesisPool(1, first_lane=0)
    try:
        voice = PiperVoice(embedded_voice_files(), pool)
        said = Lexicon([Entry("tomato", phoneme="təmˈɑːtoʊ")], phonemes=True).apply(
            "I like tomato soup.")
        assert said.phonemes == (PhonemeSpan(7, 13, "təmˈɑːtoʊ"),)
        plain = voice.phoneme_ids(said.text)
        changed = voice.phoneme_ids(said.text, said.phonemes)
        assert len(plain) == len(changed) == 1  # still one sentence
        id_map = voice._piper.config.phoneme_id_map

        def ids(symbols: str) -> list[int]:
            return [i for s in symbols for i in (id_map[s][0], 0)]

        espeak = ids("təmˈeɪɾoʊ")  # espeak's American "tomato"
        ours = ids("təmˈɑːtoʊ")

        def find(seq: list[int], part: list[int]) -> int:
            return next((i for i in range(len(seq)) if seq[i:i + len(part)] == part), -1)

        at = find(plain[0], espeak)
        assert at > 0 and find(changed[0], ours) == at
        # the words around it are espeak's, unchanged
        assert changed[0][:at] == plain[0][:at]
        assert changed[0][at + len(ours):] == plain[0][at + len(espeak):]
        assert with_phonemes("I like tomato soup.", said.phonemes) == \
            "I like [[təmˈɑːtoʊ]] soup."
        assert "[[" not in with_phonemes("no spans", ())
    finally:
        pool.close()
