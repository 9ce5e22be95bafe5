"""How a context's audio goes out: the rate it is framed at, its framer, and
a voice's planned chunks as the listener receives them (``HeardFormat``).
Pure: no asyncio."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rtserver.audio.framer import SAMPLE_RATES, Framer, PcmS16Framer
from rtserver.audio.opus import OPUS_RATE, OpusConfig, OpusFramer
from rtserver.audio.resample import output_after_chunks
from rtserver.pacing.hints import heard_chunks_ms
from rtserver.protocol.messages import Start
from rtserver.voices.base import VoiceInfo


def encode_rate(info: VoiceInfo, start: Start) -> int:
    """The rate audio is framed at. Opus: the voice's own rate when libopus
    takes it as input and it is not above the requested rate (SNAC's 24 kHz),
    else the requested rate. An Opus packet decodes at any rate, so the
    client still decodes at ``start.sample_rate``; skipping the resampler
    skips its hold-back too (libsoxr HQ, used before, returned nothing for
    the first 768 samples of 24 -> 48 kHz: that held the first frame back
    a whole chunk; ours holds 1.5 ms).
    """
    native = info.sample_rate
    if start.format == "opus" and native in SAMPLE_RATES and native <= start.sample_rate:
        return native
    return start.sample_rate


def make_framer(start: Start, rate: int, opus: OpusConfig) -> Framer:
    """The framer of a context asking for ``start``, framing at ``rate``
    (``encode_rate``)."""
    if start.format == "opus":
        return OpusFramer(rate, start.frame_ms, config=opus)
    return PcmS16Framer(start.sample_rate, start.frame_ms)


@dataclass(frozen=True, slots=True)
class HeardFormat:
    """What a listener receives of a voice's audio: resampled from
    ``in_rate`` to ``out_rate``, sent in whole frames of ``frame_samples``,
    and at the context's start less the decoder's ``pre_skip`` (samples at
    48 kHz, ``Framer.pre_skip``)."""

    in_rate: int
    out_rate: int
    frame_samples: int
    pre_skip: int

    @classmethod
    def of(cls, info: VoiceInfo, framer: Framer) -> HeardFormat:
        return cls(info.sample_rate, framer.sample_rate, framer.frame_samples, framer.pre_skip)

    def chunks_ms(self, plan_ms: Sequence[float], *, at_start: bool) -> list[float]:
        """The voice's planned chunks as the listener gets them: the resampler
        holds a little back (1.4 ms at 22050 -> 48000 Hz), the framer sends
        whole frames, and at the context's start the decoder drops its
        pre-skip: Piper's 109 ms first chunk is heard as 93.5 ms. Planning
        with the voice's own sizes (and libsoxr, which held back 6-37 ms)
        told a listener to start on a first chunk of which 53.5 ms had gone
        out, and it underran (CI, 2026-12-03)."""
        sizes = tuple(round(ms * self.in_rate / 1000.0) for ms in plan_ms)
        sent = output_after_chunks(self.in_rate, self.out_rate, sizes)
        skip_ms = 1000.0 * self.pre_skip / OPUS_RATE if at_start else 0.0
        return heard_chunks_ms(sent, self.out_rate, self.frame_samples, skip_ms)


__all__ = ["HeardFormat", "encode_rate", "make_framer"]
