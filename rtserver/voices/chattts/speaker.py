"""ChatTTS speaker strings and speaker statistics (numpy, lzma, base16384; torch
only to draw a seeded speaker as upstream does).

A speaker is a float16 vector of the GPT's hidden size (768). Upstream shares
it as a string: base16384 text of the raw-LZMA2-compressed float16 bytes
(ChatTTS ``Speaker._encode``/``_decode``). The model's speaker statistics are
float16 ``[std; mean]`` of twice that size, stored as base16384 text without
compression (upstream ``config.spk_stat``) or, in the older layout, as a torch
tensor ``asset/spk_stat.pt``; a seeded sample is ``mean + std * N(0, 1)``
drawn as upstream draws it after ``torch.manual_seed(seed)``.

The vector goes into the ``[spk_emb]`` prompt position L2-normalised
(upstream ``Speaker.apply``); :func:`normalised` does that.
"""

from __future__ import annotations

import lzma
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pybase16384 as b14

from rtserver.errors import UnknownVoice

# ChatTTS Speaker._encode: raw LZMA2, preset 9 | extreme.
_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]

F32 = npt.NDArray[np.float32]


class BadSpeaker(UnknownVoice):
    """A speaker string that does not decode to a speaker vector (``unknown_voice``)."""


def encode_speaker(vector: npt.NDArray[np.floating]) -> str:
    """The upstream speaker string of ``vector`` (stored as float16)."""
    raw = np.asarray(vector, dtype=np.float16).tobytes()
    return str(b14.encode_to_string(lzma.compress(raw, format=lzma.FORMAT_RAW,
                                                  filters=_FILTERS)))


def decode_speaker(text: str, dim: int) -> F32:
    """The vector of an upstream speaker string; ``BadSpeaker`` says why not."""
    text = text.strip()
    if not text:
        raise BadSpeaker("empty speaker string")
    try:
        packed = b14.decode_from_string(text)
    except Exception as exc:  # the C decoder raises assorted types
        raise BadSpeaker(f"speaker string is not base16384: {exc}") from None
    try:
        # bounded: a string that inflates past one vector is refused, not expanded
        dec = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_FILTERS)
        raw = dec.decompress(packed, max_length=2 * dim + 1)
    except lzma.LZMAError as exc:
        raise BadSpeaker(f"speaker string does not decompress: {exc}") from None
    if len(raw) > 2 * dim:
        raise BadSpeaker(f"speaker string holds more than the {dim} values the model needs")
    if len(raw) != 2 * dim:
        raise BadSpeaker(f"speaker string holds {len(raw) // 2} values, the model "
                         f"needs {dim}")
    vec = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
    if not np.isfinite(vec).all():
        raise BadSpeaker("speaker string holds non-finite values")
    if not np.any(vec):
        raise BadSpeaker("speaker vector is all zeros")
    return vec


def normalised(vector: F32) -> F32:
    """L2-normalised as upstream ``Speaker.apply``: ``F.normalize(p=2, eps=1e-12)``
    of the float16 vector its speaker string decodes to, in float16 (float32
    arithmetic here gives other values by up to 2e-4, which moved the GPT's
    logits by 1e-3: tests/parity)."""
    import torch
    import torch.nn.functional as F

    v = torch.from_numpy(np.asarray(vector, dtype=np.float16).copy())
    return F.normalize(v, p=2.0, dim=0, eps=1e-12).float().numpy()


@dataclass(frozen=True)
class SpeakerStats:
    """Per-dimension ``std`` and ``mean`` of the model's speaker vectors."""

    std: F32
    mean: F32

    @property
    def dim(self) -> int:
        return int(self.std.shape[0])

    @classmethod
    def from_array(cls, stat: npt.NDArray[np.floating], where: str) -> SpeakerStats:
        arr = np.asarray(stat, dtype=np.float32).reshape(-1)
        if arr.size % 2 or arr.size == 0:
            raise ValueError(f"{where}: speaker statistics need [std; mean], "
                             f"got {arr.size} values")
        std, mean = np.split(arr, 2)
        return cls(std=std.copy(), mean=mean.copy())

    @classmethod
    def from_string(cls, text: str, where: str) -> SpeakerStats:
        """Upstream ``config.spk_stat``: base16384 of float16 ``[std; mean]``."""
        try:
            raw = b14.decode_from_string(text.strip())
        except Exception as exc:
            raise ValueError(f"{where}: not base16384: {exc}") from None
        return cls.from_array(np.frombuffer(raw, dtype=np.float16), where)

    def to_string(self) -> str:
        both = np.concatenate([self.std, self.mean]).astype(np.float16)
        return str(b14.encode_to_string(both.tobytes()))

    def sample(self, seed: int) -> F32:
        """Upstream's seeded speaker: ``torch.manual_seed(seed)`` then
        ``Speaker._sample_random`` on the CPU, i.e. ``torch.randn(dim,
        dtype=float16).mul_(std).add_(mean)`` in float16 from a CPU generator
        seeded with ``seed`` (the same values, bit for bit: tests/parity)."""
        import torch

        gen = torch.Generator().manual_seed(seed)
        std = torch.from_numpy(self.std.astype(np.float16))
        mean = torch.from_numpy(self.mean.astype(np.float16))
        vec = torch.randn(self.dim, dtype=torch.float16, generator=gen).mul_(std).add_(mean)
        return vec.float().numpy()
