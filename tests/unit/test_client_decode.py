"""The client's pure parts: frame order and audio decoding (messages: test_messages_roundtrip)."""

from __future__ import annotations

import numpy as np
import opuslib
import pytest

from rtserver.client import ProtocolViolation, SeqGapError, SeqTracker, decode_frames


def test_seq_tracker_accepts_consecutive_messages_and_reports_gaps() -> None:
    t = SeqTracker("c")
    t.accept(0, 3, last=False)
    t.accept(3, 1, last=False)
    with pytest.raises(SeqGapError) as info:
        t.accept(6, 2, last=False)
    assert (info.value.expected, info.value.got) == (4, 6)
    assert "2 frames missing" in str(info.value)


def test_seq_tracker_rejects_a_repeat_and_frames_after_the_last() -> None:
    t = SeqTracker("c")
    t.accept(0, 2, last=False)
    with pytest.raises(SeqGapError):
        t.accept(1, 1, last=False)
    t2 = SeqTracker("d")
    t2.accept(0, 1, last=True)
    with pytest.raises(ProtocolViolation):
        t2.accept(1, 1, last=False)


def test_seq_tracker_must_start_at_zero() -> None:
    with pytest.raises(SeqGapError):
        SeqTracker("c").accept(1, 1, last=False)


def _tone(rate: int, seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


@pytest.mark.parametrize("rate", [48000, 16000])
def test_opus_frames_decode_to_the_encoded_audio_without_the_encoder_delay(rate: int) -> None:
    frame_ms = 20
    n = rate * frame_ms // 1000
    enc = opuslib.Encoder(rate, 1, opuslib.APPLICATION_AUDIO)
    pre_skip_48k = 312  # libopus' lookahead at 48 kHz for this application
    delay = pre_skip_48k * rate // 48000
    tone = _tone(rate, 0.5)
    padded = np.concatenate([tone, np.zeros(delay + n, dtype=np.float32)])
    padded = padded[: len(padded) // n * n]
    packets = [enc.encode_float(padded[i:i + n].tobytes(), n)
               for i in range(0, len(padded), n)]
    pcm = decode_frames(packets, format="opus", sample_rate=rate, frame_ms=frame_ms,
                        pre_skip=pre_skip_48k)
    assert pcm.dtype == np.float32
    assert len(pcm) == len(padded) - delay
    # lossy, but aligned: the decoded tone matches the input closely once aligned
    seg = slice(n, len(tone) - n)
    err = np.sqrt(np.mean((pcm[seg] - tone[seg]) ** 2))
    assert err < 0.05
    assert np.sqrt(np.mean(pcm[seg] ** 2)) > 0.3


def test_pcm_s16le_frames_decode_exactly() -> None:
    samples = np.array([0, 16384, -16384, 32767, -32768], dtype="<i2")
    frames = [samples[:2].tobytes(), samples[2:].tobytes()]
    pcm = decode_frames(frames, format="pcm_s16le", sample_rate=16000, frame_ms=20)
    assert pcm.tolist() == [0.0, 0.5, -0.5, 32767 / 32768, -1.0]


def test_unknown_audio_format_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_frames([b"x"], format="mp3", sample_rate=48000, frame_ms=20)
