"""Orpheus token layout: ids, prompt, token -> code per slot, frame assembly, budget."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtserver.voices.orpheus import codes as ot
from rtserver.voices.orpheus.voice import AUDIO_MASK


def test_ids_match_upstream() -> None:
    # orpheus-speech 0.1.0 engine_class.py / decoder.py, and the data-prep notebook.
    assert ot.START_OF_HUMAN == 128259
    assert (ot.END_OF_TEXT, ot.END_OF_HUMAN, ot.START_OF_AI, ot.START_OF_SPEECH) == (
        128009, 128260, 128261, 128257)
    assert ot.END_OF_SPEECH == 128258
    assert ot.END_OF_AI == 128262
    assert ot.AUDIO_TOKENS_START == 128266  # <custom_token_10>
    assert ot.VOCAB_SIZE == 156940
    assert ot.slot_range(6) == (128266 + 6 * 4096, 128266 + 7 * 4096)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tokenizers import Tokenizer

    from rtserver.voices.orpheus.layout import write_tiny_orpheus

    d = write_tiny_orpheus(Path(tmp_path_factory.mktemp("orpheus")), shape="tiny")
    return Tokenizer.from_file(str(d / "tokenizer.json"))


def test_tiny_tokenizer_has_orpheus_specials(tokenizer: Any) -> None:
    assert tokenizer.token_to_id("<custom_token_3>") == ot.START_OF_HUMAN
    assert tokenizer.token_to_id("<custom_token_10>") == ot.AUDIO_TOKENS_START
    assert tokenizer.token_to_id("<|eot_id|>") == ot.END_OF_TEXT
    assert tokenizer.token_to_id("<|audio|>") == ot.AUDIO_PLACEHOLDER
    assert tokenizer.get_vocab_size() == ot.VOCAB_SIZE


def test_prompt_layout(tokenizer: Any) -> None:
    text_ids = tokenizer.encode("tara: Hello there.", add_special_tokens=True).ids
    prompt = ot.build_prompt(text_ids)
    assert prompt[:2] == [ot.START_OF_HUMAN, ot.BEGIN_OF_TEXT]
    assert prompt[-4:] == [128009, 128260, 128261, 128257]
    assert tokenizer.decode(prompt[2:-4]) == "tara: Hello there."


def _frame_tokens(codes_in_slot_order: list[int]) -> list[int]:
    return [ot.AUDIO_TOKENS_START + slot * 4096 + c for slot, c in enumerate(codes_in_slot_order)]


def test_frame_regrouped_like_upstream_decoder() -> None:
    # upstream convert_to_audio: level 0 = [f0], level 1 = [f1, f4], level 2 = [f2, f3, f5, f6]
    f = [10, 11, 12, 13, 14, 15, 16]
    out = ot.FrameAssembler().feed(_frame_tokens(f))
    assert out.tolist() == [[10, 11, 14, 12, 13, 15, 16]]


def test_code_bounds_per_slot() -> None:
    for slot in range(7):
        lo, hi = ot.slot_range(slot)
        assert ot.token_to_code(lo, slot) == 0
        assert ot.token_to_code(hi - 1, 7 + slot) == 4095
        with pytest.raises(ot.MalformedStream):
            ot.token_to_code(hi, slot)
        with pytest.raises(ot.MalformedStream):
            ot.token_to_code(lo - 1, slot)


@given(codes=st.lists(st.lists(st.integers(0, 4095), min_size=7, max_size=7), max_size=12),
       cuts=st.lists(st.integers(0, 100), max_size=8))
def test_any_split_of_the_stream_gives_the_same_frames(codes: list[list[int]],
                                                       cuts: list[int]) -> None:
    frames = np.asarray(codes, dtype=np.int64).reshape(-1, 7)
    tokens = ot.frames_to_tokens(frames)
    bounds = sorted({0, len(tokens), *[c for c in cuts if c < len(tokens)]})
    asm = ot.FrameAssembler()
    got = [asm.feed(tokens[a:b]) for a, b in itertools.pairwise(bounds)]
    out = np.concatenate([np.zeros((0, 7), np.int64), *got])
    assert np.array_equal(out, frames)
    assert asm.frames == len(frames) and asm.finish() == 0


def test_end_of_speech() -> None:
    frame = _frame_tokens([1, 2, 3, 4, 5, 6, 7])
    asm = ot.FrameAssembler()
    assert len(asm.feed([*frame, ot.END_OF_SPEECH])) == 1 and asm.ended
    with pytest.raises(ot.MalformedStream):
        asm.feed(frame[:1])
    # end inside a frame: the partial frame is dropped, not decoded
    asm = ot.FrameAssembler()
    assert len(asm.feed([*frame, *frame[:3], ot.END_OF_SPEECH])) == 1
    assert asm.dropped_tokens == 3


def test_wrong_slot_is_malformed() -> None:
    frame = _frame_tokens([0] * 7)
    with pytest.raises(ot.MalformedStream):
        ot.FrameAssembler().feed([frame[0], frame[2]])  # slot-2 token at position 1
    with pytest.raises(ot.MalformedStream):
        ot.FrameAssembler().feed([ot.BEGIN_OF_TEXT])


def test_reslot_takes_the_code_for_the_slot_the_position_calls_for() -> None:
    # slot 2's code 5 at position 1 (slot 1) becomes slot 1's code 5
    tokens = _frame_tokens([1, 2, 3, 4, 5, 6, 7])
    tokens[1] = ot.code_to_token(5, 2)
    asm = ot.FrameAssembler(reslot=True)
    [frame] = asm.feed(tokens).tolist()
    assert frame == [1, 5, 5, 3, 4, 6, 7]  # neutral order: slot 1 is the second code
    assert asm.reslotted_tokens == 1
    with pytest.raises(ot.MalformedStream, match="not an audio token"):
        ot.FrameAssembler(reslot=True).feed([ot.BEGIN_OF_TEXT])  # text is never audio


@given(position=st.integers(0, 10_000), token=st.integers(0, ot.VOCAB_SIZE - 1))
def test_engine_mask_allows_exactly_what_the_assembler_accepts(position: int, token: int
                                                               ) -> None:
    if token in ot.STOP_TOKEN_IDS:
        expected = position % 7 == 0
    else:
        try:
            ot.token_to_code(token, position)
            expected = True
        except ot.MalformedStream:
            expected = False
    assert AUDIO_MASK.allows(position, token) == expected


def test_mask_union_is_audio_and_end_tokens() -> None:
    assert AUDIO_MASK.allowed_ids() == sorted([*ot.audio_token_ids(), *ot.STOP_TOKEN_IDS])


def test_budget_from_text_length() -> None:
    b = ot.TokenBudget()
    short, long = b.max_tokens("Hi."), b.max_tokens("Hello there, how are you doing today?")
    assert short < long
    assert short % 7 == 1 and long % 7 == 1  # whole frames plus the end token
    # ~0.8 frames/char is typical speech: the budget must exceed it with room
    text = "x" * 200
    assert b.max_tokens(text) > 0.8 * len(text) * 7 * 1.5
    assert b.max_tokens("x" * 100_000) == b.max_frames * 7 + 1
    assert b.max_tokens(text, limit=50) == 50


def test_a_delta_that_completes_no_frame_gives_an_empty_read_only_array() -> None:
    frame = _frame_tokens([1, 2, 3, 4, 5, 6, 7])
    asm = ot.FrameAssembler()
    partial = [asm.feed([t]) for t in frame[:6]]
    assert all(p.shape == (0, 7) and p.dtype == np.int64 for p in partial)
    assert not any(p.flags.writeable for p in partial)  # one shared array: nobody changes it
    done = asm.feed(frame[6:])  # the frame's last token: a frame of its own, writable
    assert done.tolist() == [[1, 2, 5, 3, 4, 6, 7]] and done.flags.writeable
