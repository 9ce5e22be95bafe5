"""Orpheus token layout: prompt pieces, audio token -> SNAC code, frame assembly.

Pure: no asyncio, no torch. Every id here is checked against the upstream code:

- ``orpheus-speech`` 0.1.0 (PyPI, canopylabs' vLLM package),
  ``orpheus_tts/engine_class.py`` ``_format_prompt``: the prompt is
  ``[128259] + tokenizer(f"{voice}: {text}").input_ids + [128009, 128260, 128261, 128257]``;
  ``orpheus_tts/decoder.py`` ``turn_token_into_id``: a ``<custom_token_N>``
  at output index i carries code ``N - 10 - (i % 7) * 4096``; ``convert_to_audio``
  regroups a frame f[0..6] into SNAC levels ``[f0]``, ``[f1, f4]``, ``[f2, f3, f5, f6]``.
- The Orpheus fine-tuning data preparation (canopyai/Orpheus-TTS, ``create_input_ids``
  in the data-processing notebook): ``tokeniser_length = 128256``, start/end of speech
  = +1/+2, start/end of human = +3/+4, start/end of AI = +5/+6, pad = +7, audio tokens
  start at +10; each training sequence is
  ``[SOH] + encode(text, add_special_tokens=True) + [128009, EOH, SOA, SOS] + codes
  + [EOS, EOA]``.
- The Orpheus tokenizer adds ``<custom_token_0>`` .. ``<custom_token_28682>``
  (7 * 4096 + 10 + 1 tokens) at ids 128256.. and ``<|audio|>`` at 156939: vocab 156940.

The prompt is sent to vLLM as token ids, exactly the training layout above (the
upstream package decodes those ids to a string and lets vLLM re-tokenize it,
which only prepends one more ``<|begin_of_text|>``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# --- ids ---------------------------------------------------------------------

LLAMA3_VOCAB = 128256  # base vocabulary of the Llama 3 tokenizer ("tokeniser_length")
BEGIN_OF_TEXT = 128000  # <|begin_of_text|>
END_OF_TEXT = 128009  # <|eot_id|>, appended after the text tokens
START_OF_SPEECH = LLAMA3_VOCAB + 1  # 128257 <custom_token_1>
END_OF_SPEECH = LLAMA3_VOCAB + 2  # 128258 <custom_token_2>
START_OF_HUMAN = LLAMA3_VOCAB + 3  # 128259 <custom_token_3>
END_OF_HUMAN = LLAMA3_VOCAB + 4  # 128260 <custom_token_4>
START_OF_AI = LLAMA3_VOCAB + 5  # 128261 <custom_token_5>
END_OF_AI = LLAMA3_VOCAB + 6  # 128262 <custom_token_6>
PAD_TOKEN = LLAMA3_VOCAB + 7  # 128263 <custom_token_7>
AUDIO_TOKENS_START = LLAMA3_VOCAB + 10  # 128266 <custom_token_10>: code 0 of slot 0

CODEBOOK_SIZE = 4096  # SNAC 24 kHz codebook size
FRAME_TOKENS = 7  # tokens per frame: 1 + 2 + 4 codes of SNAC's three levels
AUDIO_TOKENS_END = AUDIO_TOKENS_START + FRAME_TOKENS * CODEBOOK_SIZE  # 156938, exclusive
NUM_CUSTOM_TOKENS = FRAME_TOKENS * CODEBOOK_SIZE + 10 + 1  # 28683 <custom_token_N>
AUDIO_PLACEHOLDER = LLAMA3_VOCAB + NUM_CUSTOM_TOKENS  # 156939 <|audio|>
VOCAB_SIZE = AUDIO_PLACEHOLDER + 1  # 156940, the checkpoint's vocab_size

# Generation ends at end of speech; end of AI follows it in training data.
STOP_TOKEN_IDS: tuple[int, ...] = (END_OF_SPEECH, END_OF_AI)

# SNAC 24 kHz (hubertsiuzdak/snac_24khz config): hop 512 samples, coarsest
# codebook stride 4, so one frame is 2048 samples = 85.3 ms at 24 kHz.
SAMPLE_RATE = 24_000
SAMPLES_PER_FRAME = 2048

# The speakers of the Orpheus English fine-tune (canopyai/Orpheus-TTS README,
# "in order of conversational realism").
VOICES: tuple[str, ...] = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")

# neutral[k] = frame_slots[NEUTRAL_FROM_SLOT[k]] where neutral order is
# [l0, l1_0, l1_1, l2_0, l2_1, l2_2, l2_3] (what the vocoder takes) and slot
# order is the order the model emits: l0, l1_0, l2_0, l2_1, l1_1, l2_2, l2_3.
NEUTRAL_FROM_SLOT: tuple[int, ...] = (0, 1, 4, 2, 3, 5, 6)

IntArray = npt.NDArray[np.int64]


class MalformedStream(ValueError):
    """The model emitted a token that is not valid at its position."""


def custom_token(n: int) -> int:
    """The id of ``<custom_token_n>``."""
    return LLAMA3_VOCAB + n


def slot_range(slot: int) -> tuple[int, int]:
    """Half-open id range ``[lo, hi)`` of the audio tokens of one frame slot."""
    if not 0 <= slot < FRAME_TOKENS:
        raise ValueError(f"slot {slot} is not in 0..6")
    lo = AUDIO_TOKENS_START + slot * CODEBOOK_SIZE
    return lo, lo + CODEBOOK_SIZE


def audio_token_ids() -> list[int]:
    """Every audio token id (all seven slots)."""
    return list(range(AUDIO_TOKENS_START, AUDIO_TOKENS_END))


def build_prompt(text_token_ids: Sequence[int]) -> list[int]:
    """The prompt for one segment, given ``tokenizer.encode(f"{voice}: {text}")``.

    ``text_token_ids`` comes from the checkpoint's own tokenizer with its special
    tokens (the leading ``<|begin_of_text|>``), as in training.
    """
    return [START_OF_HUMAN, *text_token_ids, END_OF_TEXT, END_OF_HUMAN,
            START_OF_AI, START_OF_SPEECH]


def voice_prefix(voice: str) -> str:
    """The text before the segment's own text: ``"tara: "``."""
    return f"{voice}: "


