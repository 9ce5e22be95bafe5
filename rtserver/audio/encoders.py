"""Streaming encoders for the HTTP speech API's response formats, sans-I/O.

``make_encoder(fmt, sample_rate)`` gives an encoder that takes mono float32
PCM in pieces (``push``) and returns the bytes of the file produced so far;
``finish`` returns the rest. Concatenated, the pieces are one valid file of
the format, written front to back (no seeking back to patch a header), so an
HTTP body can carry each piece as soon as it exists.

Compressed formats go through PyAV (FFmpeg's libavcodec and libavformat):

| format | container | codec | bitrate |
|---|---|---|---|
| ``mp3`` | MP3 | libmp3lame | 64 kbit/s |
| ``opus`` | Ogg | libopus | 32 kbit/s (as ``OpusConfig``) |
| ``aac`` | ADTS | FFmpeg's aac | 64 kbit/s |
| ``flac`` | FLAC | FFmpeg's flac | lossless |

64 kbit/s mono is the rate usually given for transparent-enough speech with
MP3 at 24 kHz and AAC-LC; Opus reaches it at half (see ``rtserver.audio.opus``).

``wav`` is a 44-byte RIFF header whose sizes say "unknown" (0xFFFFFFFF, as
streaming WAV writers do) followed by 16-bit PCM; ``pcm`` is bare 16-bit
little-endian PCM (OpenAI's ``pcm``: 24 kHz, s16le, mono).
"""

from __future__ import annotations

import struct
from fractions import Fraction
from typing import Protocol

import av
import av.filter
import numpy as np

from rtserver.audio.pcm import FloatArray

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
# format -> (FFmpeg muxer, encoder, bit/s or None for the codec's own choice)
_AV_FORMATS: dict[str, tuple[str, str, int | None]] = {
    "mp3": ("mp3", "libmp3lame", 64000),
    "opus": ("ogg", "libopus", 32000),
    "aac": ("adts", "aac", 64000),
    "flac": ("flac", "flac", None),
}
# libopus takes these input rates only (RFC 6716 section 2)
OPUS_INPUT_RATES = (8000, 12000, 16000, 24000, 48000)
# Ogg pages of one packet each: the muxer's default (page_duration 1 s) would
# hold a second of audio back before the first byte (FFmpeg oggenc.c).
_OGG_PAGE_US = "20000"


class StreamEncoder(Protocol):
    """Mono float32 PCM at ``sample_rate`` in, bytes of one file out."""

    fmt: str
    sample_rate: int

    def push(self, pcm: FloatArray) -> bytes:
        """Encode ``pcm``; return the bytes that became ready (may be empty)."""
        ...

    def finish(self) -> bytes:
        """Flush the encoder and close the file; return the remaining bytes."""
        ...


def _s16(pcm: FloatArray) -> bytes:
    clipped = np.clip(pcm, -1.0, 1.0) * 32767.0
    return np.round(clipped).astype("<i2").tobytes()


class PcmEncoder:
    """Bare s16le samples."""

    def __init__(self, sample_rate: int, fmt: str = "pcm") -> None:
        self.fmt = fmt
        self.sample_rate = sample_rate

    def push(self, pcm: FloatArray) -> bytes:
        return _s16(pcm)

    def finish(self) -> bytes:
        return b""


class WavEncoder(PcmEncoder):
    """A RIFF/WAVE header with unknown sizes, then s16le samples."""

    UNKNOWN = 0xFFFFFFFF

    def __init__(self, sample_rate: int) -> None:
        super().__init__(sample_rate, "wav")
        self._header_sent = False

    def header(self) -> bytes:
        # RIFF chunk, 'fmt ' chunk (PCM, 1 channel, 16 bits), 'data' chunk
        return (b"RIFF" + struct.pack("<I", self.UNKNOWN) + b"WAVE"
                + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, self.sample_rate,
                                        self.sample_rate * 2, 2, 16)
                + b"data" + struct.pack("<I", self.UNKNOWN))

    def push(self, pcm: FloatArray) -> bytes:
        head = b""
        if not self._header_sent:
            head, self._header_sent = self.header(), True
        return head + _s16(pcm)

    def finish(self) -> bytes:
        return b"" if self._header_sent else self.push(np.zeros(0, np.float32))


