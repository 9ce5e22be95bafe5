"""The client's pure parts: server-message parsing, frame order, audio decoding."""

from __future__ import annotations

import json

import numpy as np
import opuslib
import pytest

from rtserver.client import (
    ProtocolViolation,
    SeqGapError,
    SeqTracker,
    decode_frames,
    parse_server_message,
)
from rtserver.protocol.messages import (
    BufferHint,
    Cancelled,
    Done,
    ErrorMessage,
    Limits,
    Ready,
    SegmentStarted,
    Started,
    encode_server_message,
)

SERVER_MESSAGES = [
    Ready(server="rtserver/0.1.0", voices=("piper:a", "piper:b"),
          limits=Limits(max_message_bytes=65536, max_text_chars=20000, max_contexts=16),
          default_voice="piper:a"),
    Started(context="c1", stream=7, format="opus", sample_rate=48000, frame_ms=20,
            pre_skip=312, voice="piper:a"),
    SegmentStarted(context="c1", index=0, text="Hello there,", source=(0, 12), seq=0),
    BufferHint(context="c1", prebuffer_ms=120.0, rtf=0.25, ahead_ms=300.0),
    Done(context="c1", frames=50, audio_ms=1000.0, ttfa_ms=42.5, spoken_text="Hello there,"),
    Done(context="c2", frames=0, audio_ms=0.0, ttfa_ms=None),
    Cancelled(context="c1", last_seq=-1),
    ErrorMessage(code="text_too_long", message="too long", context="c1"),
    ErrorMessage(code="overloaded", message="slow down", retry_after_ms=500),
]


@pytest.mark.parametrize("message", SERVER_MESSAGES, ids=lambda m: m.type)
def test_every_server_message_round_trips_from_the_servers_encoder(message: object) -> None:
    assert parse_server_message(encode_server_message(message)) == message  # type: ignore[arg-type]


def test_unknown_fields_and_types_are_ignored() -> None:
    msg = parse_server_message(json.dumps({
        "type": "cancelled", "context": "x", "last_seq": 4, "new_field": [1, 2]}))
    assert msg == Cancelled(context="x", last_seq=4)
    assert parse_server_message('{"type": "telemetry", "x": 1}') is None


def test_ready_accepts_voice_objects_as_well_as_names() -> None:
    msg = parse_server_message(json.dumps({
        "type": "ready", "protocol": 1, "server": "s", "voices": [{"name": "v1"}, "v2"],
        "limits": {"max_message_bytes": 1, "max_text_chars": 2, "max_contexts": 3}}))
    assert isinstance(msg, Ready)
    assert msg.voices == ("v1", "v2")


@pytest.mark.parametrize("raw", [
    "not json",
    "[1, 2]",
    '{"no_type": 1}',
    '{"type": "started", "context": "c"}',
    '{"type": "cancelled", "context": "c", "last_seq": "3"}',
    '{"type": "cancelled", "context": "c", "last_seq": true}',
    '{"type": "segment", "context": "c", "index": 0, "text": "a", "source": [0], "seq": 0}',
    '{"type": "buffer", "context": "c", "prebuffer_ms": "x", "rtf": 1, "ahead_ms": 0}',
])
def test_malformed_server_messages_raise_protocol_violation(raw: str) -> None:
    with pytest.raises(ProtocolViolation):
        parse_server_message(raw)


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