def slot_code(token_id: int, position: int) -> int | None:
    """The SNAC code ``token_id`` carries at output ``position`` (from 0), None
    when it is not an audio token of that position's slot (no exception: the
    reslot path of ``FrameAssembler`` takes it for most tokens of random weights)."""
    code = token_id - AUDIO_TOKENS_START - (position % FRAME_TOKENS) * CODEBOOK_SIZE
    return code if 0 <= code < CODEBOOK_SIZE else None


def token_to_code(token_id: int, position: int) -> int:
    """``slot_code``, raising ``MalformedStream`` where it gives None."""
    code = slot_code(token_id, position)
    if code is None:
        raise _not_of_slot(token_id, position)
    return code


def _not_of_slot(token_id: int, position: int) -> MalformedStream:
    return MalformedStream(f"token {token_id} at position {position} is not an audio token "
                           f"of slot {position % FRAME_TOKENS}")


def any_slot_code(token_id: int) -> int:
    """The code of an audio token of any slot (``token_id`` must be one)."""
    if not AUDIO_TOKENS_START <= token_id < AUDIO_TOKENS_END:
        raise MalformedStream(f"token {token_id} is not an audio token")
    return (token_id - AUDIO_TOKENS_START) % CODEBOOK_SIZE


def code_to_token(code: int, slot: int) -> int:
    """Inverse of ``token_to_code`` (used to build test streams)."""
    if not 0 <= code < CODEBOOK_SIZE:
        raise ValueError(f"code {code} out of range")
    return AUDIO_TOKENS_START + slot * CODEBOOK_SIZE + code


def frames_to_tokens(frames: IntArray) -> list[int]:
    """Neutral-order frames (n, 7) -> the token ids the model would emit."""
    out: list[int] = []
    for frame in np.asarray(frames).reshape(-1, FRAME_TOKENS):
        slots = [0] * FRAME_TOKENS
        for k, slot in enumerate(NEUTRAL_FROM_SLOT):
            slots[slot] = int(frame[k])
        out.extend(code_to_token(c, s) for s, c in enumerate(slots))
    return out


# What ``feed`` returns while no frame completed (most deltas: a token each at
# stream_interval 1), shared and read-only: a fresh np.zeros per token was 3 % of
# the GPU worker's main-thread samples at 256 streams
# (bench/results/h100-2026-12-07-s33/profiles.md, n2: codes.py:194, 43 of 1,391).
_NO_FRAMES = np.zeros((0, FRAME_TOKENS), dtype=np.int64)
_NO_FRAMES.setflags(write=False)