def _av_frame(pcm: FloatArray, sample_rate: int, pts: int) -> av.AudioFrame:
    """Mono float PCM as a PyAV frame stamped ``pts`` (in samples)."""
    samples = np.ascontiguousarray(pcm, dtype=np.float32).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(samples, format="flt", layout="mono")
    frame.sample_rate = sample_rate
    frame.time_base = Fraction(1, sample_rate)
    frame.pts = pts
    return frame


class _Collect:
    """The write-only, unseekable file PyAV muxes into: bytes are taken as
    they come, so the muxer writes every header up front."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


class AvEncoder:
    """A compressed format through PyAV: one muxer and one encoder per file."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        muxer, codec, bit_rate = _AV_FORMATS[fmt]
        if fmt == "opus" and sample_rate not in OPUS_INPUT_RATES:
            raise ValueError(f"opus takes {OPUS_INPUT_RATES} Hz, not {sample_rate}")
        self.fmt = fmt
        self.sample_rate = sample_rate
        self._out = _Collect()
        options = {"page_duration": _OGG_PAGE_US} if muxer == "ogg" else {}
        self._container = av.open(self._out, "w", format=muxer, options=options,
                                  container_options={"flush_packets": "1"})
        stream = self._container.add_stream(codec, rate=sample_rate, layout="mono")
        assert isinstance(stream, av.AudioStream)
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        self._stream = stream
        self._pts = 0
        self._closed = False

    def push(self, pcm: FloatArray) -> bytes:
        if len(pcm) == 0:
            return self._out.take()
        frame = _av_frame(pcm, self.sample_rate, self._pts)
        self._pts += frame.samples
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._out.take()

    def finish(self) -> bytes:
        if not self._closed:
            self._closed = True
            self._container.start_encoding()  # headers even for an empty file
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
        return self._out.take()


# FFmpeg's atempo takes factors 0.5..100 per instance (libavfilter af_atempo.c);
# slower speeds chain two.
ATEMPO_MIN = 0.5


class Tempo:
    """Pitch-preserving speed change of mono float32 PCM, streaming, through
    FFmpeg's ``atempo`` filter (WSOLA). ``speed`` 2.0 halves the duration."""

    def __init__(self, sample_rate: int, speed: float) -> None:
        if not 0.25 <= speed <= 4.0:
            raise ValueError(f"speed {speed} is outside 0.25..4.0")
        self.sample_rate = sample_rate
        self.speed = speed
        graph = av.filter.Graph()
        node = graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono",
                                 time_base=Fraction(1, sample_rate))
        factors = [speed] if speed >= ATEMPO_MIN else [ATEMPO_MIN, speed / ATEMPO_MIN]
        for factor in factors:
            nxt = graph.add("atempo", f"{factor:.6f}")
            node.link_to(nxt)
            node = nxt
        sink = graph.add("abuffersink")
        node.link_to(sink)
        graph.configure()
        self._graph = graph
        self._pts = 0

    def _pull(self) -> FloatArray:
        out: list[np.ndarray] = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            assert isinstance(frame, av.AudioFrame)
            out.append(frame.to_ndarray().reshape(-1))
        if not out:
            return np.zeros(0, np.float32)
        return np.concatenate(out).astype(np.float32, copy=False)

    def push(self, pcm: FloatArray) -> FloatArray:
        if len(pcm) == 0:
            return np.zeros(0, np.float32)
        frame = _av_frame(pcm, self.sample_rate, self._pts)
        self._pts += frame.samples
        self._graph.push(frame)
        return self._pull()

    def flush(self) -> FloatArray:
        self._graph.push(None)
        return self._pull()


def make_encoder(fmt: str, sample_rate: int) -> StreamEncoder:
    """An encoder for ``fmt`` (one of ``FORMATS``); ValueError for others."""
    if fmt == "pcm":
        return PcmEncoder(sample_rate)
    if fmt == "wav":
        return WavEncoder(sample_rate)
    if fmt in _AV_FORMATS:
        return AvEncoder(fmt, sample_rate)
    raise ValueError(f"unknown audio format {fmt!r}; one of {', '.join(FORMATS)}")


__all__ = ["CONTENT_TYPES", "FORMATS", "AvEncoder", "PcmEncoder", "StreamEncoder", "Tempo",
           "WavEncoder", "make_encoder"]
