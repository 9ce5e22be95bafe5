"""The binary audio message of PROTOCOL.md: golden bytes, round trip, malformed input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtserver.protocol.wire import AudioMessage, decode_audio_message, encode_audio_message


def test_golden_bytes() -> None:
    data = encode_audio_message(3, 258, [b"\x01\x02", b""], last=True, segment_start=False)
    assert data == bytes([
        0x52, 0x54,              # "RT"
        0x01,                    # version
        0x01,                    # flags: last
        0x03, 0x00,              # stream 3
        0x02, 0x00,              # 2 frames
        0x02, 0x01, 0x00, 0x00,  # seq 258
        0x02, 0x00, 0x01, 0x02,  # frame 0: 2 bytes
        0x00, 0x00,              # frame 1: empty
    ])
    assert decode_audio_message(data) == AudioMessage(
        stream=3, seq=258, frames=(b"\x01\x02", b""), last=True, segment_start=False)


def test_segment_start_is_bit1() -> None:
    data = encode_audio_message(0, 0, [b"x"], last=False, segment_start=True)
    assert data[3] == 0x02
    data = encode_audio_message(0, 0, [b"x"], last=True, segment_start=True)
    assert data[3] == 0x03


@given(stream=st.integers(0, 0xFFFF), seq=st.integers(0, 0xFFFFFFF0),
       frames=st.lists(st.binary(max_size=300), min_size=1, max_size=12),
       last=st.booleans(), segment_start=st.booleans())
def test_round_trip(stream: int, seq: int, frames: list[bytes], last: bool,
                    segment_start: bool) -> None:
    data = encode_audio_message(stream, seq, frames, last=last, segment_start=segment_start)
    assert len(data) == 12 + sum(2 + len(f) for f in frames)
    msg = decode_audio_message(data)
    assert msg == AudioMessage(stream, seq, tuple(frames), last, segment_start)
    assert decode_audio_message(bytearray(data)) == msg  # any bytes-like input


def test_largest_frame_fits_and_larger_is_refused() -> None:
    big = b"\xab" * 0xFFFF
    assert decode_audio_message(
        encode_audio_message(1, 0, [big], last=False, segment_start=False)).frames == (big,)
    with pytest.raises(ValueError, match="65535"):
        encode_audio_message(1, 0, [big + b"!"], last=False, segment_start=False)


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"stream": -1}, "stream"),
    ({"stream": 0x10000}, "stream"),
    ({"seq": -1}, "seq"),
    ({"seq": 0xFFFFFFFF, "frames": [b"a", b"b"]}, "seq"),
    ({"frames": []}, "frames"),
])
def test_encode_refuses_what_the_header_cannot_carry(kwargs: dict[str, object],
                                                      reason: str) -> None:
    args: dict[str, object] = {"stream": 0, "seq": 0, "frames": [b"a"]} | kwargs
    with pytest.raises(ValueError, match=reason):
        encode_audio_message(args["stream"], args["seq"], args["frames"],  # type: ignore[arg-type]
                             last=False, segment_start=False)


def _header(magic: bytes = b"RT", version: int = 1, flags: int = 0, stream: int = 0,
            count: int = 1, seq: int = 0) -> bytes:
    return struct.pack("<2sBBHHI", magic, version, flags, stream, count, seq)


GOOD = _header() + b"\x01\x00x"


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "shorter than the 12-byte header"),
    (GOOD[:11], "shorter than the 12-byte header"),
    (_header(magic=b"XX") + b"\x01\x00x", "magic"),
    (_header(version=2) + b"\x01\x00x", "version 2"),
    (_header(count=0), "no frames"),
    (_header(count=2) + b"\x01\x00x", "frame 1 of 2 has no length"),
    (_header() + b"\x01", "no length"),
    (_header() + b"\x05\x00abc", "needs 5 bytes, 3 left"),
    (GOOD + b"z", "1 bytes after the last"),
    (_header(count=2, seq=0xFFFFFFFF) + b"\x01\x00x\x01\x00y", "run past"),
])
def test_malformed_messages_raise_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        decode_audio_message(data)


def test_reserved_flag_bits_are_ignored() -> None:
    msg = decode_audio_message(_header(flags=0xFD) + b"\x01\x00x")
    assert msg.last and not msg.segment_start and msg.frames == (b"x",)
