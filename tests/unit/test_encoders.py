"""Streaming encoders: each format decodes back (PyAV) to the audio that went in."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest

from rtserver.audio.encoders import FORMATS, WavEncoder, make_encoder

RATE = 24000
TONE_HZ = 440.0
# lossy codecs add their priming and padding: at most one frame and delay
# (MP3 1152 + 529 samples, AAC 1024 + 1024) at 24 kHz, well under 0.1 s
LOSSY_SLACK_S = 0.1


def tone(seconds: float, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.4 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)


def encode_in_pieces(fmt: str, pcm: np.ndarray) -> list[bytes]:
    enc = make_encoder(fmt, RATE)
    pieces: list[bytes] = []
    # uneven pieces, as a voice yields them
    for part in np.array_split(pcm, [333, 2400, 2401, 9000, 17000]):
        pieces.append(enc.push(part))
    pieces.append(enc.finish())
    return pieces


def decode(fmt: str, data: bytes) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0, RATE
    chunks: list[np.ndarray] = []
    rate = 0
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(audio=0):
            rate = frame.sample_rate
            chunks.append(frame.to_ndarray().astype(np.float32).reshape(-1)
                          / (32768.0 if frame.format.name.startswith("s16") else 1.0))
    return np.concatenate(chunks), rate


def peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


@pytest.mark.parametrize("fmt", FORMATS)
def test_streamed_pieces_decode_to_the_same_audio(fmt: str) -> None:
    pcm = tone(1.0)
    pieces = encode_in_pieces(fmt, pcm)
    # audio comes out while input still goes in, not only at finish
    assert sum(len(p) for p in pieces[:-1]) > 0.5 * sum(len(p) for p in pieces)
    out, rate = decode(fmt, b"".join(pieces))
    seconds = len(out) / rate
    if fmt in ("mp3", "aac"):
        assert 1.0 <= seconds <= 1.0 + LOSSY_SLACK_S
    else:
        assert seconds == pytest.approx(1.0, abs=0.001)
    assert peak_hz(out, rate) == pytest.approx(TONE_HZ, abs=3.0)
    if fmt in ("flac", "wav", "pcm"):  # lossless but for 16-bit rounding
        assert np.max(np.abs(out - pcm)) < 1e-4


def test_wav_header_says_unknown_length_and_pcm_layout() -> None:
    data = make_encoder("wav", 16000).push(np.zeros(10, np.float32))
    riff, size, wave = struct.unpack("<4sI4s", data[:12])
    assert (riff, wave, size) == (b"RIFF", b"WAVE", WavEncoder.UNKNOWN)
    fmt_tag, channels, rate, byte_rate, align, bits = struct.unpack("<HHIIHH", data[20:36])
    assert (fmt_tag, channels, rate, byte_rate, align, bits) == (1, 1, 16000, 32000, 2, 16)
    assert data[36:40] == b"data" and len(data) == 44 + 20


def test_an_empty_stream_is_still_a_file() -> None:
    for fmt in ("wav", "flac", "mp3"):
        data = make_encoder(fmt, RATE).finish()
        assert len(data) > 0


def test_clipping_and_unknown_formats() -> None:
    loud = np.array([2.0, -2.0], np.float32)
    assert np.frombuffer(make_encoder("pcm", RATE).push(loud), "<i2").tolist() == [32767, -32767]
    with pytest.raises(ValueError, match="unknown audio format"):
        make_encoder("ogg", RATE)
    with pytest.raises(ValueError, match="opus takes"):
        make_encoder("opus", 22050)


@pytest.mark.parametrize("speed", [0.25, 0.8, 1.5, 4.0])
def test_tempo_changes_duration_and_keeps_pitch(speed: float) -> None:
    from rtserver.audio.encoders import Tempo

    tempo = Tempo(RATE, speed)
    pcm = tone(2.0)
    out = np.concatenate([tempo.push(p) for p in np.array_split(pcm, 7)] + [tempo.flush()])
    assert len(out) / RATE == pytest.approx(2.0 / speed, rel=0.02)
    assert peak_hz(out, RATE) == pytest.approx(TONE_HZ, abs=3.0)
    with pytest.raises(ValueError, match="outside"):
        Tempo(RATE, 5.0)