class FrameAssembler:
    """Turns the model's token stream into complete frames, in neutral order.

    ``feed`` takes each delta as it arrives and returns the frames it completed
    (shape (n, 7), maybe n = 0). A token that is not an audio token raises
    ``MalformedStream``; so does an audio token of the wrong slot, unless
    ``reslot``: then its code is taken for the slot its position calls for
    (one code off in one frame, a brief blemish rather than a failed reply)
    and counted in ``reslotted_tokens``. An end token at a frame boundary ends
    the stream; one inside a frame drops that partial frame (as upstream's
    decoder does) and is counted in ``dropped_tokens``.
    """

    __slots__ = ("_codes", "_end", "_reslot", "dropped_tokens", "ended", "frames", "position",
                 "reslotted_tokens")

    def __init__(self, end_token_ids: Sequence[int] = STOP_TOKEN_IDS, *,
                 reslot: bool = False) -> None:
        self._codes: list[int] = []
        self._end = frozenset(end_token_ids)
        self._reslot = reslot
        self.position = 0  # audio tokens accepted so far
        self.frames = 0  # frames returned so far
        self.ended = False
        self.dropped_tokens = 0
        self.reslotted_tokens = 0

    def feed(self, token_ids: Sequence[int]) -> IntArray:
        for token in token_ids:
            if self.ended:
                raise MalformedStream(f"token {token} after the end of speech")
            if token in self._end:
                self.ended = True
                self.dropped_tokens += len(self._codes) % FRAME_TOKENS
                del self._codes[len(self._codes) - len(self._codes) % FRAME_TOKENS:]
                continue
            # slot_code, not a raise and catch on the reslot path, which random weights
            # take for most tokens: 0.8-1.3 instead of 1.8-2.9 us a token fed alone
            # there, the same on the right slots (timeit, best of 5, on a noisy 2-core
            # host; any_slot_code was 28-31 of the GPU worker's ~1,250 main-thread
            # samples at 256 streams, h100-2026-12-08-s34)
            code = slot_code(token, self.position)
            if code is None:
                if not self._reslot:
                    raise _not_of_slot(token, self.position)
                code = any_slot_code(token)  # raises for a token that is not audio
                self.reslotted_tokens += 1
            self._codes.append(code)
            self.position += 1
        complete = len(self._codes) // FRAME_TOKENS
        if complete == 0:
            return _NO_FRAMES
        codes = self._codes
        # reordered in Python, one array made: 1.9 us a frame against 4.9 us for
        # np.asarray then numpy's fancy index (timeit, one frame; the GPU worker
        # feeds ~3,000 frames a second at 256 Orpheus streams)
        neutral = [codes[base + slot] for base in range(0, complete * FRAME_TOKENS, FRAME_TOKENS)
                   for slot in NEUTRAL_FROM_SLOT]
        del codes[:complete * FRAME_TOKENS]
        self.frames += complete
        return np.array(neutral, dtype=np.int64).reshape(complete, FRAME_TOKENS)

    def finish(self) -> int:
        """End of the stream: drop a partial frame; returns the tokens dropped."""
        dropped = len(self._codes)
        self.dropped_tokens += dropped
        self._codes.clear()
        return dropped


@dataclass(frozen=True, slots=True)
class TokenBudget:
    """How many tokens a segment may generate, from its text length.

    Rate: one frame is 85.3 ms (11.7 frames/s, 82 tokens/s, see SAMPLES_PER_FRAME);
    English read speech runs about 14-16 characters a second (150-170 words a
    minute at ~5.7 characters per word with its space), i.e. ~0.8 frames per
    character. ``frames_per_char`` allows half that speed (slow, expressive
    reading, tags like <laugh>), ``base_frames`` the leading and trailing
    silence. Upstream's default is a flat 1200 tokens (~14.6 s) for any text.
    """

    frames_per_char: float = 1.6
    base_frames: int = 24  # ~2 s
    max_frames: int = 700  # ~60 s, one long sentence at most

    def max_tokens(self, text: str, *, limit: int | None = None) -> int:
        """Frames * 7 + 1 (the end token), capped by ``limit`` (context room)."""
        frames = min(self.max_frames, math.ceil(self.base_frames + self.frames_per_char
                                                * len(text)))
        tokens = frames * FRAME_TOKENS + 1
        if limit is not None:
            tokens = min(tokens, limit)
        return max(tokens, 1)
