"""Opus frames from PCM through libopus (``opuslib``), sans-I/O.

One ``OpusFramer`` per context: fixed frames of ``frame_ms``, the remainder
carried across pushes, and on ``finish`` the encoder's lookahead fed as
silence so the decoder, after dropping ``pre_skip``, gets every input sample
back (RFC 7845, section 4.2).

Default settings, chosen by measuring libopus on a 2-core x86 machine with
Piper speech resampled to 48 kHz, 20 ms frames:

- application ``audio`` with signal ``voice``: SILK/hybrid mode, tuned for
  speech. ``voip`` adds pre-processing for microphone speech (high-pass,
  formant emphasis) that synthetic speech does not need; it cost waveform
  fidelity (SNR 7.5 dB vs 11.6 dB on the same speech) for the same bytes.
- 32 kbit/s VBR (4 kB/s a stream): with signal ``voice`` libopus codes
  fullband speech in hybrid mode (SILK below 8 kHz, CELT above) up to about
  64 kbit/s; 32 kbit/s is the usual rate for fullband speech in that mode.
  Unconstrained VBR: TCP has no per-packet bitrate ceiling to honour.
- complexity 2: Piper speech at 48 kHz costs 5.2 ms of CPU per second of
  audio vs 7.3 at 5 and 13.9 at 10, for wide-band PESQ 4.40 vs 4.49 and 4.54
  (1 and 0: 3.9 and 3.3 ms, PESQ 4.25; ``python -m rtserver.tools.bench.opus_cost``,
  2-core x86). At 20 Piper streams on two cores encoding was 8 % of the
  server's CPU at complexity 5; the 0.09 PESQ it buys is not worth that there.
  Encoding at 24 kHz costs about the same as at 48 kHz (4.98 ms at 2).
- in-band FEC off: it re-sends a coarse copy of the previous frame for
  decoders that lost a packet; over a WebSocket (TCP) no packet is ever lost,
  so it would only spend bits.
- DTX off (libopus default): every frame carries its audio, so seq maps
  to play time as PROTOCOL.md says.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import opuslib
import opuslib.api
import opuslib.api.ctl
import opuslib.api.encoder

from rtserver.audio.framer import SAMPLE_RATES, BlockFramer
from rtserver.audio.pcm import FloatArray

OPUS_RATE = 48000  # RFC 7845: pre-skip is counted in samples at 48 kHz
# RFC 6716 section 3.4: at most 1275 bytes per Opus frame, up to 3 in a 60 ms
# packet; libopus recommends a 4000-byte output buffer.
MAX_PACKET_BYTES = 4000

_APPLICATIONS = {
    "audio": opuslib.APPLICATION_AUDIO,
    "voip": opuslib.APPLICATION_VOIP,
    "restricted_lowdelay": opuslib.APPLICATION_RESTRICTED_LOWDELAY,
}
_SIGNALS = {"auto": opuslib.AUTO, "voice": opuslib.SIGNAL_VOICE, "music": opuslib.SIGNAL_MUSIC}


@dataclass(frozen=True, slots=True)
class OpusConfig:
    """Encoder settings for every Opus context (see the module docstring)."""

    bitrate: int = 32000  # bit/s
    complexity: int = 2  # 0 (cheapest) .. 10
    application: str = "audio"  # "audio" | "voip" | "restricted_lowdelay"
    signal: str = "voice"  # "voice" | "music" | "auto"
    vbr: bool = True
    inband_fec: bool = False

    def __post_init__(self) -> None:
        # RFC 6716 section 2.1.1: Opus spans 6 to 510 kbit/s.
        if not 6000 <= self.bitrate <= 510000:
            raise ValueError(f"opus bitrate {self.bitrate} is outside 6000..510000 bit/s")
        if not 0 <= self.complexity <= 10:
            raise ValueError(f"opus complexity {self.complexity} is outside 0..10")
        if self.application not in _APPLICATIONS:
            raise ValueError(f"opus application must be one of {sorted(_APPLICATIONS)}")
        if self.signal not in _SIGNALS:
            raise ValueError(f"opus signal must be one of {sorted(_SIGNALS)}")


class OpusFramer(BlockFramer):
    """Mono Opus packets, one per ``frame_ms`` frame, at ``sample_rate``.

    ``sample_rate`` is one of 8000/12000/16000/24000/48000 and ``frame_ms`` one
    of 10/20/40/60. ``bitrate``/``complexity`` override ``config``.
    ``lookahead``: the encoder's delay in samples at ``sample_rate``
    (OPUS_GET_LOOKAHEAD); ``pre_skip``: the same at 48 kHz. For ``n``
    samples pushed, ``push`` + ``finish`` emit ``ceil((n + lookahead) /
    frame_samples)`` packets.
    """

    def __init__(self, sample_rate: int, frame_ms: int, *, bitrate: int | None = None,
                 complexity: int | None = None, config: OpusConfig | None = None) -> None:
        if sample_rate not in SAMPLE_RATES:
            raise ValueError(f"opus sample_rate must be one of {SAMPLE_RATES}, not {sample_rate}")
        super().__init__(sample_rate, frame_ms)
        cfg = config or OpusConfig()
        self._encoder = opuslib.Encoder(sample_rate, 1, _APPLICATIONS[cfg.application])
        state = self._encoder.encoder_state
        ctl, enc = opuslib.api.ctl, opuslib.api.encoder
        enc.encoder_ctl(state, ctl.set_bitrate, cfg.bitrate if bitrate is None else bitrate)
        enc.encoder_ctl(state, ctl.set_complexity,
                        cfg.complexity if complexity is None else complexity)
        enc.encoder_ctl(state, ctl.set_signal, _SIGNALS[cfg.signal])
        enc.encoder_ctl(state, ctl.set_vbr, int(cfg.vbr))
        enc.encoder_ctl(state, ctl.set_inband_fec, int(cfg.inband_fec))
        self._lookahead = int(enc.encoder_ctl(state, ctl.get_lookahead))
        self._tail_samples = self._lookahead
        self._packet = (ctypes.c_char * MAX_PACKET_BYTES)()

    @property
    def lookahead(self) -> int:
        return self._lookahead

    @property
    def pre_skip(self) -> int:
        return self._lookahead * OPUS_RATE // self.sample_rate

    def _encode(self, frame: FloatArray) -> bytes:
        frame = np.ascontiguousarray(frame, dtype=np.float32)
        pcm = ctypes.cast(frame.ctypes.data, opuslib.api.c_float_pointer)
        n = opuslib.api.encoder.libopus_encode_float(
            self._encoder.encoder_state, pcm, len(frame), self._packet, MAX_PACKET_BYTES)
        if n < 0:
            raise opuslib.OpusError(n)
        return ctypes.string_at(self._packet, n)


__all__ = ["MAX_PACKET_BYTES", "OPUS_RATE", "OpusConfig", "OpusFramer"]
